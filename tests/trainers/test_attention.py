"""trainers.model.attention: the methods against what they reduce to or reproduce (Linformer with E = F = I and
Nyström with a landmark per token are softmax attention, Performer approaches it; the Vision X-formers
paper's RoPE, Linformer and stem as its code computes them), and whole models: closed-form cost against
direct counting, timm's registry. Each registered class's own counts: tests/trainers/test_choices.py."""
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

from qkvsearch.trainers.model.attention.fft import fft_macs
from qkvsearch.trainers.model.attention.linformer import Linformer
from qkvsearch.trainers.model.attention.linformer_shared_kv import LinformerSharedKV, LinformerSharedKVHeads
from qkvsearch.trainers.model.attention.nystrom import nystrom
from qkvsearch.trainers.model.attention.performer import favor, gaussian_orthogonal
from qkvsearch.trainers.model.attention.positions import Rope1d, SequenceRotation
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.attention.stems import PlainConvStem
from qkvsearch.trainers.model.choices import MIXERS
from qkvsearch.trainers.model.cost import measure_cost, model_cost


def test_fft_has_a_cost():
    s = Shape(dim=32, heads=4, grid=(4, 4))
    assert MIXERS["fnet"].macs(s) == fft_macs((1, 17, 32), (1, 2)) > 0
    assert fft_macs((1, 16, 8), (1, 2)) == round(2.5 * 128 * (4 + 3))


def _qkv(n=40, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, d, generator=g) for _ in range(3)]


def test_linformer_with_identity_projections_is_softmax_attention():
    attn = Linformer.layer(Shape(48, 3, grid=(1, 20), prefix=0, size=20))(48, 3, qkv_bias=True).eval()
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




def _rotate_every_two(x):
    """The paper's code: pairs (x0, x1) -> (-x1, x0), (x2, x3) -> (-x3, x2), ..."""
    x1, x2 = x.view(*x.shape[:-1], -1, 2).unbind(-1)
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _paper_rope(t: torch.Tensor) -> torch.Tensor:
    """The Vision X-formers code's rotation of (B, h, N, dh): positions 0..N-1, inv_freq over dh, base 10000,
    sin and cos each repeated twice in place."""
    n, d = t.shape[-2:]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angles = torch.einsum("i,j->ij", torch.arange(n).float(), inv_freq)
    sin, cos = (f(angles).repeat_interleave(2, -1) for f in (torch.sin, torch.cos))
    return t * cos + _rotate_every_two(t) * sin


def test_rope1d_is_the_papers_rotation_class_token_at_position_0():
    q, k = torch.randn(2, 4, 1025, 32), torch.randn(2, 4, 1025, 32)
    rot = Rope1d.rotation(32, (32, 32), 1, 1025)
    assert isinstance(rot, SequenceRotation) and not list(rot.state_dict())   # nothing to checkpoint
    qr, kr = rot(q, k)
    torch.testing.assert_close(qr, _paper_rope(q))
    torch.testing.assert_close(kr, _paper_rope(k))
    torch.testing.assert_close(qr[:, :, 0], q[:, :, 0])   # the class token: angle 0
    # relative: q_i·k_j depends on i - j only
    a = torch.randn(32)
    one = rot(a.expand(1, 1, 1025, 32), a.expand(1, 1, 1025, 32))[0][0, 0]
    assert torch.allclose(one[3] @ one[5], one[10] @ one[12], atol=1e-3)


@pytest.mark.parametrize("rotary", [False, True], ids=["learned", "rope1d"])
def test_linformer_shared_kv_is_the_papers_linformer(rotary):
    """lucidrains' LinformerSelfAttention(share_kv=True, one_kv_head=True) as the paper used it, written out:
    keys = values = one head from one projection, E projects both, every query head attends to them."""
    torch.manual_seed(0)
    d, h, n, k = 32, 4, 17, 8
    s = Shape(d, h, grid=(4, 4), prefix=1, size=k, rotary=rotary, qkv_bias=False)
    attn = LinformerSharedKV.layer(s, Rope1d if rotary else None)(d, h, qkv_bias=False).eval()
    assert attn.kv.out_features == d // h and attn.proj_kv.shape == (n, k)
    x = torch.randn(2, n, d)
    queries = (x @ attn.q.weight.T).view(2, n, h, d // h).transpose(1, 2)         # (B, h, N, dh)
    kv = (x @ attn.kv.weight.T).unsqueeze(1)                                       # (B, 1, N, dh)
    keys = kv
    if rotary:
        queries, keys = _paper_rope(queries), _paper_rope(kv)
    values = kv                                              # the paper's code takes them before rotating the keys
    keys, values = (torch.einsum("bhnd,nk->bhkd", t, attn.proj_kv) for t in (keys, values))
    dots = torch.einsum("bhnd,bhkd->bhnk", queries, keys.expand(-1, h, -1, -1)) * (d // h) ** -0.5
    out = torch.einsum("bhnk,bhkd->bhnd", dots.softmax(-1), values.expand(-1, h, -1, -1))
    ref = attn.proj(out.transpose(1, 2).reshape(2, n, d))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)


class _PaperViLRoPEAttention(nn.Module):
    """lucidrains' LinformerSelfAttention as the paper's ViLRoPE.py builds it (share_kv=True, one_kv_head=False,
    no bias on to_q and to_k), transcribed: keys and values are one projection d -> d; the keys are rotated in
    their heads and merged back, the values taken before; one E (proj_k) projects both along the sequence."""

    def __init__(self, dim: int, seq_len: int, k: int, heads: int):
        super().__init__()
        self.heads, self.k = heads, k
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.proj_k = nn.Parameter(torch.zeros(seq_len, k))
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, rotary: bool):
        b, n, d = x.shape
        h, dh = self.heads, d // self.heads
        queries, keys = self.to_q(x), self.to_k(x)
        values = keys
        if rotary:
            q, k = (t.view(b, n, h, dh).transpose(1, 2) for t in (queries, keys))   # 'b n (h d) -> b h n d'
            queries, keys = (_paper_rope(t).transpose(1, 2).reshape(b, n, d) for t in (q, k))
        keys, values = (torch.einsum("bnd,nk->bkd", t, self.proj_k) for t in (keys, values))
        queries = queries.reshape(b, n, h, -1).transpose(1, 2)
        keys, values = (t.reshape(b, self.k, -1, dh).transpose(1, 2) for t in (keys, values))
        attn = (torch.einsum("bhnd,bhkd->bhnk", queries, keys) * dh ** -0.5).softmax(dim=-1)
        out = torch.einsum("bhnk,bhkd->bhnd", attn, values)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("rotary", [False, True], ids=["learned", "rope1d"])
def test_linformer_shared_kv_heads_is_the_papers_vil_rope_attention(rotary):
    torch.manual_seed(0)
    d, h, n, k = 32, 4, 17, 8
    s = Shape(d, h, grid=(4, 4), prefix=1, size=k, rotary=rotary, qkv_bias=False)
    attn = LinformerSharedKVHeads.layer(s, Rope1d if rotary else None)(d, h, qkv_bias=False).eval()
    assert (attn.kv.in_features, attn.kv.out_features, attn.kv.bias, attn.q.bias) == (d, d, None, None)
    assert attn.proj_kv.shape == (n, k)
    ref = _PaperViLRoPEAttention(d, n, k, h).eval()
    with torch.no_grad():
        for theirs, ours in ((ref.to_q.weight, attn.q.weight), (ref.to_k.weight, attn.kv.weight),
                             (ref.proj_k, attn.proj_kv), (ref.to_out.weight, attn.proj.weight),
                             (ref.to_out.bias, attn.proj.bias)):
            theirs.copy_(ours)
        x = torch.randn(2, n, d)
        torch.testing.assert_close(attn(x), ref(x, rotary), atol=1e-5, rtol=1e-5)


def test_conv_plain_is_the_papers_stem():
    """Three biased 3x3 convs 3 -> 32 -> 64 -> 128, stride 1, nothing between (93,248 parameters at d 128)."""
    stem = PlainConvStem(32, 1, 3, 128)
    assert [type(m) for m in stem.proj] == [nn.Conv2d] * 3
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.bias is not None) for c in stem.proj] == \
        [(3, 32, (3, 3), (1, 1), True), (32, 64, (3, 3), (1, 1), True), (64, 128, (3, 3), (1, 1), True)]
    assert sum(p.numel() for p in stem.parameters()) == 93_248
    assert stem(torch.randn(1, 3, 32, 32)).shape == (1, 1024, 128)


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
    assert type(model.blocks[0].attn).__name__ == "Nystrom" and model.blocks[0].attn.size == 4
    assert type(model.blocks[0].attn.qkv).__name__ == "KeyedQKV"
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10) and math.isfinite(out.sum().item())
