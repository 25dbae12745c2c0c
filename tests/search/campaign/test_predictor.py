"""The measured-cost predictor of a deployment target: fitted on measured shapes, it predicts others from their
counted costs, and says its own held-out error."""
from __future__ import annotations

import numpy as np

from qkvsearch.search.campaign.oneshot.predictor import CostPredictor


def _shape(rng, i: int):
    gmacs, params, depth = rng.uniform(0.01, 0.2), rng.uniform(0.5, 4.0), int(rng.integers(1, 5))
    int8 = i % 3 == 0
    config = {"depth": depth, **({"quant_qkv": "int8_dynamic"} if int8 else {})}
    latency = 0.4 + 12.0 * gmacs + 0.3 * depth - (4.0 * gmacs if int8 else 0.0)   # ms: int8 cuts the MACs' time
    return config, {"gmacs": gmacs, "params_m": params}, latency


def test_it_predicts_latency_and_throughput_from_counted_costs_and_reports_its_held_out_error():
    rng = np.random.default_rng(0)
    model = CostPredictor(("latency_ms", "throughput"), after=8)
    for i in range(12):
        config, cost, latency = _shape(rng, i)
        noisy = latency * rng.normal(1.0, 0.02)
        model.add(f"k{i}", config, cost, {"latency_ms": noisy, "throughput": 1000.0 / noisy})
        assert model.ready() == (i + 1 >= 8)
    model.add("k0", *_shape(rng, 0)[:2], {"latency_ms": 99.0, "throughput": 1.0})   # a shape once only
    held = []
    for i in range(100, 130):
        config, cost, latency = _shape(rng, i)
        got = model.predict(config, cost)
        held.append((got["latency_ms"], latency))
        assert abs(got["throughput"] - 1000.0 / latency) / (1000.0 / latency) < 0.15
    pred, truth = np.array(held).T
    assert np.mean(np.abs(pred - truth) / truth) < 0.05
    report = model.held_out()
    assert report["latency_ms"]["shapes"] == 12 and report["latency_ms"]["mape"] < 5.0
    assert report["latency_ms"]["kendall_tau"] > 0.8


def test_without_predict_after_it_never_stands_in():
    model = CostPredictor(("latency_ms",), after=None)
    rng = np.random.default_rng(1)
    for i in range(20):
        config, cost, latency = _shape(rng, i)
        model.add(f"k{i}", config, cost, {"latency_ms": latency})
    assert not model.ready() and CostPredictor(("latency_ms",), after=5).held_out() == {}
