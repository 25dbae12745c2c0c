"""The shipped presets: they load, and the paper grids are exactly the paper's variants and widths."""
import csv

import pytest
from helpers import REPO

from qkvsearch.spaces import base_config, expand_space, list_presets, load_campaign, smoke_test

REFERENCE = REPO / "results" / "reference" / "sne_paper_imagenet.csv"
SIZES = {"s": ("xcit_nano_12_p16_224", 128, 4096), "m": ("xcit_tiny_12_p16_224", 192, 2816),
         "l": ("xcit_small_12_p16_224", 384, 1280)}
TABLE1 = {"s": {"sne": 64, "psne": 96, "fsne": 128}, "m": {"sne": 96, "psne": 144, "fsne": 192},
          "l": {"sne": 192, "psne": 288, "fsne": 384}}


def reference_rows(size: str) -> list[tuple]:
    """(embedding, code_size or None, param_matched) for one size of the paper's table."""
    lines = [ln for ln in REFERENCE.read_text().splitlines() if ln and not ln.startswith("#")]
    rows = csv.DictReader(lines)
    return sorted((r["embedding"], int(r["code_size"]) if r["code_size"] else None, r["param_matched"] == "true")
                  for r in rows if r["size"] == size.upper())


def variant_rows(trials: list[dict]) -> list[tuple]:
    return sorted((t["embedding"], t.get("code_size"), t.get("hidden_width") == "match") for t in trials)


def test_presets_present():
    assert set(list_presets()) >= {"quickstart", "paper-s", "paper-m", "paper-l", "code-size", "pareto-s"}


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_loads_round_trips_and_smokes(name):
    spec = load_campaign(name)
    assert spec.name == name and spec.objectives
    assert load_campaign(spec.to_dict()) == spec
    small = smoke_test(spec)
    assert small.search.num_trials <= 4 and small.train.epochs <= 2 and small.train.max_steps_per_epoch == 2


@pytest.mark.parametrize("size", SIZES)
def test_paper_grid_is_exactly_the_papers_variants(size):
    model, d, batch = SIZES[size]
    spec = load_campaign(f"paper-{size}")
    trials = expand_space(spec)
    assert variant_rows(trials) == reference_rows(size)
    assert spec.search.algorithm == "grid" and spec.search.num_trials == len(trials)
    for t in trials:
        assert t["model"] == model and t["batch_size"] == batch and t["epochs"] == 400 and t["lr"] == 5e-4
        assert t["warmup_epochs"] == 5 and t["dataset"] == "imagefolder" and t["img_size"] == 224
        assert ("code_size" in t) == (t["embedding"] == "fsne")
        # Table 1 widths as ratios of d: sne d/2, psne 3d/4, fsne d; starred models are param-matched.
        if t["embedding"] != "linear" and t["hidden_width"] != "match":
            assert t["hidden_width"] * d == TABLE1[size][t["embedding"]]
    assert spec.resources.workers_per_trial * spec.resources.gpus_per_worker == 8


@pytest.mark.parametrize("size", SIZES)
def test_paper_widths_resolve_to_table_1(size):
    from qkvsearch.trainers.model.cost import model_cost

    _model, d, _batch = SIZES[size]
    for t in expand_space(load_campaign(f"paper-{size}")):
        width = model_cost(t)["width"]
        if t["embedding"] == "linear":
            continue
        if t["hidden_width"] == "match":  # C8*, C16*: widened until the model matches XCiT's parameters
            assert width > d, t
        else:
            assert width == TABLE1[size][t["embedding"]], t


def test_every_preset_configuration_resolves_to_a_trial():
    from qkvsearch.trainers.model.cost import resolve_trial

    for name in list_presets():
        spec = load_campaign(name)
        for cfg in expand_space(spec) if spec.space.enumerable else [base_config(spec)]:
            config, cost = resolve_trial(cfg)
            assert config["width"] >= 0 and cost["params"] > 0, cfg


def test_code_size_preset_covers_every_size():
    trials = expand_space(load_campaign("code-size"))
    got = sorted((t["model"], t["code_size"], t["batch_size"]) for t in trials)
    assert got == sorted((m, c, b) for m, _d, b in SIZES.values() for c in (8, 16, 32, 64))
    assert all(t["embedding"] == "fsne" and t["hidden_width"] == 1.0 for t in trials)


def test_pareto_s_is_an_open_constrained_search():
    spec = load_campaign("pareto-s")
    assert spec.search.algorithm == "nsga2" and spec.scheduler.type == "moasha"
    assert [(c.metric, c.max) for c in spec.constraints] == [("params_m", 4.0)]
    assert {o.metric for o in spec.objectives} == {"top1", "gmacs", "params_m"}
    assert dict(spec.space.dimension("code_sharing").when) == {"embedding": ("fsne",)}
    assert len(expand_space(spec)) == 1 + 4 + 4 + 4 * 4 * 2   # the space NSGA-II samples from


def test_quickstart_fits_a_laptop():
    spec = load_campaign("quickstart")
    assert spec.data.dataset == "digits" and spec.model.img_size == 32
    assert len(spec.objectives) >= 2
    variants = [dict(v) for v in spec.space.variants]
    assert variants[0] == {"embedding": "linear"}  # the baseline: the first result at each rung goes on
    assert {v["embedding"] for v in variants} == {"linear", "sne", "psne", "fsne"}
    assert spec.resources.gpus_per_worker == 0 and spec.resources.max_concurrent_trials == 1
    assert spec.resources.workers_per_trial * spec.resources.cpus_per_worker <= 2
    steps = spec.search.num_trials * spec.train.epochs * spec.train.max_steps_per_epoch
    assert steps <= 100 and spec.train.batch_size == 64


def test_quickstart_model_is_small():
    trainers = pytest.importorskip("qkvsearch.trainers", reason="trainers.build_model not available")
    torch = pytest.importorskip("torch")
    spec = load_campaign("quickstart")
    cfg = {**base_config(spec), "embedding": "fsne", "hidden_width": "match", "code_size": 16}
    model = trainers.build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) < 4e6
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_xformers_preset_is_the_papers_grid():
    """Every configuration of the preset is one of the Vision X-formers paper's designs at its size, and every
    row of its Tables 1 and 6 is one of them (the counts by the paper's rule: tests/trainers/test_paper_counts.py)."""
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.model.paper_counts import paper_row, reference_rows

    rows = [paper_row(fill(t)) for t in expand_space(load_campaign("xformers-cifar10"))]
    assert all(r is not None for r in rows)
    assert sorted(map(id, rows)) == sorted(map(id, reference_rows()))


def test_architecture_open_is_an_nsga2_search_over_the_design_under_a_budget():
    spec = load_campaign("architecture-open")
    assert spec.search.algorithm == "nsga2" and [(c.metric, c.max) for c in spec.constraints] == [("params_m", 3.0)]
    keys = {d.key for d in spec.space.dimensions if d.kind != "choice" or len(d.values) > 1}
    assert {"key", "attention", "pos_embed", "patch_embed", "depth", "embed_dim"} <= keys
    assert dict(spec.space.dimension("key_charts").when) == {"key": ("manifold",)}
