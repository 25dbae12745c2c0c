"""The q/k/v embedding on any timm transformer (trainers.model.sites, trainers.model.hosts.Timm): the coverage page
agrees with a fresh probe, one model of each family counts, trains and loads timm's weights, and what a family
cannot take is refused by name."""
import json

import pytest
import timm
import torch
import torch.nn.functional as F
import yaml
from helpers import PRESETS, REPO
from helpers.small_hosts import FAMILY_MODELS, timm_kwargs

from qkvsearch.search.cli import main
from qkvsearch.spaces.keys import EMBEDDINGS, ConfigError
from qkvsearch.trainers import build_model
from qkvsearch.trainers.model.cost import count_macs, model_cost
from qkvsearch.trainers.model.coverage import BUILT, REFUSED, probe
from qkvsearch.trainers.model.models import find_sites

COVERAGE = json.loads((REPO / "docs" / "pages" / "hosts-coverage.json").read_text())
ROWS = {r["model"]: r for r in COVERAGE["rows"] if "scope" not in r}
# a family of each kind of site and each kind of refusal, probed afresh on its quickest entrypoint of the page
PROBED = ("vision_transformer", "swin_transformer", "twins", "crossvit", "cait", "beit", "convit", "levit",
          "naflexvit", "volo", "maxxvit")


def _quickest(module: str) -> str:
    return min((r for r in ROWS.values() if r["module"] == module and "timed_out" not in r),
               key=lambda r: r["seconds"])["model"]


def test_the_coverage_page_was_probed_with_this_timm_and_found_no_crash():
    assert COVERAGE["versions"]["timm"] == timm.__version__   # a newer timm: run benchmarks/probe_hosts.py again
    summary = COVERAGE["summary"]
    assert summary["crashed"] == summary["counts_differ"] == summary["timed_out"] == 0
    assert summary["scanned"] == len(COVERAGE["rows"]) and summary["probed"] == len(ROWS) > 100
    timm_own = [n for n in timm.list_models() if timm.models.model_entrypoint(n).__module__.startswith("timm.")]
    assert summary["entrypoints"] == len(timm_own)   # the page counts this timm's entrypoints, scanned or not yet
    assert summary["sne"]["built"] > summary["probed"] * 0.7


@pytest.mark.parametrize("module", PROBED)
def test_a_fresh_probe_agrees_with_the_coverage_page(module):
    name = _quickest(module)
    fresh, recorded = probe(name), ROWS[name]
    assert (fresh["adapters"], fresh["unserved"]) == (recorded["adapters"], recorded["unserved"])
    for e in EMBEDDINGS:
        assert fresh[e]["status"] == recorded[e]["status"], (e, fresh[e])
        if fresh[e]["status"] == BUILT:
            assert fresh[e]["counts_equal"] and fresh[e]["params"] == recorded[e]["params"], e
        else:
            assert fresh[e]["why"] == recorded[e]["why"] and name in fresh[e]["why"], e


def _refused_across(module: str, embedding: str) -> bool:
    """Whether the page records ``embedding`` refused on every entrypoint of ``module``."""
    return all(r[embedding]["status"] == REFUSED for r in ROWS.values() if r["module"] == module)


@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_each_family_counts_exactly_trains_and_loads_timms_weights(family, tmp_path):
    base, size = FAMILY_MODELS[family], FAMILY_MODELS[family]["img_size"]
    x, y = torch.randn(4, 3, size, size), torch.tensor([0, 1, 2, 3])
    # linear is timm's model: a state dict saved from timm's own loads strictly, and the forward is the same
    torch.manual_seed(0)
    ours, ref = build_model({**base, "num_classes": 10}), timm.create_model(**timm_kwargs(family), num_classes=10)
    torch.save(ref.state_dict(), tmp_path / "timm.pt")
    ours.load_state_dict(torch.load(tmp_path / "timm.pt"), strict=True)
    with torch.no_grad():
        assert torch.equal(ours.eval()(x), ref.eval()(x))
    for embedding in EMBEDDINGS:
        cfg = {**base, "embedding": embedding, "num_classes": 10}
        try:
            cost = model_cost(cfg)
        except ConfigError as err:   # what the family refuses, it refuses on every entrypoint the page probed
            assert str(err).startswith("embedding:") and _refused_across(family, embedding), str(err)
            continue
        torch.manual_seed(0)
        model = build_model(cfg)
        assert sum(p.numel() for p in model.parameters()) == cost["params"], embedding
        assert count_macs(model, 3, size) == round(cost["gmacs"] * 1e9), embedding
        # training steps on the CPU; from the second on, every weight of the embedding has a gradient (the first
        # reaches no attention where timm zeroes a residual branch at init: Swin V2's post-norms, LeViT's BatchNorm;
        # a bias may have none for good: a BatchNorm after the map, as LeViT's, cancels it)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        embedded = [p for s in find_sites(model) if not s.class_attn for m in s.maps
                    for p in model.get_submodule(f"{s.path}.{m.child}").parameters() if p.dim() > 1]
        for _ in range(2):
            opt.zero_grad()
            loss = F.cross_entropy(model.train()(x), y)
            loss.backward()
            opt.step()
            assert torch.isfinite(loss), embedding
        assert embedded and all(p.grad is not None and p.grad.abs().sum() > 0 for p in embedded), embedding


SWIN = FAMILY_MODELS["swin_transformer"]


@pytest.mark.parametrize("change,message", [
    (dict(depth=2), "depth: expected null for model swin_pico_patch2_window4_32 (a swin_transformer model: its "
                    "shape is its entrypoint's"),
    (dict(attention="performer"), "attention: expected softmax for model swin_pico_patch2_window4_32"),
    (dict(pos_embed="rope"), "pos_embed: expected learned for model swin_pico_patch2_window4_32"),
    (dict(patch_embed="conv"), "patch_embed: expected linear for model swin_pico_patch2_window4_32"),
    (dict(key="manifold"), "key: expected shared for model swin_pico_patch2_window4_32 (the manifold key is "
                           "installed in the fused qkv of a ViT, DeiT or XCiT)"),
    ({"embedding.0": "sne"}, "embedding.0: expected null for model swin_pico_patch2_window4_32 (it has no q/k/v "
                             "site in timm's blocks.0"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_what_a_timm_host_cannot_take_is_refused_by_name(change, message):
    for count in (model_cost, build_model):
        with pytest.raises(ConfigError) as err:
            count({**SWIN, "embedding": "sne", **change})
        assert str(err.value).startswith(message), str(err.value)


def test_a_blocks_own_precision_is_refused_where_timm_has_no_such_block():
    with pytest.raises(ConfigError, match=r"^quant_qkv\.0: expected null for model swin_pico_patch2_window4_32 \(it "
                                          r"has its blocks in stages"):
        model_cost({**SWIN, "embedding": "sne", "quant_qkv.0": "int8_dynamic"})


def test_a_quantization_policy_reaches_every_part_of_a_timm_host():
    from qkvsearch.trainers.model.quantize import part_linears, quantize_model

    cfg = {**SWIN, "embedding": "psne", "num_classes": 10}
    model = build_model(cfg).eval()
    parts = part_linears(model)
    assert len(parts["quant_qkv"]) == 4 * 2 and len(parts["quant_proj"]) == 4 and len(parts["quant_mlp"]) == 8
    quantize_model(model, {**cfg, "quant_qkv": "int8_dynamic", "quant_mlp": "int8_weight_only"}, "cpu")
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))).all()


def _campaign(tmp_path, **change) -> str:
    spec = yaml.safe_load((PRESETS / "swin-digits.yaml").read_text())
    spec |= {"storage": str(tmp_path / "results"), **change}
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize("change,message", [
    (dict(model={"name": "test_small_levit", "img_size": 128, "num_classes": 10}),
     'expected linear or sne for model test_small_levit (at stages.0.blocks.0.attn'),
    (dict(model={"name": "coatnet_nano_rw_224", "img_size": 32, "num_classes": 10}),
     "model.name: expected a timm model whose attention makes q, k and v by linear maps of its tokens (at stages.2"),
    (dict(supernet={"train": {"epochs": 1}}), "supernet: expected a campaign on a ViT, DeiT, XCiT or MLP-Mixer"),
], ids=["embedding", "model", "supernet"])
def test_validate_refuses_what_a_host_cannot_take_with_exit_2_and_no_traceback(tmp_path, capsys, change, message):
    assert main(["validate", _campaign(tmp_path, **change)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists()


def test_the_swin_preset_is_the_four_embeddings_on_a_two_stage_swin():
    from qkvsearch.spaces import expand_space, load_campaign
    from qkvsearch.trainers.model.cost import resolve_trial

    trials = [resolve_trial(t)[0] for t in expand_space(load_campaign("swin-digits"))]
    assert [t["embedding"] for t in trials] == list(EMBEDDINGS)
    assert [t["width"] for t in trials] == [0, 16, 24, 32]   # the paper's ratios of the first stage's d = 32
    model = build_model(trials[3])
    widths = {m.hidden for m in model.modules() if type(m).__name__ == "FSNE"}
    assert widths == {32, 64}   # and of the second stage's d = 64
