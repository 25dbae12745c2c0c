"""Watching a real campaign from outside: `qkvsearch launch` in its own process with its own local Ray;
the dashboard's Jobs REST API (with the token) lists it with its metadata; a real Prometheus server
scrapes the nodes that the dashboard's service discovery names, and every query of every panel of the
shipped Grafana dashboard returns data for the campaign; the terminal output is plain lines, the
token appears nowhere. The watched campaign is also the suite's 2-worker campaign under MO-ASHA: a trial it
stops early must give its Train worker group back and leave its process to the next trial."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.live_campaign import (
    LiveCampaign,
    auth_token,
    free_port,
    get_json,
    own_token,
    run_to_end,
    tiny_spec,
    token_file,
    wait_for,
    write_spec,
)

from qkvsearch.search.cluster.jobs import METADATA_PREFIX
from qkvsearch.search.monitor import grafana
from qkvsearch.search.monitor.metrics import METRICS
from qkvsearch.search.monitor.status import load_records
from qkvsearch.search.records.layout import ENDED_KEY

pytestmark = pytest.mark.slow

NAME = "watched"
PROMETHEUS = shutil.which("prometheus")


class Prometheus:
    """Debian's prometheus on 127.0.0.1, scraping `targets` every second, its data in `folder`."""

    def __init__(self, folder: Path, dashboard: str, token_file: str):
        self.port = free_port()
        # Targets as a Prometheus server finds them on a Ray cluster: the dashboard's HTTP service
        # discovery, signed in with the token file (never a copy of the token).
        sd = {"url": f"{dashboard}/api/prometheus/sd", "refresh_interval": "1s",
              "authorization": {"type": "Bearer", "credentials_file": token_file}}
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "ray", "http_sd_configs": [sd]}]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(folder / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, "prometheus to answer")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query_range(self, expr: str, start: float, end: float) -> list:
        q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
        return get_json(f"http://127.0.0.1:{self.port}/api/v1/query_range?{q}")["data"]["result"]

    def scraped_targets(self) -> list[str]:
        active = get_json(f"http://127.0.0.1:{self.port}/api/v1/targets")["data"]["activeTargets"]
        return [t["scrapeUrl"] for t in active]

    def metric_names(self) -> list[str]:
        return get_json(f"http://127.0.0.1:{self.port}/api/v1/label/__name__/values")["data"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _spec(tmp: Path) -> dict:
    """Three 2-worker trials under MO-ASHA: the baseline goes on (first at the rung); the lowest learning
    rate, dominated by it, is stopped; the fewest MACs are on the rung's front whatever their accuracy, so
    the last trial completes."""
    variants = [{"embedding": "linear", "lr": 3e-3}, {"embedding": "linear", "lr": 1e-7},
                {"embedding": "fsne", "hidden_width": 0.25, "code_size": 4}]
    spec = tiny_spec(tmp / "results", NAME, workers=2, epochs=2, variants=variants)
    spec["scheduler"] = {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2, "brackets": 1}
    return spec


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Run the campaign to its end while the dashboard is asked about it and Prometheus scrapes it."""
    tmp = tmp_path_factory.mktemp("watched")
    spec = write_spec(tmp / "spec.yaml", _spec(tmp))
    seen: dict = {"prometheus": None}
    start = time.time()
    # Ray's agents push metrics every second (default 10 s), so a short campaign is seen in full; Tune's
    # result.json files give the process each trial ran in (search.campaign.tune_settings turns them off).
    env = {"RAY_metrics_report_interval_ms": "1000", "QKVSEARCH_TUNE_DEFAULTS": "1"}
    with LiveCampaign(["launch", str(spec)], tmp, env=env) as run:
        url = run.line_starting("Ray dashboard: ", 180).split()[2]
        token = auth_token()
        seen["token"], seen["header"] = token, run.stdout()
        seen["jobs_without_token"] = _status_without_token(f"{url}/api/jobs/")
        seen["jobs"] = wait_for(lambda: _campaign_jobs(url, token), 60, "the campaign on the Jobs page")
        seen["targets"] = get_json(f"{url}/api/prometheus/sd", token)
        prom = Prometheus(tmp, url, token_file()) if PROMETHEUS else None
        try:
            seen["rc"] = run.finish(tmp / "results" / NAME)
            end = time.time()
            if prom is not None:
                time.sleep(2)
                seen["prometheus"] = {expr: prom.query_range(expr.replace("$campaign", NAME), start, end)
                                      for expr in grafana.queries()}
                seen["names"] = prom.metric_names()
                (tmp / "metric_names.txt").write_text("\n".join(seen["names"]) + "\n")  # for a person to read
                seen["scraped"] = prom.scraped_targets()
        finally:
            if prom is not None:
                prom.stop()
        seen["stdout"], seen["stderr"] = run.stdout(), run.stderr()
    seen["exp"] = tmp / "results" / NAME
    return seen


def _status_without_token(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _answers(url: str) -> bool:
    try:
        return _status_without_token(url) == 401
    except OSError:  # not listening yet
        return False


def _campaign_jobs(url: str, token: str) -> list[dict]:
    jobs = get_json(f"{url}/api/jobs/", token)
    return [j for j in jobs if (j.get("metadata") or {}).get(f"{METADATA_PREFIX}campaign") == NAME]


def test_the_campaign_is_a_job_with_its_metadata_behind_the_token(watched):
    assert watched["rc"] == 0, watched["stderr"][-3000:]
    assert watched["jobs_without_token"] == 401
    (job,) = watched["jobs"]
    meta = job["metadata"]
    assert meta[f"{METADATA_PREFIX}results"] == str(watched["exp"])
    assert meta[f"{METADATA_PREFIX}trials"] == "3"
    assert json.loads(meta[f"{METADATA_PREFIX}spec"])["name"] == NAME
    assert meta[f"{METADATA_PREFIX}code_version"]
    assert job["type"] == "DRIVER" and job["status"] == "RUNNING" and meta["job_name"] == NAME


def test_the_terminal_shows_header_progress_finished_trials_and_summary_never_the_token(watched):
    out = watched["stdout"]
    assert f"campaign {NAME}: 3 trial(s), up to 1 at a time, 2 DDP worker(s) each" in out
    assert "Ray dashboard: http://127.0.0.1:" in out and "ray get-auth-token" in out
    finished = [line for line in out.splitlines() if line.startswith("trial ")]
    assert len(finished) == 3 and [" completed: 2/2 epochs, top-1 " in line for line in finished] == [True, False, True]
    assert " stopped_early: 1/2 epochs, top-1 " in finished[1], finished
    assert f"{NAME}: 3/3 trials done (2 completed, 1 stopped_early)" in out
    assert f"next: qkvsearch report {watched['exp']}" in out
    assert "Trial status" not in out and "qs_" not in out  # Tune's tables stay off without --verbose
    assert "\x1b[" not in out  # not a terminal: plain lines
    for text in (out, watched["stderr"], *(p.read_text(errors="replace") for p in watched["exp"].rglob("*")
                                           if p.is_file() and p.suffix in (".json", ".csv", ".log", ".txt"))):
        assert watched["token"] not in text
    assert json.loads((watched["exp"] / "qs_campaign.json").read_text())[ENDED_KEY] > 0


def test_a_trial_stopped_early_gives_back_its_worker_group_and_its_process(watched):
    """2-worker trials drive a TorchTrainer; Tune reuses a trial's process for the next trial. A trial that
    MO-ASHA stopped must have stopped its Train run (else the next trial could not get the 2 CPUs) and left
    its process to the next trial, which completes."""
    records = load_records(watched["exp"])
    assert [r["status"] for r in records] == ["completed", "stopped_early", "completed"], records
    pids = {}  # the process each trial ran in, from Tune's result.json files (the records leave Tune's keys out)
    for path in watched["exp"].glob("*/result.json"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            pids[row["trial_id"]] = row["pid"]
    stopped, last = records[1], records[2]
    assert last["started_at"] >= stopped["ended_at"] and pids[last["trial_id"]] == pids[stopped["trial_id"]]


def test_every_panel_query_of_the_shipped_dashboard_returns_data_for_the_campaign(watched):
    if not PROMETHEUS:
        pytest.skip("needs Debian's prometheus package (apt-get install prometheus; .ci/run installs it)")
    assert watched["targets"] and all(t["targets"] for t in watched["targets"])
    assert watched["scraped"] and all(u.startswith("http://127.0.0.1:") for u in watched["scraped"])  # loopback only
    empty = [expr for expr, series in watched["prometheus"].items() if not series]
    assert not empty, f"no data for: {empty}"
    names = set(watched["names"])
    assert {f"ray_{m}" for m in METRICS} <= names
    runs = watched["prometheus"][next(q for q in grafana.queries() if "ray_train_controller_state" in q)]
    trials = load_records(watched["exp"])
    assert {s["metric"]["ray_train_run_name"] for s in runs} == {f"{NAME}-{r['trial_name']}" for r in trials}


def test_a_submitted_campaign_shows_its_metadata_on_the_submission(tmp_path):
    """`ray job submit -- qkvsearch launch ...` on a cluster started with `ray start --head`: the Jobs page
    lists the submission, and the driver adds the campaign's metadata to it."""
    import os
    import sys

    from helpers.live_campaign import ray_temp_folder, stop_head

    spec = write_spec(tmp_path / "spec.yaml", tiny_spec(tmp_path / "results", "submitted", workers=1, epochs=1,
                                                      variants=[{"embedding": "linear"}], steps=2))
    ray_tmp = ray_temp_folder()
    dash = free_port()
    env = own_token({**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, tmp_path)  # `ray start` makes none
    env.pop("RAY_ADDRESS", None)
    ray_bin = str(Path(sys.executable).parent / "ray")
    # --block: the head's processes stop with this one (no `ray stop`, which stops every Ray on the machine)
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--num-cpus=2", f"--port={free_port()}",
                             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={ray_tmp}",
                             # ports of its own: the test session's Ray may hold the default ones
                             f"--dashboard-agent-listen-port={free_port()}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{dash}"
        wait_for(lambda: _answers(f"{url}/api/jobs/"), 120, "the head's dashboard")

        def submitted():  # the head's job agent may start after its dashboard answers
            run = run_to_end(
                [ray_bin, "job", "submit", "--address", url, "--submission-id", "qs-submitted", "--",
                 sys.executable, "-m", "qkvsearch.search.cli", "launch", str(spec)],
                env=env, folders=[tmp_path / "results"])
            return None if "No available agent" in run.stderr + run.stdout else run

        submit = wait_for(submitted, 120, "the head's job agent", every=2)
        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        assert "next: qkvsearch report" in submit.stdout  # the campaign's own lines reach the job's log
        (job,) = [j for j in get_json(f"{url}/api/jobs/", auth_token(env)) if j.get("submission_id") == "qs-submitted"]
        assert job["type"] == "SUBMISSION" and job["status"] == "SUCCEEDED"
        assert job["metadata"][f"{METADATA_PREFIX}campaign"] == "submitted"
        assert job["metadata"][f"{METADATA_PREFIX}results"] == str(tmp_path / "results" / "submitted")
    finally:
        stop_head(head, ray_tmp)
