"""Watching a campaign without Ray: progress read from records, the terminal block and lines, `watch`,
and the shipped Grafana dashboard's queries."""
import io
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import PRESETS
from helpers.campaign_files import write_campaign
from helpers.views import Recorder

from qkvsearch.search.analysis.pareto import hypervolume, nondominated_mask
from qkvsearch.search.analysis.report import build_report
from qkvsearch.search.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, main
from qkvsearch.search.cluster import jobs
from qkvsearch.search.monitor import grafana, metrics
from qkvsearch.search.monitor.progress import read_progress
from qkvsearch.search.monitor.terminal import TerminalView, closing_summary
from qkvsearch.search.monitor.watch import CampaignMonitor, watch
from qkvsearch.search.records.layout import ENDED_KEY

STATUSES = ["completed", "completed", "running", "stopped_early", "failed", "completed", "pending"]


def _end(exp):
    path = os.path.join(exp, "qs_campaign.json")
    campaign = json.loads(open(path).read())
    campaign[ENDED_KEY] = time.time()
    open(path, "w").write(json.dumps(campaign))


def test_progress_counts_epochs_and_the_completed_front(tmp_path):
    records = write_campaign(tmp_path, STATUSES)
    p = read_progress(tmp_path)
    assert p.trials_planned == 7  # the spec names no num_trials: the records' count
    assert p.counts["completed"] == 3 and p.counts["running"] == 1 and p.trials_done == 5
    assert p.epochs_done == sum(len(r["epochs"]) for r in records)
    assert [t.name for t in p.running] == [records[2]["trial_name"]] and p.running[0].epochs == 3
    done = [r for r in records if r["status"] == "completed"]
    values = np.array([[r["epochs"][-1]["top1"], r["cost"]["gmacs"], r["cost"]["params_m"]] for r in done])
    dirs = ["max", "min", "min"]
    front = {r["trial_name"] for r, on in zip(done, nondominated_mask(values, dirs)) if on}
    assert {f["trial"] for f in p.front} == front
    mask = nondominated_mask(values, dirs)
    # launched before references were recorded: fixed at this first read by the rule, then kept
    ref = [0.0, 1.1 * max(r["cost"]["gmacs"] for r in records), 1.1 * max(r["cost"]["params_m"] for r in records)]
    assert math.isclose(p.hypervolume, hypervolume(values[mask], dirs, ref))
    assert json.loads((tmp_path / "qs_hv_reference.json").read_text())["reference"] == pytest.approx(ref)
    assert p.best["top1"] == max(values[:, 0]) and p.best["gmacs"] == min(values[:, 1])
    assert not p.ended
    _end(tmp_path)
    assert read_progress(tmp_path).ended


def test_plain_terminal_prints_each_finished_trial_once_and_changes_only(tmp_path):
    write_campaign(tmp_path, STATUSES)
    out = io.StringIO()
    view = TerminalView(out, live=False)
    view.show(read_progress(tmp_path))
    view.show(read_progress(tmp_path))
    view.close()
    lines = out.getvalue().splitlines()
    finished = [line for line in lines if line.startswith("trial ")]
    assert len(finished) == 5
    assert any(" failed: 1/6 epochs" in line and line.endswith("CUDA out of memory") for line in finished)
    assert sum(line.startswith("synth: 5/7 trials done") for line in lines) == 1  # nothing new: no line
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in a log


def test_live_block_redraws_in_place(tmp_path):
    write_campaign(tmp_path, STATUSES)
    out = io.StringIO()
    view = TerminalView(out, live=True)
    view.show(read_progress(tmp_path))
    view.close()
    text = out.getvalue()
    assert "trials" in text and "5/7" in text and "running trial" in text and "hypervolume" in text


def test_watch_follows_a_campaign_until_its_driver_ends(tmp_path):
    write_campaign(tmp_path, STATUSES)

    class EndsAfterFirst(Recorder):  # the driver ends once the view has shown the running campaign
        def show(self, progress):
            super().show(progress)
            if len(self.seen) == 1:
                _end(str(tmp_path))

    view = EndsAfterFirst()
    last = watch(str(tmp_path), view, interval=0.1)
    assert not view.seen[0].ended and last.ended and len(view.seen) >= 2 and view.closed


def test_watch_cli_once_and_bad_input(tmp_path, capsys):
    write_campaign(tmp_path, STATUSES)
    assert main(["watch", str(tmp_path), "--once"]) == EXIT_OK
    assert "synth: 5/7 trials done" in capsys.readouterr().out
    assert main(["watch", str(tmp_path / "nothing")]) == EXIT_BAD_INPUT
    assert "qs_campaign.json" in capsys.readouterr().err
    assert main(["watch", str(tmp_path), "--interval", "0"]) == EXIT_BAD_INPUT
    assert "--interval: expected" in capsys.readouterr().err


def test_monitor_polls_and_survives_a_failing_view(tmp_path):
    write_campaign(tmp_path, STATUSES)

    class Broken(Recorder):
        def show(self, progress):
            raise RuntimeError("boom")

    good, bad = Recorder(), Broken()
    with CampaignMonitor(str(tmp_path), [bad, good], interval=0.05):
        deadline = time.monotonic() + 60  # a bound only a stopped monitor reaches
        while len(good.seen) < 3:  # three polls, the failing view failing at each
            assert time.monotonic() < deadline, f"the monitor stopped polling after {len(good.seen)} poll(s)"
            time.sleep(0.02)
    assert good.closed and bad.closed


def test_grafana_dashboard_queries_every_campaign_metric(tmp_path, capsys):
    text = "\n".join(grafana.queries())
    assert all(f"ray_{name}" in text for name in metrics.METRICS)
    assert main(["grafana-dashboard", "--out", str(tmp_path)]) == EXIT_OK
    board = json.loads((tmp_path / grafana.FILE_NAME).read_text())
    assert board["uid"] == grafana.UID and len(board["panels"]) == len(grafana.PANELS)
    assert [t["expr"] for p in board["panels"] for t in p["targets"]] == grafana.queries()
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "campaign"}


def test_progress_reads_a_uri(tmp_path):
    write_campaign(tmp_path, STATUSES)
    p = read_progress(f"file://{tmp_path}")
    assert p.counts["completed"] == 3


def test_closing_summary_lists_the_front_and_the_next_command(tmp_path):
    write_campaign(tmp_path, STATUSES)
    p = read_progress(tmp_path)
    text = closing_summary(p, str(tmp_path))
    assert text.startswith("synth: 5/7 trials done")
    assert all(f["trial"] in text for f in p.front) and "front of the completed trials" in text
    assert "1 trial(s) failed" in text and text.endswith(f"next: qkvsearch report {tmp_path}")
    out = io.StringIO()
    view = TerminalView(out, live=False)
    view.show(p)  # plain output printed the summary line last: the closing summary does not repeat it
    again = closing_summary(p, str(tmp_path), shown=view.last_line)
    assert out.getvalue().splitlines()[-1] == p.summary() and again == text.split("\n", 1)[1]


def test_a_resumed_view_does_not_announce_trials_that_ended_before(tmp_path):
    write_campaign(tmp_path, STATUSES)
    out = io.StringIO()
    view = TerminalView(out, live=False)
    view.skip_finished(str(tmp_path))
    view.show(read_progress(tmp_path))
    assert not [line for line in out.getvalue().splitlines() if line.startswith("trial ")]


def test_a_report_written_before_the_end_is_marked_partial(tmp_path):
    write_campaign(tmp_path, STATUSES)
    paths = build_report(str(tmp_path), static=False)
    md, page = Path(paths["md"]).read_text(), Path(paths["html"]).read_text()
    assert md.startswith("# Pareto report: synth (partial)") and "5 trial(s) had finished" in md
    assert "<title>Pareto report: synth (partial)</title>" in page
    _end(tmp_path)
    md = Path(build_report(str(tmp_path), static=False)["md"]).read_text()
    assert "partial" not in md


def test_an_older_campaign_whose_trials_all_ended_is_not_partial(tmp_path):
    write_campaign(tmp_path, ["completed", "failed", "completed"])  # no end time: written before drivers did
    assert "partial" not in Path(build_report(str(tmp_path), static=False)["md"]).read_text()


def test_job_metadata_and_the_dashboard_line_never_hold_the_token(monkeypatch):
    from types import SimpleNamespace

    spec = SimpleNamespace(name="c1", to_dict=lambda: {"name": "c1", "train": {"epochs": 3}})
    meta = jobs.job_metadata(SimpleNamespace(spec=spec, exp="s3://bucket/c1"), 12, "0.1.0+abc")
    assert meta == {"qkvsearch_campaign": "c1", "qkvsearch_spec": '{"name":"c1","train":{"epochs":3}}',
                    "qkvsearch_results": "s3://bucket/c1", "qkvsearch_code_version": "0.1.0+abc",
                    "qkvsearch_trials": "12"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret-token-value")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    (line,) = jobs.dashboard_lines("127.0.0.1:8265")
    assert line.startswith("Ray dashboard: http://127.0.0.1:8265") and "ray get-auth-token" in line
    assert "secret-token-value" not in line
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"metadata": {"job_submission_id": "raysubmit_1"}}))
    assert jobs.submission_id() == "raysubmit_1"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert jobs.submission_id() is None and jobs.tag_submission(meta) is False


def test_stop_signals_hand_sigterm_and_sigint_to_tune_once_then_stop_at_once():
    import signal

    from qkvsearch.search.campaign.interrupts import StopSignals

    handed = []
    term_before = signal.getsignal(signal.SIGTERM)  # Ray's own, when the suite's Ray runs in this process
    before = signal.signal(signal.SIGINT, lambda sig, frame: handed.append(sig))  # stands for Tune's handler
    try:
        with StopSignals() as stop:
            stop.setup()
            signal.raise_signal(signal.SIGTERM)
            assert stop.received == "SIGTERM" and handed == [signal.SIGINT]
            try:
                signal.raise_signal(signal.SIGINT)
                raise AssertionError("a second signal must stop at once")
            except KeyboardInterrupt:
                pass
        assert signal.getsignal(signal.SIGTERM) == term_before
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupted_campaign_exits_130_saying_how_to_resume(monkeypatch, tmp_path, capsys):
    from qkvsearch.search.campaign import launch as campaign
    from qkvsearch.search.campaign.interrupts import CampaignInterrupted

    def stopped(spec, **kw):
        raise CampaignInterrupted("/r/c1", "SIGTERM", ["linear-00000"])

    monkeypatch.setattr(campaign, "launch", stopped)
    spec = PRESETS / "quickstart.yaml"
    assert main(["launch", str(spec)]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "stopped by SIGTERM; 1 running trial(s) marked interrupted; `qkvsearch resume /r/c1`" in err


def test_a_grid_with_repeats_plans_points_times_repeats_trials(tmp_path, monkeypatch):
    from qkvsearch.spaces import load_campaign

    raw = {"name": "grid3", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "synthetic"},
           "train": {"epochs": 6}, "space": {"embedding": {"grid": ["linear", "sne"]}},
           "search": {"algorithm": "grid", "repeats": 3}}
    spec = load_campaign(raw, check_names=False).to_dict()  # what launch stores
    assert spec["search"]["num_trials"] == 6 and spec["search"]["repeats"] == 3
    write_campaign(tmp_path, ["completed", "running"], spec=spec, name="grid3")
    p = read_progress(tmp_path)
    assert p.trials_planned == 6
    assert p.epochs_planned == 6 + 6 + 4 * 6  # two recorded trials, four still to start
    out = io.StringIO()
    view = TerminalView(out, live=False)
    view.show(p)
    view.close()
    assert "grid3: 1/6 trials done" in out.getvalue()
    live = io.StringIO()
    view = TerminalView(live, live=True)
    view.show(p)
    view.close()
    assert "1/6" in live.getvalue() and "1/18" not in live.getvalue()
    gauges = metrics.CampaignMetrics("grid3")
    planned = gauges.gauges["qkvsearch_trials_planned"]
    seen = []
    set_value = planned.set
    monkeypatch.setattr(planned, "set", lambda value, tags=None: (seen.append(value), set_value(value, tags)))
    gauges.show(p)
    assert seen == [6.0]


def test_a_spec_without_objectives_shows_the_default_objective_front(tmp_path):
    from helpers.campaign_files import SPEC

    write_campaign(tmp_path, STATUSES, spec={k: v for k, v in SPEC.items() if k != "objectives"})
    p = read_progress(tmp_path)
    assert p.objectives == [("top1", "max")] and p.front and "top1" in p.best


@pytest.mark.parametrize("seed", range(6))
def test_the_hypervolume_never_falls_while_trials_complete_in_any_order(tmp_path, seed):
    """A property over random completion orders: with the campaign's fixed reference the hypervolume each
    snapshot shows never falls (the reference of the points seen so far made it fall as the front grew)."""
    from helpers.campaign_files import SPEC, synthetic_record, write_record

    from qkvsearch.search.analysis import hv_reference

    rng = np.random.default_rng(seed)
    objectives = [("top1", "max"), ("gmacs", "min"), ("val_loss", "min")]
    spec = {**SPEC, "objectives": [{"metric": m, "mode": d} for m, d in objectives]}
    write_campaign(tmp_path, [], spec=spec)
    records = [synthetic_record(i, "completed", rng=rng) for i in range(12)]
    hv_reference.write(tmp_path, hv_reference.at_launch(objectives, [r["cost"] for r in records]))
    seen, refs = [], []
    for k, i in enumerate(rng.permutation(len(records))):
        write_record(tmp_path, {**records[i], "ended_at": 1_800_000_000.0 + k})
        p = read_progress(tmp_path)
        seen.append(p.hypervolume)
        refs.append(p.reference)
    assert all(b >= a for a, b in zip(seen, seen[1:])) and seen[-1] > seen[0] > 0
    assert len(set(refs)) == 1 and refs[0].startswith("top1 0, gmacs ")  # fixed at the first completion
