"""The supernet trains through the engine's update (trainers.training.engine.train_one_epoch): a trial's
metric names and checks, every subnet's loss checked for divergence, the injected faults, weight decay on
exactly what a stand-alone model of each subnet decays, and gradients averaged in buckets."""
from __future__ import annotations

import pytest
import torch

from qkvsearch.search.campaign.oneshot.plan import supernet_plan
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.supernet.training import SupernetRun, _buckets
from qkvsearch.trainers.supernet.weights import _safe
from qkvsearch.trainers.training import engine
from qkvsearch.trainers.training.errors import DivergenceError

SPEC = {"name": "s", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 16, "seed": 0, "max_steps_per_epoch": 2, "weight_decay": 0.05},
        "space": {"depth": 2, "embedding": {"choice": ["linear", "sne", "fsne"]},
                  "hidden_width": {"choice": [0.5, 1.0]}, "code_size": 4},
        "supernet": {"train": {"epochs": 1}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}


@pytest.fixture(scope="module")
def plan():
    return SupernetPlan.from_dict(supernet_plan(load_campaign(SPEC)))


def _run(plan, faults=()) -> SupernetRun:
    cfg = fill({**base_config(load_campaign(SPEC)), **plan.teacher})
    return SupernetRun(cfg, engine.Dist(), faults=faults, plan=plan)


def test_an_epoch_reports_a_trials_metrics_and_every_subnets_loss(plan):
    run = _run(plan)
    metrics = run.run_epoch()
    trial = {"epoch", "step", "train_loss", "top1", "top5", "val_loss", "lr", "images_per_s", "epoch_s", "train_s",
             "eval_s", "epoch_step_ms", "qs_param_checksum", "qs_param_spread", "qs_world_size"}
    assert trial <= set(metrics) and metrics["qs_param_spread"] == 0.0
    assert metrics["train_loss_students"] > 0 and metrics["top1_smallest"] >= 0   # the students' mean loss
    assert metrics["qs_param_checksum"] == engine.param_checksum(run.raw)


def test_weight_decay_falls_on_exactly_what_a_stand_alone_model_decays(plan):
    """timm's rule for a stand-alone model: no decay for 1-d tensors, biases (SNE's grouped (3, d) ones too), and
    the model's no_weight_decay names (XCiT: the class token, the positions' projection); the supernet's tensors
    follow the rule of the subnets' parameters they hold."""
    from timm.optim._param_groups import param_groups_weight_decay

    from qkvsearch.trainers.model.models import build_model

    run = _run(plan)
    names = {id(p): n for n, p in run.raw.named_parameters()}
    exempt = {names[id(p)] for g in run.optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert exempt and len(exempt) < len(names)
    expected = set()
    for cfg in plan.covers:
        model = build_model(cfg)
        groups = param_groups_weight_decay(model, 0.05, no_weight_decay_list=model.no_weight_decay())
        free = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
        for (name, key, _), (own, p) in zip(run.raw._plan(cfg), model.named_parameters()):
            assert name == own
            if id(p) in free:
                expected.add(f"masters.{_safe(key)}")
    assert exempt == expected
    assert any("cls_token" in n for n in exempt) and any("fc2/bias" in n and "sne" in n for n in exempt)
    assert any("pos_embed/token_projection/weight" in n for n in exempt)


def test_a_non_finite_loss_ends_the_supernets_training_naming_the_update(plan):
    run = _run(plan, faults=[{"nan_at_update": 2}])
    with pytest.raises(DivergenceError, match=r"non-finite loss \(teacher\) nan at epoch 1 step 2"):
        run.run_epoch()
    assert run.updates == 1   # the diverged update never applied


def test_gradients_are_cut_into_buckets_of_one_dtype_and_a_bounded_size():
    grads = [torch.zeros(10), torch.zeros(20), torch.zeros(5, dtype=torch.float64), torch.zeros(100), torch.zeros(3)]
    buckets = _buckets(grads, limit=30 * 4)
    assert [[g.numel() for g in b] for b in buckets] == [[10, 20], [5], [100], [3]]
    assert [g for b in buckets for g in b] == grads   # every gradient once, in order
