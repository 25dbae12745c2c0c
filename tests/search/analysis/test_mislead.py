"""The report's "Where MACs mislead" section from a trials frame (search.analysis.mislead): pure data."""
from __future__ import annotations

import math

import pandas as pd

from qkvsearch.search.analysis.mislead import TITLE, distinct_models, flipped_pairs, where_macs_mislead


def _trials() -> pd.DataFrame:
    """Four models (one trained twice): fsne has the fewest MACs but is the slowest."""
    rows = [  # name, embedding, width, gmacs, latency_ms, throughput, top1, lr
        ("linear-0", "linear", 0, 0.50, 1.0, 1000.0, 60.0, 1e-3),
        ("linear-1", "linear", 0, 0.50, 1.0, 1000.0, 61.0, 2e-3),
        ("sne-h64-2", "sne", 64, 0.52, 1.2, 900.0, 62.0, 1e-3),
        ("psne-h96-3", "psne", 96, 0.55, 1.3, 800.0, 63.0, 1e-3),
        ("fsne-h128-4", "fsne", 128, 0.45, 1.5, 700.0, 64.0, 1e-3),
    ]
    df = pd.DataFrame(rows, columns=["trial_name", "config_embedding", "config_width", "gmacs", "latency_ms",
                                     "throughput", "final_top1", "config_lr"])
    return df.assign(status="completed", config_model="xcit_nano_12_p16_224", train_step_ms=None)


def test_each_distinct_model_counts_once():
    models = distinct_models(_trials())
    assert list(models["model"]) == ["linear", "sne-h64", "psne-h96", "fsne-h128"]
    assert set(models.columns) == {"model", "policy", "gmacs", "latency_ms", "throughput"}   # no column without a value
    assert set(models["policy"]) == {"fp"}   # trials without policy keys (a campaign from before policies)


def test_each_quantization_policy_of_one_training_is_a_row_that_shows_its_policy():
    trials = _trials().iloc[:2].assign(config_quant_qkv="fp", config_quant_proj="fp", config_quant_mlp="fp")
    quantized = trials.iloc[[1]].assign(trial_name="linear-qkv.a8w8-mlp.w8-5", config_quant_qkv="int8_dynamic",
                                        config_quant_mlp="int8_weight_only", latency_ms=0.7, size_mb=1.0)
    models = distinct_models(pd.concat([trials, quantized], ignore_index=True))
    assert list(models["model"]) == ["linear", "linear-qkv.a8w8-mlp.w8"]
    assert list(models["policy"]) == ["fp", "qkv int8_dynamic, mlp int8_weight_only"]
    md = where_macs_mislead(pd.concat([trials, quantized]), ["final_top1", "latency_ms"], ["max", "min"]).markdown
    assert "| linear-qkv.a8w8-mlp.w8 | qkv int8_dynamic, mlp int8_weight_only | 0.5 | 0.7 |" in md


def test_rank_correlation_and_the_pairs_whose_order_flips():
    found = where_macs_mislead(_trials(), ["final_top1", "latency_ms"], ["max", "min"])
    # latency ranks linear < sne < psne < fsne, GMACs fsne < linear < sne < psne: rho = 1 - 6 * 12 / 60 = -0.2
    assert math.isclose(found.spearman["latency_ms"], -0.2)
    assert math.isclose(found.spearman["throughput"], -0.2)   # compared as time per image
    flips = found.flips["latency_ms"]
    assert set(flips["fewer MACs"]) == {"fsne-h128"} and len(flips) == 3
    assert flipped_pairs(distinct_models(_trials()).iloc[:3], "latency_ms").empty


def test_the_fronts_by_gmacs_and_by_latency_differ_and_both_are_rendered():
    found = where_macs_mislead(_trials(), ["final_top1", "latency_ms"], ["max", "min"])
    assert found.fronts["gmacs"] == ["fsne-h128-4"]
    assert found.fronts["latency_ms"] == ["fsne-h128-4", "linear-1", "psne-h96-3", "sne-h64-2"]
    md = found.markdown
    assert md.startswith(f"## {TITLE}") and "latency_ms -0.20" in md and "| fsne-h128 | linear |" in md
    assert "not on the GMACs front: linear-1, psne-h96-3, sne-h64-2" in md
    assert f"<h2>{TITLE}</h2>" in found.html


def test_nothing_measured_means_no_section():
    assert where_macs_mislead(_trials().drop(columns=["latency_ms", "throughput"]), ["final_top1"], ["max"]) is None
