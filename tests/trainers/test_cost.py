"""model_cost: the paper's parameter counts and MACs, the closed form against direct counting, speed."""

import pytest
import timm
import torch

from qkvsearch.trainers.model.cost import measure_cost, model_cost

S = dict(model="xcit_nano_12_p16_224", img_size=224, num_classes=1000)  # the paper's size S (d = 128)


@pytest.mark.parametrize("variant,printed", [
    (dict(embedding="linear"), 3.1),  # XCiT-N12
    (dict(embedding="sne"), 3.1),
    (dict(embedding="psne"), 3.1),
    (dict(embedding="fsne", code_size=8), 2.9),
    (dict(embedding="fsne", code_size=16), 2.9),
    (dict(embedding="fsne", code_size=8, hidden_width="match"), 3.1),  # F-SNE-C8*
])
def test_paper_parameter_counts_size_s(variant, printed):
    assert round(model_cost({**S, **variant})["params_m"], 1) == printed


def test_linear_baseline_is_timm_count_exactly():
    with torch.device("meta"):
        ref = timm.create_model("xcit_nano_12_p16_224", num_classes=1000)
    cost = model_cost({**S, "embedding": "linear"})
    assert cost["params"] == sum(p.numel() for p in ref.parameters()) == 3_053_224
    assert cost["embed_params"] == 12 * (128 * 384 + 384)  # the XCA blocks' qkv
    assert cost["width"] == 0


@pytest.mark.parametrize("model,gmacs", [
    ("xcit_tiny_12_p16_224", 1.2), ("xcit_small_12_p16_224", 4.8),
])
def test_paper_macs(model, gmacs):
    assert round(model_cost({"model": model, "img_size": 224, "num_classes": 1000})["gmacs"], 1) == gmacs


def test_nano_macs():
    assert model_cost(S)["gmacs"] == pytest.approx(0.55, abs=0.01)


def test_fsne_macs_and_params_by_hand():
    """F-SNE-C8 at S: per XCA block and token d·h + 3·h·d MACs instead of 3·d², plus 3·n·h for codes."""
    d, h, n, tokens = 128, 128, 8, 196
    base, fsne = model_cost(S), model_cost({**S, "embedding": "fsne", "code_size": n})
    extra = 12 * (tokens * (d * h + 3 * h * d - 3 * d * d) + 3 * n * h)
    assert round((fsne["gmacs"] - base["gmacs"]) * 1e9) == extra
    assert fsne["embed_params"] == 12 * ((d + n) * h + h + h * d + d) + 3 * n  # codes counted once


def test_sharing_counts_codes_once():
    shared = model_cost({**S, "embedding": "fsne"})
    per_block = model_cost({**S, "embedding": "fsne", "code_sharing": "per_block"})
    assert per_block["params"] - shared["params"] == 3 * 8 * 11


@pytest.mark.parametrize("cfg", [
    dict(S, img_size=64, embedding="linear"),
    dict(S, img_size=64, embedding="sne", hidden_width=0.3),
    dict(S, img_size=64, embedding="psne", activation="gelu"),
    dict(S, img_size=64, embedding="fsne", code_size=16, hidden_width="match"),
    dict(S, img_size=64, embedding="fsne", code_sharing="per_block", embed_class_attn=True),
    dict(S, img_size=64, embedding="linear", embed_class_attn=True),
    dict(model="vit_tiny_patch16_224", img_size=64, num_classes=10, in_chans=1, embedding="fsne"),
    dict(model="deit_tiny_patch16_224", embedding="sne"),  # timm's default size (224)
], ids=lambda c: f"{c['model']}-{c['embedding']}")
def test_closed_form_equals_direct_count(cfg):
    assert model_cost(cfg) == measure_cost(cfg)


def test_cost_ignores_training_keys():
    cfg = {**S, "embedding": "fsne", "hidden_width": "match", "lr": 0.1, "epochs": 3, "dataset": "digits"}
    for width in range(100, 104):
        assert model_cost({**cfg, "hidden_width": width}) == model_cost({**S, "embedding": "fsne",
                                                                          "hidden_width": width})


def test_cost_bad_input_names_field():
    with pytest.raises(ValueError, match="code_size"):
        model_cost({**S, "embedding": "psne", "code_size": 8})
    with pytest.raises(ValueError, match="model"):
        model_cost({"embedding": "sne"})
