"""A real campaign on local Ray over the Vision X-formers choices (Linformer with shared keys and values,
1-D RoPE, the paper's plain conv stem, the MLP-Mixer): every trial trains and records the cost that
model_cost counts for its config."""
from __future__ import annotations

from pathlib import Path

import pytest

from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow

VIT, MIXER = "vit_tiny_patch16_224", "mixer_s16_224"


def _spec(tmp: Path) -> dict:
    return {
        "name": "xformer-choices",
        "model": {"name": VIT, "img_size": 8, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 8, "lr": 2e-3, "warmup_epochs": 0, "max_steps_per_epoch": 1, "seed": 0},
        "space": {
            "depth": 1, "embed_dim": 16, "patch_size": 2,
            "variants": [{"model": VIT, "num_heads": 2}, {"model": MIXER, "token_mlp_ratio": 1.0}],
            "attention": {"grid": ["linformer_shared_kv"], "when": {"model": VIT}},
            "attn_proj_len": 8,
            "pos_embed": {"grid": ["learned", "rope1d"], "when": {"model": VIT}},
            "patch_embed": {"grid": ["linear", "conv_plain"]},
        },
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "params_m", "mode": "min"}],
        "search": {"algorithm": "grid"},
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


def test_a_campaign_over_the_xformer_choices_trains_each_and_records_its_cost(ray_local, tmp_path):
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.trainers.model.cost import model_cost

    exp = Path(launch(load_campaign(_spec(tmp_path))))
    records = load_records(str(exp))
    assert sorted(r["status"] for r in records) == ["completed"] * 6
    seen = {(r["config"]["model"], r["config"]["attention"], r["config"]["pos_embed"], r["config"]["patch_embed"])
            for r in records}
    assert seen == {(VIT, "linformer_shared_kv", p, s)
                    for p in ("learned", "rope1d") for s in ("linear", "conv_plain")} \
        | {(MIXER, None, None, s) for s in ("linear", "conv_plain")}
    for r in records:
        assert r["cost"]["params"] == model_cost(r["config"])["params"], r["config"]
    assert len({r["cost"]["params"] for r in records}) == 6
