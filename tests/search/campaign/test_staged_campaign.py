"""A real staged campaign on local Ray, stages selected as each trial completes: the first configuration to
complete is fine-tuned from its final checkpoint and scored for OOD detection while the second trains;
the driver is killed (SIGKILL) once a stage has completed, then resumed: no completed stage runs again,
every chosen configuration's stages complete, and the report ranks the configurations by the OOD
objective."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.live_campaign import LiveCampaign, tiny_spec, wait_for, wait_while_advancing, write_spec

from qkvsearch.search.records.layout import STAGES_DIR
from qkvsearch.search.records.lease import STALE_ENV, read_lease
from qkvsearch.search.records.stages import SELECTION_FILE, read_selection

pytestmark = pytest.mark.slow
STALE_S = 10  # the killed driver's hold goes stale this soon, so that the test can resume

STAGES = {
    "finetune": [{"dataset": "digits_0to8", "epochs": 1, "lr": 1e-3, "max_steps_per_epoch": 2, "batch_size": 32}],
    "ood": {"in_distribution": "digits_0to8", "score": "msp",
            "datasets": [{"name": "nine", "format": "digits_heldout"}, {"format": "noise"}]},
    "select": "as_completed",
    "objectives": [{"metric": "fpr95", "mode": "min"}, {"metric": "auroc", "mode": "max"}],
}


def _stage_files(exp: Path) -> dict[str, bytes]:
    """key -> bytes of every completed stage record."""
    folder = exp / STAGES_DIR
    out = {}
    for f in folder.glob("*.json") if folder.is_dir() else []:
        if f.name != SELECTION_FILE and json.loads(f.read_bytes()).get("status") == "completed":
            out[f.stem] = f.read_bytes()
    return out


def test_a_staged_campaign_killed_between_stages_resumes_and_ranks_by_an_ood_objective(tmp_path, capsys):
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import resume
    from qkvsearch.search.cli import main

    raw = tiny_spec(tmp_path, "staged", workers=1, epochs=1, steps=2, keep="front",
                    variants=[{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.25}])
    # XCiT-nano's 12 blocks (not tiny_space's 2): the second trial trains while the first one's stage starts
    raw["space"] = {"variants": raw["space"]["variants"]}
    raw["stages"] = STAGES
    exp = tmp_path / "staged"
    t0 = time.monotonic()
    with LiveCampaign(["launch", str(write_spec(tmp_path / "staged.yaml", raw))], tmp_path,
                      env={STALE_ENV: str(STALE_S)}) as run:
        wait_while_advancing(lambda: run._check_alive() or _stage_files(exp), lambda: run.advancing(exp),
                             "a first completed stage")
        run.kill()
    before = _stage_files(exp)
    assert 1 <= len(before) < 4, run.stdout()
    first = json.loads(next(iter(before.values())))
    records = {json.loads(f.read_bytes())["trial_id"]: json.loads(f.read_bytes())
               for f in (exp / "qs_trials").glob("*.json")}
    # it went on as it completed: its stage began before the other trial had ended (or while it trained)
    other = next(r for t, r in records.items() if t != first["trial_id"])
    assert other.get("ended_at") is None or first["started_at"] < other["ended_at"]
    # keep: front, yet the chosen trial still holds its checkpoint: its stages have not all run
    assert (exp / "train_runs").is_dir() and any((exp / "train_runs").iterdir())
    launched_s = time.monotonic() - t0

    wait_for(lambda: read_lease(exp).stale, 3 * STALE_S, "the killed driver's hold to go stale")
    resume(str(exp))
    selection = read_selection(str(exp))
    chosen = selection["trial_ids"]
    assert first["trial_id"] in chosen and selection["select"] == "as_completed"
    after = _stage_files(exp)
    assert len(after) == 2 * len(chosen)  # each chosen configuration: fine-tuning, OOD detection
    assert all(after[k] == v for k, v in before.items())  # a completed stage never ran again
    stages = [json.loads(v) for v in after.values()]
    ood = [r for r in stages if r["stage"] == "ood"]
    assert {r["trial_id"] for r in ood} == set(chosen)
    assert all(0 <= r["metrics"]["det_err"] <= 2.5 + r["metrics"]["fpr95"] / 2 for r in ood)
    # once every stage has run, checkpoints go as keep: front says (the front's weights, nothing else)
    kept = [json.loads(f.read_bytes())["checkpoint_kept"] for f in (exp / "qs_trials").glob("*.json")]
    assert sorted(kept) in (["none", "weights"], ["weights", "weights"]) and not list((exp / "train_runs").iterdir())

    paths = build_report(str(exp), static=False)
    table = pd.read_csv(paths["stages_csv"])
    assert len(table) == len(chosen) and table["stage_rank"].min() == 0
    ranked = table.sort_values(["stage_rank", "fpr95"])
    assert list(table["trial_id"]) == list(ranked["trial_id"])  # ranked on the stage objectives
    assert "## Stages" in Path(paths["md"]).read_text()
    capsys.readouterr()
    assert main(["status", str(exp)]) == 0
    status = capsys.readouterr().out
    n = len(chosen)
    assert f"finetune@digits_0to8         {n}/{n} done" in status
    assert f"ood                          {n}/{n} done" in status
    print(f"launch until killed: {launched_s:.1f} s; chosen {n}; stage times: "
          + ", ".join(f"{r['stage']} {r['duration_s']:.1f} s" for r in stages))
