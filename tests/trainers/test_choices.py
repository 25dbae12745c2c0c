"""The registries (trainers.model.choices): every registered choice of every key builds, counts its parameters
and MACs exactly as the built module has and FlopCounterMode counts them (FFTs by trainers.model.attention.fft's
convention), trains a forward+backward step, and its registry holds exactly the names spaces checks."""
from dataclasses import replace

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from qkvsearch.spaces import choices as tables
from qkvsearch.spaces.keys import KEYS, model_family
from qkvsearch.trainers.model.attention.fft import flop_counter
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.choices import EMBEDDINGS, FAMILIES, MIXERS, POSITIONS, STEMS
from qkvsearch.trainers.model.choices import KEY_TYPES as KEY_CLASSES
from qkvsearch.trainers.model.cost import measure_cost, model_cost
from qkvsearch.trainers.model.embeddings import make_codes

REGISTRIES = {"embedding": EMBEDDINGS, "attention": MIXERS, "pos_embed": POSITIONS, "patch_embed": STEMS,
              "key": KEY_CLASSES}
# N = 17 (padded to 24 by 8 landmarks) and N = 50 (padded to 56); patch 1 and 2; with and without biases
SHAPES = [
    Shape(dim=32, heads=4, grid=(4, 4), size=8, patch=1),
    Shape(dim=48, heads=2, grid=(7, 7), size=7, patch=2, in_chans=1, qkv_bias=False, proj_bias=False,
          stem_bias=False),
]
SHAPE_IDS = ["small", "large"]


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _macs(fn, *args) -> int:
    with torch.no_grad(), flop_counter() as counter:
        fn(*args)
    return counter.get_total_flops() // 2


def _trains(module, y_fn, x):
    """One forward+backward step: finite output and gradients for the input and every parameter used."""
    module.train()
    x = x.clone().requires_grad_()
    y = y_fn(x)
    y.float().square().mean().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    assert all(p.grad is not None for p in module.parameters()), "a parameter takes no part in the step"


@pytest.mark.parametrize("key", list(REGISTRIES))
def test_each_registry_holds_exactly_the_names_spaces_checks(key):
    registry = REGISTRIES[key]
    assert list(registry) == list(tables.TABLES[key]) == list(KEYS[key].check.options)
    for name in registry:
        assert isinstance(registry[name], type), name
    with pytest.raises(ValueError, match=f'^{key}: expected one of .*given "nope"'):
        registry["nope"]
    declared = {"attention": ("layer", "qkv_projections"), "key": ("build", "install"),   # what the model and its
                "embedding": ("build", "linear_form", "tensor_parts")}.get(key, ())          # cost call on a class
    assert all(callable(getattr(registry[name], m, None)) for name in registry for m in declared), key


def test_the_model_families_resolve_and_are_told_by_name():
    assert list(FAMILIES) == list(tables.FAMILIES)
    assert {f: FAMILIES[f].__name__ for f in FAMILIES} == {"vit": "ViT", "xcit": "XCiT", "mixer": "Mixer",
                                                           "timm": "Timm"}
    assert [model_family(m) for m in ("vit_tiny_patch16_224", "qkv_xcit_nano_12_p16_224", "mixer_s16_224",
                                       "deit_small_patch16_224")] == ["vit", "xcit", "mixer", "vit"]


def _rotations():
    """Every positions class that rotates, and None (no rotation)."""
    return [None] + [n for n, c in tables.POSITION_CHOICES.items() if c.rotary]


MIXER_CASES = [(m, r) for m in MIXERS for r in _rotations()
               if r is None or "pos_embed" not in {n.key for n in tables.ATTENTION_CHOICES[m].needs}]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("name,rotation", MIXER_CASES, ids=[f"{m}-{r or 'plain'}" for m, r in MIXER_CASES])
def test_every_attention_counts_exactly_and_trains(name, rotation, shape):
    cls = MIXERS[name]
    s = replace(shape, rotary=rotation is not None)
    cls.check(s, name)
    torch.manual_seed(0)
    layer = cls.layer(s, POSITIONS[rotation] if rotation else None)
    module = layer(s.dim, num_heads=s.heads, qkv_bias=s.qkv_bias, proj_bias=s.proj_bias)
    x = torch.randn(1, s.tokens, s.dim)
    assert _params(module) == cls.params(s)
    module.eval()
    assert _macs(module, x) == cls.macs(s)
    qkv = getattr(module, "qkv", None)
    assert (qkv is not None) == cls.fused_qkv
    projections = [qkv] if qkv is not None else getattr(module, "qkv_projections", list)()
    assert sum(_params(p) for p in projections) == cls.qkv_params(s)
    _trains(module, module, torch.randn(2, s.tokens, s.dim))


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("name", list(POSITIONS))
def test_every_position_counts_exactly_and_trains(name, shape):
    """Counted against timm's ViT given the class's pos_embed (the learned table) and its rotation."""
    cls = POSITIONS[name]
    cls.check(shape, name)

    def vit(pos_embed):
        return VisionTransformer(img_size=shape.img, patch_size=shape.patch, in_chans=shape.in_chans,
                                 embed_dim=shape.dim, depth=1, num_heads=shape.heads, pos_embed=pos_embed)

    assert _params(vit(cls.timm_pos_embed)) - _params(vit("none")) == cls.params(shape)
    rotation = cls.rotation(shape.head_dim, shape.grid, shape.prefix, shape.tokens)
    assert (rotation is not None) == tables.POSITION_CHOICES[name].rotary
    if rotation is None:
        assert cls.macs(shape) == 0
        return
    q, k = (torch.randn(2, shape.heads, shape.tokens, shape.head_dim) for _ in range(2))
    assert _params(rotation) == cls.params(shape) == 0 and _macs(rotation, q, k) == cls.macs(shape) == 0
    qr, kr = rotation(q, k)
    assert qr.shape == q.shape and torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)   # a rotation
    assert not torch.allclose(qr, q)
    _trains(rotation, lambda t: sum(rotation(t, t)), q)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("name", list(STEMS))
def test_every_stem_counts_exactly_and_trains(name, shape):
    cls = STEMS[name]
    cls.check(shape, name)
    module = cls(shape.img, shape.patch, shape.in_chans, shape.dim, bias=shape.stem_bias)
    x = torch.randn(1, shape.in_chans, shape.img, shape.img)
    assert _params(module) == cls.params(shape)
    module.eval()
    assert _macs(module, x) == cls.macs(shape)
    assert module(x).shape == (1, shape.patches, shape.dim)
    _trains(module, module, torch.randn(2, shape.in_chans, shape.img, shape.img))


KEY_CASES = [(n, a) for n in KEY_CLASSES for a in (KEYS["key_aggregation"].check.options if n == "manifold"
                                                    else ("vanilla",))]


@pytest.mark.parametrize("name,aggregation", KEY_CASES, ids=[f"{n}-{a}" for n, a in KEY_CASES])
def test_every_key_counts_exactly_and_trains(name, aggregation):
    cls = KEY_CLASSES[name]
    s = Shape.of_tokens(32, 17, charts=4, aggregation=aggregation, context=aggregation == "kua")
    module = cls.build(s)
    if module is None:   # the shared key: the embedding makes it
        assert cls.parts == 3 and cls.params(s) == cls.macs(s) == 0
        return
    x = torch.randn(1, s.tokens, s.dim)
    assert cls.parts == 2 and _params(module) == cls.params(s)
    module.eval()
    assert _macs(module, x) == cls.macs(s)
    _trains(module, module, torch.randn(2, s.tokens, s.dim))


@pytest.mark.parametrize("parts", [3, 2])
@pytest.mark.parametrize("name", list(EMBEDDINGS))
def test_every_embedding_counts_exactly_and_trains(name, parts):
    cls, dim, hidden, dim_out, n, tokens = EMBEDDINGS[name], 24, 16, 20, 4, 11
    codes = make_codes(n, parts)   # network-wide codes: owned apart, counted once (trainers.model.models)
    module = cls.build(dim, hidden, dim_out, "gelu", n, codes, parts)
    own = {id(codes)}
    assert sum(p.numel() for p in module.parameters() if id(p) not in own) == cls.params(dim, hidden, dim_out, n, parts)
    x = torch.randn(1, tokens, dim)
    module.eval()
    assert _macs(module, x) == cls.macs(dim, hidden, tokens, dim_out, n, parts)
    assert module(x).shape == (1, tokens, parts * dim_out)
    _trains(module, module, torch.randn(2, tokens, dim))


TINY = dict(model="vit_tiny_patch16_224", img_size=16, num_classes=10, depth=2, embed_dim=32, num_heads=2,
            patch_size=4)
SIZES = {"attn_features": 8, "attn_proj_len": 8, "attn_landmarks": 4}


def _whole_models():
    """One tiny model per registered value of every key, and per family."""
    cases = [{**TINY, "attention": a, **({k: SIZES[k]} if (k := tables.ATTENTION_CHOICES[a].size_key) else {})}
             for a in MIXERS]
    cases += [{**TINY, "pos_embed": p} for p in POSITIONS] + [{**TINY, "patch_embed": p} for p in STEMS]
    cases += [{**TINY, "key": k, "key_charts": 2 if k == "manifold" else None} for k in KEY_CLASSES]
    cases += [{**TINY, "embedding": e} for e in EMBEDDINGS]
    cases += [dict(model="xcit_nano_12_p8_224", img_size=16, num_classes=10, depth=1, embedding="psne"),
              dict(TINY, model="mixer_s16_224", num_heads=None, token_mlp_ratio=1.5, patch_embed="conv_plain")]
    return cases


@pytest.mark.parametrize("cfg", _whole_models(), ids=lambda c: "-".join(str(v) for k, v in c.items()
                                                                        if k not in TINY or c[k] != TINY[k]))
def test_every_choice_in_a_whole_model_costs_what_its_classes_count(cfg):
    assert model_cost(cfg) == measure_cost(cfg)
