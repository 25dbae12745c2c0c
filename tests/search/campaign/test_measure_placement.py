"""Where measurements run: ``measure.resources`` (a node's Ray resources; CPU and GPU among them say what the
measurement holds) read back as written and refused by name, the Ray options a measurement asks with, and the
custom resources a local Ray declares (QKVSEARCH_RAY_RESOURCES)."""
from __future__ import annotations

import pytest

from qkvsearch.search.campaign.measured import placed_options
from qkvsearch.search.cluster.local_ray import RESOURCES_ENV, declared
from qkvsearch.spaces import SpecError, load_campaign
from qkvsearch.spaces.errors import BadInput


def _spec(measure: dict) -> dict:
    return {"name": "m", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 1}, "storage": "/tmp",
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
            "measure": measure}


def test_measure_resources_read_back_and_a_bad_one_is_named():
    spec = load_campaign(_spec({"resources": {"cpu_node": 1, "CPU": 4}}))
    assert dict(spec.measure.resources) == {"cpu_node": 1.0, "CPU": 4.0} and load_campaign(spec.to_dict()) == spec
    assert "resources" not in load_campaign(_spec({"batch": 8})).to_dict()["measure"]   # earlier files: unchanged
    with pytest.raises(SpecError) as bad:
        load_campaign(_spec({"resources": {"cpu_node": 0}}))
    assert "measure.resources.cpu_node: expected a positive amount of a named Ray resource, given 0" in str(bad.value)


def test_a_measurement_asks_for_the_nodes_resources(ray_local):
    busy = placed_options({"CPU": 2.0, "cpu_node": 1.0}, 1.0, idle=False)
    assert busy == {"num_cpus": 2.0, "num_gpus": 0.0, "resources": {"cpu_node": 1.0}}
    # idle (scoring actors hold the CPUs): only the custom resources, pinned to a node that has the CPUs in all
    idle = placed_options({"CPU": 2.0}, 1.0, idle=True)
    assert (idle["num_cpus"], idle["num_gpus"], idle["resources"]) == (0, 0, {})
    assert idle["scheduling_strategy"].soft is False
    assert "scheduling_strategy" not in placed_options({"CPU": 64.0}, 1.0, idle=True)   # no node has 64


def test_a_local_ray_declares_the_resources_it_is_told(monkeypatch):
    monkeypatch.setenv(RESOURCES_ENV, '{"cpu_node": 1, "arm": 2.5}')
    assert declared() == {"cpu_node": 1.0, "arm": 2.5}
    monkeypatch.setenv(RESOURCES_ENV, "")
    assert declared() == {}
    for bad in ("cpu_node", '{"cpu_node": 0}', "[1]"):
        monkeypatch.setenv(RESOURCES_ENV, bad)
        with pytest.raises(BadInput, match=RESOURCES_ENV):
            declared()


def test_idle_measurements_run_one_at_a_time(ray_local, tmp_path):
    """An idle measurement holds no CPU (the scoring actors hold them): the measurer itself keeps two from timing
    on the same cores at once."""
    from helpers import tiny_model

    from qkvsearch.search.campaign.measured import Measurer, MeasureSettings
    from qkvsearch.spaces.keys import fill
    from qkvsearch.spaces.measure import MeasureSpec

    how = MeasureSettings(("latency_ms",), MeasureSpec(batch=2, cache=str(tmp_path), max_s=0.01))
    measurer = Measurer(how, 1, 1.0, 0.0)
    model = {("model" if k == "name" else k): v for k, v in tiny_model().items()}   # the section as trial keys
    configs = {e: fill({**model, "epochs": 1, "depth": 1, "embedding": e}) for e in ("linear", "sne", "psne")}
    for key, cfg in configs.items():
        measurer.start(key, cfg, idle=True)
    assert len(measurer._pending) == 1 and len(measurer._queued) == 2
    measurer.wait()
    spans = sorted(measurer.result(key)[1]["span"] for key in configs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))   # none began before the one before it ended
