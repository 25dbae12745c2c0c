"""A real campaign on local Ray whose space spans the attention design (attention, positions, stem, key):
every trial trains, its record and the report carry the architecture columns."""
from __future__ import annotations

from pathlib import Path

import pytest

from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow

VARIANTS = [
    {"attention": "softmax"},
    {"attention": "performer", "attn_features": 8, "pos_embed": "rope", "patch_embed": "conv"},
    {"attention": "nystrom", "attn_landmarks": 4, "pos_embed": "none", "key": "manifold", "key_charts": 2,
     "key_aggregation": "kua", "embedding": "psne"},
    {"attention": "linformer", "attn_proj_len": 8, "patch_embed": "conv", "key": "manifold", "key_context": True},
    {"attention": "fnet"},
]


def _spec(tmp: Path) -> dict:
    return {
        "name": "architecture",
        "model": {"name": "vit_tiny_patch16_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 8, "lr": 2e-3, "warmup_epochs": 0, "max_steps_per_epoch": 2, "seed": 0},
        "space": {"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4, "variants": VARIANTS},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "grid"},
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


def test_a_campaign_over_the_attention_design_trains_and_reports_it(ray_local, tmp_path):
    import pyarrow.parquet as pq

    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import launch

    exp = Path(launch(load_campaign(_spec(tmp_path))))
    records = load_records(str(exp))
    assert sorted(r["status"] for r in records) == ["completed"] * len(VARIANTS)
    by_attention = {r["config"]["attention"]: r for r in records}
    assert by_attention["fnet"]["cost"]["embed_params"] == 0
    assert by_attention["nystrom"]["config"]["key_aggregation"] == "kua"
    assert by_attention["softmax"]["config"]["key_charts"] is None      # null where it does not apply
    assert len({r["cost"]["params"] for r in records}) == len(VARIANTS)
    written = build_report(str(exp), out_dir=str(tmp_path / "report"), static=False)
    trials = pq.read_table(written["trials"]).to_pandas()
    assert set(trials["config_attention"]) == {v["attention"] for v in VARIANTS}
    assert set(trials["config_pos_embed"]) == {"learned", "rope", "none"}
    assert set(trials["config_patch_embed"]) == {"linear", "conv"} and set(trials["config_key"]) == {"shared",
                                                                                                       "manifold"}
    md = Path(written["md"]).read_text()
    for column in ("attention", "pos_embed", "patch_embed", "key"):
        assert f"| {column} " in md or f"|{column}|" in md.replace(" ", ""), column
