"""A real staged campaign on local Ray: two configurations pretrained, both fine-tuned from their final
checkpoints and scored for OOD detection; its driver stopped (SIGTERM) once a stage has completed, then
resumed: no completed stage runs again, every stage completes, and the report ranks the configurations by
the OOD objective."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.live_campaign import LiveCampaign, tiny_spec, wait_for, write_spec

from qkvsearch.search.records.layout import STAGES_DIR
from qkvsearch.search.records.stages import SELECTION_FILE

pytestmark = pytest.mark.slow

STAGES = {
    "finetune": [{"dataset": "digits_0to8", "epochs": 1, "lr": 1e-3, "max_steps_per_epoch": 2, "batch_size": 32}],
    "ood": {"in_distribution": "digits_0to8", "score": "msp",
            "datasets": [{"name": "nine", "format": "digits_heldout"}, {"format": "noise"}]},
    "select": "top_k", "top_k": 2,
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


def test_a_staged_campaign_stopped_between_stages_resumes_and_ranks_by_an_ood_objective(tmp_path, capsys):
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import resume
    from qkvsearch.search.cli import main

    raw = tiny_spec(tmp_path, "staged", workers=1, epochs=1, steps=2, keep="front",
                    variants=[{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.25}])
    raw["stages"] = STAGES
    exp = tmp_path / "staged"
    t0 = time.monotonic()
    with LiveCampaign(["launch", str(write_spec(tmp_path / "staged.yaml", raw))], tmp_path) as run:
        wait_for(lambda: run._check_alive() or _stage_files(exp), 150, "a first completed stage")
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(60) == 130 or "resume" in run.stderr()
    before = _stage_files(exp)
    assert 1 <= len(before) < 4, run.stdout()
    # keep: front, yet both chosen trials still hold their checkpoints: their stages have not all run
    assert len(list((exp / "train_runs").iterdir())) == 2
    launched_s = time.monotonic() - t0

    resume(str(exp))
    after = _stage_files(exp)
    assert len(after) == 4  # 2 configurations x (fine-tuning, OOD detection)
    assert all(after[k] == v for k, v in before.items())  # a completed stage never ran again
    records = [json.loads(v) for v in after.values()]
    ood = [r for r in records if r["stage"] == "ood"]
    assert {r["trial_id"] for r in ood} == {r["trial_id"] for r in records}
    assert all(0 <= r["metrics"]["det_err"] <= 2.5 + r["metrics"]["fpr95"] / 2 for r in ood)
    # once every stage has run, checkpoints go as keep: front says (the front's weights, nothing else)
    kept = [json.loads(f.read_bytes())["checkpoint_kept"] for f in (exp / "qs_trials").glob("*.json")]
    assert sorted(kept) in (["none", "weights"], ["weights", "weights"]) and not list((exp / "train_runs").iterdir())

    paths = build_report(str(exp), static=False)
    table = pd.read_csv(paths["stages_csv"])
    assert len(table) == 2 and table["stage_rank"].min() == 0
    ranked = table.sort_values(["stage_rank", "fpr95"])
    assert list(table["trial_id"]) == list(ranked["trial_id"])  # ranked on the stage objectives
    assert "## Stages" in Path(paths["md"]).read_text()
    capsys.readouterr()
    assert main(["status", str(exp)]) == 0
    status = capsys.readouterr().out
    assert "finetune@digits_0to8         2/2 done" in status and "ood                          2/2 done" in status
    print(f"launch until stopped: {launched_s:.1f} s; stage times: "
          + ", ".join(f"{r['stage']} {r['duration_s']:.1f} s" for r in records))
