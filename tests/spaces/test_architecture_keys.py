"""The architecture keys (attention, positions, stem, key, macro shape): conditions, nulls, and every
combination that cannot make a model refused by `qkvsearch validate` with exit 2, the field and the reason."""
import pytest
import yaml
from helpers import PRESETS

from qkvsearch.search.cli import main
from qkvsearch.spaces import expand_space, load_campaign
from qkvsearch.spaces.keys import ConfigError, fill

VIT = {"model": "vit_tiny_patch16_224", "epochs": 1, "img_size": 16, "depth": 2, "embed_dim": 32, "num_heads": 2,
       "patch_size": 4}


def _tiny_spec(tmp_path, space: dict, **model) -> str:
    spec = {"name": "arch", "model": {"name": "vit_tiny_patch16_224", "img_size": 16, "num_classes": 10, **model},
            "data": {"dataset": "synthetic"}, "train": {"epochs": 1, "batch_size": 4},
            "space": {"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4, **space},
            "objectives": [{"metric": "top1", "mode": "max"}], "search": {"algorithm": "grid"},
            "resources": {"workers_per_trial": 1}, "storage": str(tmp_path / "results")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


# (space, model section, fragments the message must hold)
INVALID = [
    ({"attention": "fnet", "embedding": "sne"}, {}, ["embedding: expected linear with attention fnet"]),
    ({"attention": "fnet", "key": "manifold"}, {}, ["key: expected shared with attention fnet"]),
    ({"attention": "fnet", "pos_embed": "rope"}, {}, ["pos_embed: expected learned or none with attention fnet"]),
    ({"pos_embed": "rope", "embed_dim": 30, "num_heads": 3}, {}, ["pos_embed", "divisible by 4", "head dim 10"]),
    ({"attention": "linformer", "attn_proj_len": 64}, {}, ["attn_proj_len", "token count 17", "given 64"]),
    ({"attention": "nystrom", "attn_landmarks": 18}, {}, ["attn_landmarks", "token count 17"]),
    ({"embed_dim": 30, "num_heads": 4}, {}, ["num_heads"]),
    ({"attention": "performer"}, {"name": "xcit_nano_12_p8_224"}, ["attention: expected null unless the model is a "
                                                                   "ViT or DeiT"]),
    ({"key": "manifold", "embedding": "fsne"}, {"name": "xcit_nano_12_p8_224", "embed_class_attn": True},
     ["embed_class_attn"]),
    ({"attn_landmarks": 8}, {}, ["attn_landmarks applies only when attention is nystrom"]),
    ({"key_charts": {"choice": [2, 4]}, "key": {"choice": ["shared"]}}, {},
     ["key_charts applies only when key is manifold"]),
]


@pytest.mark.parametrize("space,model,fragments", INVALID, ids=[f[2][0][:40] for f in INVALID])
def test_validate_refuses_what_cannot_make_a_model(tmp_path, capsys, space, model, fragments):
    spec = _tiny_spec(tmp_path, space, **model)
    if model.get("name", "").startswith("xcit"):   # XCiT at its own width (patch 8)
        raw = yaml.safe_load(open(spec))
        for k in ("embed_dim", "num_heads", "patch_size"):
            raw["space"].pop(k)
        open(spec, "w").write(yaml.safe_dump(raw))
    assert main(["validate", spec]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err
    assert not (tmp_path / "results").exists()


def test_architecture_keys_are_null_where_they_do_not_apply():
    xcit = fill({"model": "xcit_nano_12_p8_224", "epochs": 1, "key": "manifold"})
    assert xcit["attention"] is None and xcit["pos_embed"] is None and xcit["patch_embed"] is None
    assert xcit["attn_features"] is None and xcit["key_charts"] == 8 and xcit["key_aggregation"] == "vanilla"
    vit = fill({**VIT, "attention": "performer"})
    assert vit["attn_features"] == 64 and vit["attn_proj_len"] is None and vit["attn_landmarks"] is None
    assert vit["key"] == "shared" and vit["key_charts"] is None and vit["key_context"] is None
    with pytest.raises(ConfigError, match=r"^attn_landmarks: expected null unless attention is nystrom "
                                          r"\(attention is performer\), given 8$"):
        fill({**VIT, "attention": "performer", "attn_landmarks": 8})


def test_conditions_are_implied_on_the_deciding_key(tmp_path):
    spec = load_campaign(_tiny_spec(tmp_path, {
        "attention": {"grid": ["softmax", "nystrom", "performer"]}, "attn_landmarks": {"grid": [4, 8]},
        "key": {"grid": ["shared", "manifold"]}, "key_aggregation": {"grid": ["vanilla", "kua"]}}))
    assert dict(spec.space.dimension("attn_landmarks").when) == {"attention": ("nystrom",)}
    assert dict(spec.space.dimension("key_aggregation").when) == {"key": ("manifold",)}
    trials = expand_space(spec)
    assert len(trials) == (1 + 2 + 1) * (1 + 2)     # no two trials differ only in an ignored key
    assert all(("attn_landmarks" in t) == (t["attention"] == "nystrom") for t in trials)


def test_xformers_preset_grid():
    trials = expand_space(load_campaign(PRESETS / "xformers-cifar10.yaml"))
    combos = {(t["model"], t.get("attention"), t["patch_embed"], t.get("pos_embed", "learned")) for t in trials}
    assert len(trials) == len(combos) == 20
    vit, mixer = "vit_tiny_patch16_224", "mixer_s16_224"
    assert (vit, "fnet", "conv_plain", "learned") in combos and (vit, "fnet", "linear", "rope1d") not in combos
    assert {c for c in combos if c[0] == mixer} == {(mixer, None, s, "learned") for s in ("linear", "conv_plain")}
    shape = ("embed_dim", "depth", "num_heads", "mlp_ratio", "token_mlp_ratio", "patch_size")
    assert {tuple(t.get(k) for k in shape) for t in trials} == {(128, 4, 4, 2.0, None, 1), (128, 4, None, 1.0, 8.0, 1)}


def test_image_size_is_searchable_and_the_token_count_follows_it(tmp_path):
    from qkvsearch.trainers.model.cost import model_cost

    spec = load_campaign(_tiny_spec(tmp_path, {"img_size": {"grid": [16, 32]}, "attention": "linformer",
                                               "attn_proj_len": 16}))
    small, large = sorted(expand_space(spec), key=lambda t: t["img_size"])
    assert (small["img_size"], large["img_size"]) == (16, 32)
    # Linformer's E and F are N x k: 17 tokens at 16 px, 65 at 32 px, two of each per block
    assert model_cost(large)["params"] - model_cost(small)["params"] == 2 * 2 * (65 - 17) * 16 + (65 - 17) * 32
