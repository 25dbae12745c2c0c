"""The space a supernet serves is the whole space: its largest and smallest configurations are computed (equal to
a search of every configuration where one can be made), its tensors hold every configuration, products of widths
included, and its students are drawn from all of it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qkvsearch.search.campaign.oneshot.plan import candidates, subnet_space, supernet_plan
from qkvsearch.spaces import load_campaign
from qkvsearch.trainers.model.models import build_model
from qkvsearch.trainers.supernet.plan import SupernetPlan


def _spec(space: dict, img: int = 16, **model) -> dict:
    return {"name": "s", "model": {"name": "xcit_nano_12_p8_224", "img_size": img, "num_classes": 10, **model},
            "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 8, "seed": 0},
            "space": space, "supernet": {"train": {"epochs": 1}},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}


ENUMERABLE = [
    {"depth": {"choice": [1, 2, 3]}, "embedding": {"choice": ["linear", "sne", "psne", "fsne"]},
     "hidden_width": {"choice": [0.25, 0.5, 1.0]}, "code_size": {"choice": [4, 16]}, "mlp_ratio": {"choice": [1, 4]}},
    {"depth": {"choice": [2, 3]}, "embedding": {"choice": ["linear", "sne", "fsne"], "per_block": True},
     "hidden_width": {"choice": [0.25, 1.0], "per_block": True}},
    {"variants": [{"embed_dim": 128, "mlp_ratio": 1}, {"embed_dim": 64, "mlp_ratio": 4},
                  {"embed_dim": 96, "mlp_ratio": 3}], "depth": 2, "num_heads": 4,
     "embedding": {"choice": ["sne", "psne"]}, "hidden_width": {"choice": [32, 0.5]}},
]


@pytest.mark.parametrize("space", ENUMERABLE, ids=["whole-model", "per-block", "variants"])
def test_the_extremes_are_those_of_every_configuration(space):
    from qkvsearch.trainers.model.cost import model_cost

    spec = load_campaign(_spec(space))
    gmacs = [t["cost"]["gmacs"] for t in candidates(spec)]
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    assert model_cost(plan.teacher)["gmacs"] == max(gmacs)
    assert model_cost(plan.smallest)["gmacs"] == min(gmacs)
    for _, largest, smallest in plan.sandwich:   # each branch's own: of the configurations of that branch
        branch = [t["cost"]["gmacs"] for t in candidates(spec) if t["config"]["embedding"] == largest["embedding"]]
        if space is ENUMERABLE[0]:
            assert model_cost(largest)["gmacs"] == max(branch) and model_cost(smallest)["gmacs"] == min(branch)


def test_the_teacher_of_a_space_of_ten_to_the_twelve_is_its_largest_and_the_smallest_its_smallest():
    """12 blocks, each its own embedding and width: 10 choices a block (linear, or SNE, P-SNE, F-SNE at 3
    widths). Blocks add their MACs, so the largest configuration is the one whose every block takes the largest
    block: the largest of the configurations whose blocks are alike."""
    from qkvsearch.trainers.model.cost import model_cost

    space = {"depth": 12, "embedding": {"choice": ["linear", "sne", "psne", "fsne"], "per_block": True},
             "hidden_width": {"choice": [0.25, 0.5, 1.0], "per_block": True}, "code_size": 8}
    spec = load_campaign(_spec(space, img=32))
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    alike = []
    for emb in ("linear", "sne", "psne", "fsne"):
        for width in ((None,) if emb == "linear" else (0.25, 0.5, 1.0)):
            keys = {f"embedding.{b}": emb for b in range(12)}
            keys |= {f"hidden_width.{b}": width for b in range(12)} if width else {}
            alike.append(subnet_space(spec).resolve(keys)[1]["gmacs"])
    assert model_cost(plan.teacher)["gmacs"] == max(alike)
    assert model_cost(plan.smallest)["gmacs"] == min(alike)
    rng = np.random.default_rng(0)   # no drawn configuration is larger or smaller
    drawn = [model_cost(subnet_space(spec).draw(rng)[1])["gmacs"] for _ in range(300)]
    assert min(alike) < min(drawn) and max(drawn) < max(alike)


def test_a_space_whose_widths_multiply_is_held_whole_and_no_candidate_is_refused():
    """MLP hidden units are the token dim times the MLP ratio: (128, 1), (64, 4) and (96, 3) need 128, 256 and 288.
    Sized per key (128 x 4 would be the largest of each), the third would not fit; sized per tensor it does."""
    space = ENUMERABLE[2]
    spec = load_campaign(_spec(space))
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    supernet = plan.supernet(seed=0).eval()
    x = torch.randn(2, 3, 16, 16)
    every = candidates(spec)
    assert {(t["config"]["embed_dim"], t["config"]["mlp_ratio"]) for t in every} == {(128, 1), (64, 4), (96, 3)}
    for t in every:
        cfg = t["config"]
        assert supernet.serves(cfg) is None, cfg
        model = build_model(cfg).eval()
        model.load_state_dict(supernet.extract(cfg))
        with torch.no_grad():
            assert (supernet(x, cfg) - model(x)).abs().max().item() == 0.0


def test_students_are_drawn_from_the_whole_space():
    """A space of 10^12: every update's random students are new configurations, each a valid one of the space,
    and over a few hundred draws every block takes every embedding."""
    space = {"depth": 12, "embedding": {"choice": ["linear", "sne", "psne", "fsne"], "per_block": True},
             "hidden_width": {"choice": [0.25, 0.5, 1.0], "per_block": True}, "code_size": 8}
    spec = load_campaign(_spec(space, img=32))
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    sandwich = [c for _, lg, sm in plan.sandwich for c in (lg, sm)]
    drawn = [c for u in range(100) for c in plan.students(u, seed=0) if c not in sandwich]
    assert len({repr(sorted(c.items())) for c in drawn}) == len(drawn) >= 150
    for block in range(12):
        assert {c[f"embedding.{block}"] for c in drawn} == {"linear", "sne", "psne", "fsne"}


def test_a_plan_an_earlier_version_wrote_reads_back_as_it_was_trained():
    """A campaign stopped while its supernet trained (or a supernet taken with supernet.from) holds a plan of an
    earlier version, its candidates listed (tests/fixtures/make_earlier_supernet_plan.py): it builds the same
    tensors, draws the same students, and writes itself back unchanged."""
    import json
    from pathlib import Path

    earlier = json.loads((Path(__file__).parents[1] / "fixtures" / "earlier" / "supernet_plan.json").read_text())
    plan = SupernetPlan.from_dict(earlier["plan"])
    assert plan.as_dict() == earlier["plan"]
    tensors = {k: list(v.shape) for k, v in plan.supernet(init=False).state_dict().items()}
    assert tensors == earlier["tensors"]
    assert [plan.students(u, 0) for u in range(len(earlier["students"]))] == earlier["students"]
