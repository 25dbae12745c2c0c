"""The "qkvsearch campaign" Grafana dashboard: the campaign metrics of `search.monitor.metrics` over time, with
Ray's node utilisation and Ray Train's controller state of the campaign's runs (named
``<campaign>-<trial name>``), for one campaign chosen in the dashboard's ``campaign`` variable.

`dashboard()` builds it; `write_dashboard(folder)` writes it for a Grafana of one's own
(`qkvsearch grafana-dashboard --out DIR`); `install_dashboard()` puts it where the Grafana that Ray's
head provisions reads dashboards from, when this process runs on the head.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from qkvsearch.search.records.layout import FINAL_STATUSES

FILE_NAME = "qkvsearch_campaign_grafana_dashboard.json"
UID = "qkvsearch-campaign"
C = 'campaign=~"$campaign"'

# (title, unit, [(PromQL, legend), ...]); every metric of search.monitor.metrics appears in some panel
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Trials by status", "short", [(f"sum by (status) (ray_qkvsearch_trials{{{C}}})", "{{status}}")]),
    ("Trials done of planned", "short", [
        (f'sum(ray_qkvsearch_trials{{{C}, status=~"{"|".join(FINAL_STATUSES)}"}})', "done"),
        (f"max(ray_qkvsearch_trials_planned{{{C}}})", "planned")]),
    ("Epochs trained of planned", "short", [
        (f"max(ray_qkvsearch_epochs_completed{{{C}}})", "trained"),
        (f"max(ray_qkvsearch_epochs_planned{{{C}}})", "planned")]),
    ("Best value of each objective", "short", [
        (f"max by (objective) (ray_qkvsearch_best{{{C}}})", "{{objective}}")]),
    ("Completed front", "short", [
        (f"max(ray_qkvsearch_front_size{{{C}}})", "trials on the front"),
        (f"max by (reference) (ray_qkvsearch_hypervolume{{{C}}})", "hypervolume (reference {{reference}})")]),
    ("Training images/s per trial", "short", [
        (f"max by (trial) (ray_qkvsearch_trial_images_per_s{{{C}}})", "{{trial}}")]),
    ("Trial start-up (start to first step)", "s", [
        (f"max by (trial) (ray_qkvsearch_trial_startup_s{{{C}}})", "{{trial}}")]),
    ("Ray Train controller state of the campaign's runs", "short", [
        ('sum by (ray_train_run_name, ray_train_controller_state) '
         '(ray_train_controller_state{ray_train_run_name=~"$campaign-.*"})',
         "{{ray_train_run_name}}: {{ray_train_controller_state}}")]),
    ("Node utilisation", "percent", [
        ("avg(ray_node_cpu_utilization)", "CPU"),
        ("sum(ray_node_mem_used_host) / sum(ray_node_mem_total_host) * 100", "memory"),
        ("avg(ray_node_gpus_utilization) or on() vector(0)", "GPU (0 without GPUs)")]),
]


def dashboard(datasource: str = "${datasource}") -> dict:
    """The dashboard as Grafana's JSON model (schemaVersion 27, time series panels, 2 per row)."""
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title, "datasource": datasource,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"expr": expr, "legendFormat": legend, "refId": chr(ord("A") + j)}
                        for j, (expr, legend) in enumerate(targets)],
        })
    return {
        "uid": UID, "title": "qkvsearch campaign", "tags": ["qkvsearch", "ray"], "schemaVersion": 27,
        "version": 1, "editable": True, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "hide": 0},
            {"name": "campaign", "type": "query", "datasource": datasource, "refresh": 2,
             "query": "label_values(ray_qkvsearch_trials_planned, campaign)",
             "definition": "label_values(ray_qkvsearch_trials_planned, campaign)", "includeAll": False},
        ]},
        "panels": panels, "annotations": {"list": []},
    }


def queries() -> list[str]:
    """Every panel's PromQL, in panel order."""
    return [expr for _, _, targets in PANELS for expr, _ in targets]


def write_dashboard(folder) -> Path:
    """Write the dashboard JSON into ``folder`` (created if missing); -> the file's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_text(json.dumps(dashboard(), indent=2) + "\n")
    return path


def install_dashboard() -> Path | None:
    """Write the dashboard where this Ray head's Grafana provisioning reads dashboards
    (RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR, else <session>/metrics/grafana/dashboards); None when
    this process is not on the head (a cluster's driver elsewhere: use `qkvsearch grafana-dashboard`)."""
    folder = os.environ.get("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR")
    if not folder:
        session = _local_session_dir()
        if session is None:
            return None
        folder = os.path.join(session, "metrics", "grafana", "dashboards")
    return write_dashboard(folder)


def _local_session_dir() -> str | None:
    """The Ray session folder when this process's node is the head and the folder is on this disk."""
    from qkvsearch import ray_private

    session = ray_private.head_session_dir()
    return session if session and os.path.isdir(session) else None
