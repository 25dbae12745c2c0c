"""The campaign file's ``targets`` section: deployment targets of one supernet, read back as written, each mistake
named under its target; a target's space cut to its precisions; its measurements cached apart."""
from __future__ import annotations

import pytest

from qkvsearch.search.campaign.oneshot.targets import target_spec
from qkvsearch.spaces import SpecError, load_campaign
from qkvsearch.spaces.targets import ACCELERATOR, ACCELERATOR_SHARE

LATENCY = [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}]


def _spec(targets, **over) -> dict:
    spec = {"name": "t", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 2, "batch_size": 16, "seed": 0},
            "space": {"depth": 2, "embedding": {"choice": ["sne", "fsne"]}, "hidden_width": {"choice": [0.5, 1.0]},
                      "quant_qkv": {"choice": ["fp", "int8_dynamic"]}},
            "supernet": {"train": {"epochs": 3}, "control": 2},
            "constraints": {"gmacs": {"max": 1.0}},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp", "targets": targets}
    return {**spec, **over}


def _errors(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_campaign(spec)
    return err.value.errors


def test_targets_round_trip_and_each_gets_its_own_campaign():
    spec = load_campaign(_spec([
        {"name": "edge", "resources": {"cpu_node": 1}, "precisions": ["int8_dynamic"],
         "constraints": {"latency_ms": {"max": 3}}, "objectives": LATENCY, "retrain": True},
        {"name": "gpu", "accelerator": "A100", "resources": {"GPU": 1}}]))
    assert load_campaign(spec.to_dict()) == spec
    edge, gpu = spec.targets
    assert gpu.node_resources() == {"GPU": 1.0, ACCELERATOR + "A100": ACCELERATOR_SHARE}
    own = target_spec(spec, "/r/t", edge)
    assert own.name == "edge" and own.storage == "/r/t/targets"
    assert [c.metric for c in own.constraints] == ["gmacs", "latency_ms"]   # the campaign's, then its own
    assert [o.metric for o in own.objectives] == ["top1", "latency_ms"] and not own.targets
    assert own.space.dimension("quant_qkv").values == ("int8_dynamic",)     # cut to its precisions
    assert own.measure.cache == "/r/t/qs_measurements/targets/edge" and dict(own.measure.resources) == {"cpu_node": 1}
    assert own.supernet.source == "/r/t" and own.supernet.control == 2      # it retrains: its control sample
    other = target_spec(spec, "/r/t", gpu)
    assert other.objectives == spec.objectives and other.supernet.control == 0   # no retraining, no control
    assert other.space.dimension("quant_qkv").values == ("fp", "int8_dynamic")


def test_each_mistake_is_named_under_its_target():
    errors = "\n".join(_errors(_spec([
        {"name": "Edge!", "resources": {"cpu_node": 0}, "precisions": ["int4"], "extra": 1,
         "constraints": {"top1": {"min": 50}}, "objectives": [{"metric": "epoch_s", "mode": "min"}]},
        {"name": "b", "precisions": ["int8_weight_only"]}, {"name": "b"}])))
    for named in ("targets[0].name", "targets[0].resources.cpu_node", "targets[0].precisions[0]", "targets[0].extra",
                  "targets[0].constraints.top1", "targets[0].objectives[0].metric",
                  "targets[1].precisions: expected precisions the space's quant_qkv takes",
                  "targets[2].name: expected a name no other target has"):
        assert named in errors
    alone = _spec([{"name": "a"}])
    del alone["supernet"]
    assert any(e.startswith("targets: only with a supernet section") for e in _errors(alone))



def test_a_target_adds_its_constraints_to_the_campaigns_and_cannot_loosen_one():
    spec = load_campaign(_spec([{"name": "loose", "constraints": {"gmacs": {"max": 5.0, "min": 0.1},
                                                                  "params_m": {"max": 0.5}}}],
                               constraints={"gmacs": {"max": 1.0}, "params": {"min": 10}}))
    (loose,) = spec.targets
    own = {c.metric: c.to_dict() for c in target_spec(spec, "/r/t", loose).constraints}
    # the campaign's max 1.0 stays (its 5.0 would widen it); its min and its own metric are added
    assert own == {"gmacs": {"max": 1.0, "min": 0.1}, "params": {"min": 10.0}, "params_m": {"max": 0.5}}
    narrow = load_campaign(_spec([{"name": "narrow", "constraints": {"gmacs": {"max": 0.5}}}]))
    assert target_spec(narrow, "/r/t", narrow.targets[0]).constraints[0].max == 0.5   # the tighter: its own
    errors = _errors(_spec([{"name": "none", "constraints": {"gmacs": {"min": 2.0}}}]))   # min 2 > the max 1
    assert any(e.startswith("targets[0].constraints.gmacs: expected bounds that, added to the campaign's")
               for e in errors)
