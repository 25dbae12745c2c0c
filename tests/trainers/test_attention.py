"""trainers.attention: every registered block at two shapes (forward, backward, closed-form params and MACs
against the built module and FlopCounterMode), the linear attentions against exact softmax attention,
and whole models: closed-form cost against direct counting, timm's registry."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat

from qkvsearch.trainers.attention import BLOCKS, Shape
from qkvsearch.trainers.attention.fft import fft_macs, flop_counter
from qkvsearch.trainers.attention.mixers import favor, gaussian_orthogonal, nystrom
from qkvsearch.trainers.cost import measure_cost, model_cost

SHAPES = [  # N = 17 (padded to 24 by 8 landmarks) and N = 50 (padded to 56), patch 1 and patch 2
    Shape(dim=32, heads=4, grid=(4, 4), size=8, patch=1, charts=4, aggregation="vanilla"),
    Shape(dim=48, heads=2, grid=(7, 7), size=7, patch=2, in_chans=1, charts=3, aggregation="kua", context=True),
]
AGGREGATED = [Shape(dim=32, heads=4, grid=(4, 4), charts=4, aggregation=a) for a in ("simple", "spatial")]


def _forward(name, module, x):
    if name == ("pos_embed", "rope"):
        return apply_rot_embed_cat(x, module.get_embed())
    if name == ("pos_embed", "learned"):
        return x + module[0]
    return module(x)


@pytest.mark.parametrize("name", list(BLOCKS), ids="-".join)
@pytest.mark.parametrize("shape", SHAPES, ids=["small", "large"])
def test_block_counts_equal_built_module_and_flop_counter(name, shape):
    block = BLOCKS[name]
    torch.manual_seed(0)
    module = block.build(shape)
    x = block.example(shape).requires_grad_()
    assert sum(p.numel() for p in module.parameters()) == block.params(shape)
    module.eval()
    with torch.no_grad(), flop_counter() as counter:
        _forward(name, module, x)
    assert counter.get_total_flops() // 2 == block.macs(shape)
    module.train()
    y = _forward(name, module, x)
    y.float().square().mean().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("shape", AGGREGATED, ids=lambda s: s.aggregation)
def test_manifold_key_aggregations_count_exactly(shape):
    block = BLOCKS[("key", "manifold")]
    module = block.build(shape)
    assert sum(p.numel() for p in module.parameters()) == block.params(shape)
    with torch.no_grad(), flop_counter() as counter:
        module(block.example(shape))
    assert counter.get_total_flops() // 2 == block.macs(shape)


def test_fft_has_a_cost():
    assert BLOCKS[("attention", "fnet")].macs(SHAPES[0]) == fft_macs((1, 17, 32), (1, 2)) > 0
    assert fft_macs((1, 16, 8), (1, 2)) == round(2.5 * 128 * (4 + 3))


def _qkv(n=40, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, d, generator=g) for _ in range(3)]


def test_linformer_with_identity_projections_is_softmax_attention():
    from qkvsearch.trainers.attention.mixers import XAttention

    attn = XAttention(48, 3, qkv_bias=True, mixer="linformer", size=20, tokens=20).eval()
    with torch.no_grad():
        attn.proj_k.copy_(torch.eye(20))
        attn.proj_v.copy_(torch.eye(20))
    ref = timm.layers.Attention(48, 3, qkv_bias=True).eval()
    ref.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("proj_")}, strict=True)
    x = torch.randn(2, 20, 48)
    torch.testing.assert_close(attn(x), ref(x), atol=1e-5, rtol=1e-5)


def test_nystrom_with_one_landmark_per_token_is_softmax_attention():
    q, k, v = _qkv(n=12, d=8)
    exact = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(nystrom(q, k, v, 12, iters=40), exact, atol=1e-4, rtol=1e-4)  # pinv converged
    assert (nystrom(q, k, v, 12) - exact).abs().mean() < 0.02   # the 6 Newton-Schulz steps used in training
    padded = nystrom(q, k, v, 5)   # 12 tokens padded to 15: finite, the right shape
    assert padded.shape == exact.shape and torch.isfinite(padded).all()


def test_performer_approaches_softmax_attention_as_features_grow():
    q, k, v = (t * 0.5 for t in _qkv(n=32, d=16))
    exact = F.scaled_dot_product_attention(q, k, v)
    errors = []
    for m in (16, 256, 4096):
        torch.manual_seed(1)
        errors.append((favor(q, k, v, gaussian_orthogonal(m, 16)) - exact).abs().mean().item())
    assert errors[2] < errors[0] / 3 and errors[2] < 0.02, errors


TINY = dict(model="vit_tiny_patch16_224", img_size=16, num_classes=10, depth=2, embed_dim=32, num_heads=2,
            patch_size=4)


@pytest.mark.parametrize("extra", [
    dict(attention="performer", attn_features=16),
    dict(attention="linformer", attn_proj_len=8, embedding="psne"),
    dict(attention="nystrom", attn_landmarks=4, pos_embed="rope"),
    dict(attention="fnet", pos_embed="none", patch_embed="conv"),
    dict(key="manifold", key_charts=4, key_aggregation="spatial", embedding="fsne", hidden_width="match"),
    dict(key="manifold", key_aggregation="kua", key_context=True, embedding="sne", attention="nystrom",
         attn_landmarks=5),
    dict(TINY, model="xcit_nano_12_p8_224", embed_dim=None, num_heads=None, patch_size=None, key="manifold",
         embedding="psne"),
    dict(embed_dim=48, num_heads=3, mlp_ratio=2.0, depth=3, embedding="sne", hidden_width="match"),
], ids=lambda e: "-".join(str(v) for v in e.values())[:60])
def test_model_cost_equals_direct_count(extra):
    cfg = {**TINY, **extra}
    assert model_cost(cfg) == measure_cost(cfg)


def test_macro_shape_reaches_timm_and_the_matched_width_follows_it():
    small, wide = model_cost({**TINY, "embedding": "sne", "hidden_width": "match"}), \
        model_cost({**TINY, "embed_dim": 64, "embedding": "sne", "hidden_width": "match"})
    assert wide["width"] > small["width"] and wide["params"] > 2 * small["params"]
    linear = model_cost({**TINY, "embed_dim": 64})
    assert wide["params"] <= linear["params"]
    with torch.device("meta"):
        ref = timm.create_model("vit_tiny_patch16_224", img_size=16, num_classes=10, depth=2, embed_dim=64,
                                num_heads=2, patch_size=4)
    assert linear["params"] == sum(p.numel() for p in ref.parameters())


def test_registered_timm_entrypoint_takes_architecture_keys():
    import qkvsearch  # noqa: F401  (registers qkv_*)

    model = timm.create_model("qkv_vit_tiny_patch16_224", attention="nystrom", attn_landmarks=4, key="manifold",
                              embedding="psne", img_size=16, num_classes=10, depth=2, embed_dim=32, num_heads=2,
                              patch_size=4)
    assert type(model.blocks[0].attn).__name__ == "XAttention" and model.blocks[0].attn.mixer == "nystrom"
    assert type(model.blocks[0].attn.qkv).__name__ == "KeyedQKV"
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10) and math.isfinite(out.sum().item())
