"""The campaign file's ``supernet`` section: what one-shot search accepts, and what it refuses by name."""
from __future__ import annotations

import pytest

from qkvsearch.spaces import SpecError, load_campaign


def _spec(**over) -> dict:
    spec = {"name": "s", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 2, "batch_size": 16, "seed": 0},
            "space": {"embedding": {"choice": ["sne", "fsne"]}, "hidden_width": {"choice": [0.5, 1.0]},
                      "patch_size": 8},
            "supernet": {"train": {"epochs": 3, "lr": 1e-3}, "control": 2},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}
    for key, value in over.items():
        spec[key] = value
    return spec


def _errors(spec: dict) -> str:
    with pytest.raises(SpecError) as err:
        load_campaign(spec)
    return "\n".join(err.value.errors)


def test_a_supernet_section_round_trips():
    spec = load_campaign(_spec())
    assert spec.supernet and spec.supernet.recipe["epochs"] == 3 and spec.supernet.control == 2
    again = load_campaign(spec.to_dict())
    assert again.supernet == spec.supernet and again.supernet.retrain_from == "scratch"
    assert "retrain_from" not in spec.to_dict()["supernet"]  # campaign files written before it read back the same
    inherited = load_campaign({**_spec(), "supernet": {**_spec()["supernet"], "retrain_from": "inherited"}})
    assert load_campaign(inherited.to_dict()).supernet.retrain_from == "inherited"
    assert not load_campaign({k: v for k, v in _spec().items() if k != "supernet"}).supernet
    assert "resources" not in spec.to_dict()["supernet"]
    own = load_campaign({**_spec(), "supernet": {**_spec()["supernet"], "resources": {"workers_per_trial": 4}}})
    assert dict(load_campaign(own.to_dict()).supernet.resources) == {"workers_per_trial": 4}


@pytest.mark.parametrize("space, field, words", [
    ({"embedding": {"choice": ["sne"]}, "lr": {"choice": [1e-3, 2e-3]}}, "space.lr", "training recipe"),
    ({"embedding": {"choice": ["sne"]}, "img_size": {"choice": [16, 32]}}, "space.img_size", "one input"),
    ({"variants": [{"embedding": "sne", "seed": 0}, {"embedding": "sne", "seed": 1}]}, "space.seed", "recipe"),
])
def test_a_key_no_supernet_can_share_is_refused_naming_it(space, field, words):
    text = _errors(_spec(space=space))
    assert field in text and words in text and "hidden_width" in text


@pytest.mark.parametrize("section, field, words", [
    ({"train": {"lr": 1e-3}}, "supernet.train.epochs", "required"),
    ({"train": {"epochs": 2, "momentum": 0.9}}, "supernet.train", "momentum"),
    ({"train": {"epochs": -1}}, "supernet.train.epochs", "-1"),
    ({"train": {"epochs": 2}, "retrain": "top_k"}, "supernet.top_k", "required"),
    ({"train": {"epochs": 2}, "retrain": "best"}, "supernet.retrain", "front | top_k"),
    ({"train": {"epochs": 2}, "retrain_from": "pretrained"}, "supernet.retrain_from", "scratch | inherited"),
    ({"train": {"epochs": 2}, "top_k": 3}, "supernet.top_k", "top_k only"),
    ({"train": {"epochs": 2}, "control": -2}, "supernet.control", "-2"),
    ({"train": {"epochs": 2}, "bn_batches": 0}, "supernet.bn_batches", "0"),   # BatchNorm left at (0, 1)
    ({"train": {"epochs": 2}, "from": 7}, "supernet.from", "7"),
    ({"train": {"epochs": 2}, "wide": True}, "supernet", "wide"),
    ({"train": {"epochs": 2}, "resources": {"workers_per_trial": 0}}, "supernet.resources.workers_per_trial", "0"),
    ({"train": {"epochs": 2}, "resources": {"nodes": 2}}, "supernet.resources", "nodes"),
])
def test_a_bad_supernet_field_is_refused_naming_it(section, field, words):
    text = _errors(_spec(supernet=section))
    assert field in text and words in text, text


def test_one_shot_search_has_no_stages():
    stages = {"finetune": [{"dataset": "digits", "epochs": 1}]}
    assert "stages" in _errors(_spec(stages=stages))


def test_a_quantization_policy_is_searched_with_the_subnets():
    spec = load_campaign(_spec(space={"embedding": "sne", "hidden_width": {"choice": [0.5, 1.0]},
                                      "quant_qkv": {"choice": ["fp", "int8_dynamic"]}}))
    assert spec.supernet


def test_the_control_sample_is_16_by_default():
    spec = load_campaign(_spec(supernet={"train": {"epochs": 3}}))
    assert spec.supernet.control == 16


@pytest.mark.parametrize("metric", ["epoch_s", "train_loss", "epoch_peak_mem_gb"])
def test_an_objective_one_shot_scoring_cannot_give_is_refused_naming_it(metric):
    text = _errors(_spec(objectives=[{"metric": "top1", "mode": "max"}, {"metric": metric, "mode": "min"}]))
    assert "objectives[1].metric" in text and metric in text and "only a training run reports" in text, text


def test_measured_and_scored_figures_are_one_shot_objectives_and_a_scheduler_is_named_unused(caplog):
    spec = load_campaign(_spec(objectives=[{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
                               constraints={"size_mb": {"max": 5.0}}))
    assert [o.metric for o in spec.objectives] == ["top1", "latency_ms"] and not caplog.records
    load_campaign(_spec(scheduler={"type": "moasha"}))
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "scheduler.type" in warning and "FIFO" in warning and "moasha is not used" in warning


def test_the_branch_keys_come_from_the_key_table_in_the_order_trained_supernets_name_them():
    from qkvsearch.spaces.keys import KEYS
    from qkvsearch.spaces.supernet import ATTENTION_BRANCH, BRANCH_KEYS, POSITION_BRANCH, STEM_BRANCH

    assert set(BRANCH_KEYS) == {k.name for k in KEYS.values() if k.splits}
    # a supernet tensor is named by these keys' values in this order (trainers.supernet.layout.master_key): the
    # checkpoints of supernets trained by earlier versions hold these names
    assert ATTENTION_BRANCH == ("embedding", "attention", "key", "key_aggregation", "key_context", "activation",
                                "code_sharing")
    assert (STEM_BRANCH, POSITION_BRANCH) == (("patch_embed",), ("pos_embed",))
