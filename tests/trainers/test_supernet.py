"""The supernet holds every configuration of a space: a subnet run through it is, to the last bit, the model
``build_model`` makes with the weights ``extract`` gives; a narrow subnet trains only the leading part of the
tensors it shares; a configuration outside the space is refused, naming the tensor."""
from __future__ import annotations

import json

import pytest
import torch

from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
from qkvsearch.spaces import load_campaign
from qkvsearch.trainers.model.models import build_model
from qkvsearch.trainers.supernet.layout import place
from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.supernet.weights import Supernet, _safe, widest


def _spec(space: dict, **model) -> dict:
    return {"name": "s", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10, **model},
            "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 8, "seed": 0},
            "space": {"depth": 2, **space}, "supernet": {"train": {"epochs": 1}},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}


SPACE = {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]}, "hidden_width": {"choice": [0.25, 0.5, 1.0]},
         "code_size": {"choice": [4, 8]}, "code_sharing": {"choice": ["shared", "per_block"]}}


@pytest.fixture(scope="module")
def space():
    trials = candidates(load_campaign(_spec(SPACE)))
    return [t["config"] for t in trials]


def test_every_subnet_is_the_model_built_with_its_extracted_weights(space):
    torch.manual_seed(0)
    supernet = Supernet(space, seed=0).eval()
    x = torch.randn(2, 3, 16, 16)
    kinds = set()
    for cfg in space:
        model = build_model(cfg).eval()
        model.load_state_dict(supernet.extract(cfg))
        with torch.no_grad():
            diff = (supernet(x, cfg) - model(x)).abs().max().item()
        assert diff == 0.0, (cfg["embedding"], cfg.get("width"), cfg.get("code_size"), diff)
        kinds.add((cfg["embedding"], cfg.get("code_sharing") if cfg["embedding"] == "fsne" else None))
    assert kinds == {("linear", None), ("sne", None), ("psne", None), ("fsne", "shared"), ("fsne", "per_block")}


def test_the_widest_subnets_start_as_models_of_their_own(space):
    supernet = Supernet(space, seed=3)
    for cfg in widest(space):
        torch.manual_seed(3)
        own = build_model(cfg).state_dict()
        got = supernet.extract(cfg)
        shared = [n for n in own if ".attn." in n]  # a branch's tensors come from its widest model alone
        assert shared and all(torch.equal(own[n], got[n]) for n in shared)


def test_a_narrow_subnet_trains_the_leading_part_of_its_branch_only(space):
    """Every tensor a narrow SNE subnet uses gets gradient exactly where the subnet's cut of it lies (the leading
    entries of each of its parts: q, k and v thirds of the first layer) and nowhere else; other branches none."""
    supernet = Supernet(space, seed=0)
    narrow = min((c for c in space if c["embedding"] == "sne"), key=lambda c: c["width"])
    wide = max((c for c in space if c["embedding"] == "sne"), key=lambda c: c["width"])
    assert narrow["width"] < wide["width"]
    supernet(torch.randn(2, 3, 16, 16), narrow).sum().backward()
    grads = {k: p.grad for k, p in supernet.masters.items()}
    other_branch = [k for k, g in grads.items() if "embedding=" in k and "embedding=sne" not in k]
    assert other_branch and all(grads[k] is None for k in other_branch)
    partial = 0
    for _, key, layout in supernet._plan(narrow):
        grad = grads[_safe(key)]
        if "embedding=sne" not in key:
            continue
        inside = torch.zeros_like(grad, dtype=torch.bool)
        place(inside, supernet.layouts[key], layout, torch.ones([sum(p) for p in layout], dtype=torch.bool))
        assert (grad[~inside] == 0).all(), key         # nothing outside its cut is trained
        assert (grad[inside] != 0).any(), key          # its cut is
        partial += int(inside.sum() < inside.numel())
    assert partial >= 6   # per block: both layers' weights and the first layer's bias are cut narrower


def test_a_configuration_outside_the_space_is_refused_naming_its_tensor(space):
    narrow_space = [c for c in space if c["embedding"] == "sne" and c["width"] < max(s["width"] for s in space)]
    supernet = Supernet(narrow_space, init=False)
    wider = max((c for c in space if c["embedding"] == "sne"), key=lambda c: c["width"])
    why = supernet.serves(wider)
    assert why and "attn" in why and "needs" in why
    with pytest.raises(ValueError, match="cannot run"):
        supernet.params_for(wider)


def test_the_sandwich_trains_every_branch_in_turn_and_every_rank_draws_the_same_students():
    spec = load_campaign(_spec(SPACE))
    data = supernet_plan(spec)
    plan = SupernetPlan.from_dict(data)
    assert len(plan.sandwich) == 5   # linear, sne, psne, fsne shared, fsne per block
    teacher = plan.teacher
    for update in range(2 * len(plan.sandwich)):
        _, largest, smallest = plan.sandwich[update % len(plan.sandwich)]
        students = plan.students(update, seed=0)
        assert all(c in students for c in (largest, smallest) if c != teacher)
        assert teacher not in students
    # a rank builds its plan from the same data: it draws the same students, update by update
    other = SupernetPlan.from_dict(json.loads(json.dumps(data)))
    draws = [plan.students(u, seed=0) for u in range(6)]
    assert draws == [other.students(u, seed=0) for u in range(6)]
    randoms = [tuple(json.dumps(c, sort_keys=True) for c in d[2:]) for d in draws]
    assert len(set(randoms)) > 1   # the random students change from update to update


def test_an_exported_subnet_loads_into_its_own_model_and_a_retraining_starts_from_it(space, tmp_path):
    """The stand-alone checkpoint a one-shot campaign writes per selected subnet: build_model(cfg) loads it
    (strictly), computes what the subnet computes in the supernet, and a training started from it with its head
    (``retrain_from: inherited``) starts with exactly those weights; a fine-tuning's load keeps a new head."""
    from qkvsearch.search.campaign.oneshot.scorers import _Scorer
    from qkvsearch.trainers.training.checkpoints import classifier_prefix, load_pretrained
    from qkvsearch.trainers.training.engine import STATE_FORMAT, save_state

    cfg = next(c for c in space if c["embedding"] == "sne" and c.get("width") != max(s.get("width") for s in space))
    spec = load_campaign(_spec(SPACE))
    plan = supernet_plan(spec)
    supernet = SupernetPlan.from_dict(plan).supernet(seed=1)
    folder = tmp_path / "ckpt"  # as a supernet's trial checkpoints it
    save_state({"format": STATE_FORMAT, "model": supernet.state_dict(), "epoch": 1, "history": [], "config": cfg},
               str(folder))
    actor = _Scorer()
    actor.load(plan, str(folder), {**cfg, "batch_size": 8}, bn_batches=1, threads=1)
    path = str(tmp_path / "subnets" / "subnet_000003.pt")
    actor.export([cfg], [path], "sup:t@epoch1")

    saved = torch.load(path, weights_only=True)
    assert saved["config"] == cfg and saved["supernet"] == "sup:t@epoch1"
    model = build_model(cfg).eval()
    model.load_state_dict(saved["model"])  # strict: every tensor, nothing extra
    x = torch.randn(2, 3, 16, 16)
    scorer = actor.scorer
    with torch.no_grad():
        scorer.supernet.eval()
        assert torch.equal(model(x), scorer.supernet(x, cfg))

    fresh = build_model(cfg)
    assert load_pretrained(fresh, path, keep_head=True) == []
    assert all(torch.equal(v, saved["model"][k]) for k, v in fresh.state_dict().items())
    tuned = build_model(cfg)
    head = classifier_prefix(tuned) + "."
    assert all(k.startswith(head) for k in load_pretrained(tuned, path))  # a fine-tuning: a new head only


def test_a_subnet_is_scored_under_its_quantization_policy_and_the_supernet_trains_each_model_once(tmp_path):
    """A policy changes no weight: the supernet's plan holds each model once whatever the policies searched, and
    a subnet is scored under its policy (top1_q of its extracted model quantized, size_mb as stored)."""
    from qkvsearch.trainers.model.quantize import quantize_model, weights_bytes
    from qkvsearch.trainers.supernet.scoring import SubnetScorer

    space = {"embedding": {"choice": ["linear", "sne"]}, "quant_mlp": {"choice": ["fp", "int8_weight_only"]}}
    spec = load_campaign(_spec(space))
    trials = candidates(spec)
    assert len(trials) == 4  # every subnet under each policy is a candidate to score
    plan = supernet_plan(spec)
    trained = [plan["teacher"], *plan["covers"], *(c for _, lg, sm in plan["sandwich"] for c in (lg, sm))]
    assert {c["quant_mlp"] for c in trained} == {"fp"}   # the supernet trains each model in full precision
    assert len(plan["sandwich"]) == 2   # linear, sne: a policy is no branch
    state = {"model": SupernetPlan.from_dict(plan).supernet(seed=0).state_dict()}
    scorer = SubnetScorer(SupernetPlan.from_dict(plan), state, {**trials[0]["config"], "batch_size": 8}, bn_batches=1)
    scores = {(t["config"]["embedding"], t["config"]["quant_mlp"]): scorer.score(t["config"]) for t in trials}
    for emb in ("linear", "sne"):
        fp, q = scores[(emb, "fp")], scores[(emb, "int8_weight_only")]
        assert fp["top1_q"] == fp["top1"] == q["top1"]  # the same weights; the policy applies after extraction
        cfg = next(t["config"] for t in trials if (t["config"]["embedding"], t["config"]["quant_mlp"])
                   == (emb, "int8_weight_only"))
        model = build_model(cfg)
        model.load_state_dict(scorer.extract(cfg))
        assert fp["size_mb"] == weights_bytes(model) / 1e6
        assert q["size_mb"] == weights_bytes(quantize_model(model.eval(), cfg, "cpu")) / 1e6 < fp["size_mb"]
        assert 0.0 <= q["top1_q"] <= 100.0


def test_a_subnet_is_scored_under_its_per_block_policy():
    """A block's own precision (quant_mlp.1) is no branch and no weight of the supernet: one model is trained, and
    a subnet is scored with exactly the parts its policy names quantized, block by block."""
    from torchao.quantization import Int8Tensor

    from qkvsearch.trainers.model.quantize import quantize_model, weights_bytes
    from qkvsearch.trainers.supernet.scoring import SubnetScorer

    spec = load_campaign(_spec({"quant_mlp": {"choice": ["fp", "int8_weight_only"], "per_block": True}}))
    trials = {(t["config"]["quant_mlp.0"], t["config"]["quant_mlp.1"]): t["config"] for t in candidates(spec)}
    assert len(trials) == 4   # one model under 2 x 2 block policies
    plan = supernet_plan(spec)
    assert len(plan["sandwich"]) == 1 and not any(k.startswith("quant_mlp.") for k in plan["teacher"])
    state = {"model": SupernetPlan.from_dict(plan).supernet(seed=0).state_dict()}
    fp, mixed = trials[("fp", "fp")], trials[("fp", "int8_weight_only")]
    scorer = SubnetScorer(SupernetPlan.from_dict(plan), state, {**fp, "batch_size": 8}, bn_batches=1)
    fp_score, mixed_score = scorer.score(fp), scorer.score(mixed)
    assert fp_score["top1_q"] == fp_score["top1"] == mixed_score["top1"]   # one set of weights
    model = build_model(mixed)
    model.load_state_dict(scorer.extract(mixed))
    served = quantize_model(model.eval(), mixed, "cpu")
    int8 = {n for n, m in served.named_modules() if isinstance(m, torch.nn.Linear) and isinstance(m.weight, Int8Tensor)}
    assert int8 == {"blocks.1.mlp.fc1", "blocks.1.mlp.fc2"}   # block 1's MLP alone
    assert mixed_score["size_mb"] == weights_bytes(served) / 1e6 < fp_score["size_mb"]

def test_a_subnets_score_does_not_depend_on_what_was_scored_before():
    """BatchNorm is recalibrated in train mode every time, not only at a skeleton's first use (its last forward
    leaves it in eval mode): each subnet scores the same first, after others, and again."""
    from qkvsearch.trainers.supernet.scoring import SubnetScorer

    spec = load_campaign(_spec({"embedding": {"choice": ["linear", "sne"]}}))
    trials = candidates(spec)
    plan = supernet_plan(spec)
    state = {"model": SupernetPlan.from_dict(plan).supernet(seed=0).state_dict()}
    scorer = SubnetScorer(SupernetPlan.from_dict(plan), state, {**trials[0]["config"], "batch_size": 8}, bn_batches=1)
    first = [scorer.score(t["config"]) for t in trials]
    again = [scorer.score(t["config"]) for t in reversed(trials)][::-1]
    assert first == again
    skeleton = scorer.supernet.skeleton(trials[0]["config"])
    norms = [m for m in skeleton.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert norms and all(not torch.all(m.running_var == 1) for m in norms)  # statistics of the batches


# Per-block choices: each block draws its embedding and width; depth is searched beside them.
PER_BLOCK = {"depth": {"choice": [2, 3]}, "embedding": {"choice": ["linear", "sne", "fsne"], "per_block": True},
             "hidden_width": {"choice": [0.25, 0.5], "per_block": True}}


def test_every_per_block_subnet_is_the_model_built_with_its_extracted_weights():
    space = [t["config"] for t in candidates(load_campaign(_spec(PER_BLOCK)))]
    assert len(space) > 50   # 3 kinds x 2 widths per block: (1 + 2 + 2)^2 + (1 + 2 + 2)^3 = 150 configurations
    mixed = [c for c in space if len({c.get(f"embedding.{b}") for b in range(c["depth"])}) > 1]
    assert mixed and all("embedding.2" not in c or c["depth"] == 3 for c in space)
    torch.manual_seed(0)
    supernet = Supernet(space, seed=0).eval()
    x = torch.randn(2, 3, 16, 16)
    for cfg in space[::7] + mixed[:5]:
        model = build_model(cfg).eval()
        model.load_state_dict(supernet.extract(cfg))
        kinds = [type(model.blocks[b].attn.qkv).__name__.lower() for b in range(cfg["depth"])]
        assert kinds == [cfg[f"embedding.{b}"] for b in range(cfg["depth"])]
        with torch.no_grad():
            assert (supernet(x, cfg) - model(x)).abs().max().item() == 0.0, cfg
    # a block's branch is its own: block 1's SNE tensors are not block 0's
    assert any(k.startswith("blocks/1/attn") and "embedding=sne" in k for k in supernet.masters)
    plan = supernet_plan(load_campaign(_spec(PER_BLOCK)))
    assert len(plan["sandwich"]) == 1   # per-block keys split no sandwich branch


def test_per_block_subnets_of_both_code_sharings_and_a_late_first_fsne_block_are_served():
    space = {"depth": 3, "embedding": {"choice": ["linear", "fsne"], "per_block": True},
             "code_sharing": {"choice": ["shared", "per_block"]}}
    configs = [t["config"] for t in candidates(load_campaign(_spec(space)))]
    late = [c for c in configs if c["embedding.0"] == "linear" and c["embedding.1"] == "linear"
            and c["embedding.2"] == "fsne"]
    assert {c["code_sharing"] for c in late} == {"shared", "per_block"}
    supernet = Supernet(configs, seed=0).eval()
    x = torch.randn(2, 3, 16, 16)
    for cfg in late + configs[:4]:   # F-SNE's shared codes belong to its first block: here block 2
        model = build_model(cfg).eval()
        model.load_state_dict(supernet.extract(cfg))
        with torch.no_grad():
            assert (supernet(x, cfg) - model(x)).abs().max().item() == 0.0, cfg
