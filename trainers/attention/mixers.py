"""Token mixers for timm's ViT/DeiT blocks, passed as timm's ``attn_layer`` (``Block(attn_layer=...)``).

``XAttention`` keeps timm's ``Attention`` layout: a fused ``qkv`` projection (B, N, d) -> (B, N, 3d) whose
output is ``[q | k | v]`` (so the q/k/v embeddings of trainers.embeddings and the manifold key plug into
``qkv`` unchanged), heads of d/heads, and an output ``proj``. Only the product of q, k, v differs:

=========  ======================================================  =====================================
mixer      product per head (q, k, v: N x dh)                      MACs per head (batch 1, counted)
=========  ======================================================  =====================================
softmax    softmax(q kᵀ / √dh) v, torch SDPA (timm's fused path)   2·N²·dh
performer  FAVOR+: φ(q) (φ(k)ᵀ v) / φ(q) Σφ(k), m random features  2·N·dh·m + 2·N·m·dh + N·m
linformer  softmax(q (E k)ᵀ / √dh) (F v); E, F: k x N, shared      2·N·k·dh (+ 2·N·k·d once, E and F)
           across heads (Wang et al. 2020)
nystrom    Nyström: k1 pinv(k2) (k3 v), m landmarks (segment       see ``nystrom_macs``
           means); tokens zero-padded to a multiple of m; 6
           Newton-Schulz steps for pinv; a depthwise conv (33 x 1)
           residual on v (Xiong et al. 2021)
=========  ======================================================  =====================================

``FNetMixer`` replaces the whole attention sub-layer by Re(FFT2(x)) over (tokens, channels), with no
parameters (Lee-Thorp et al. 2021); its MACs follow the FFT convention of trainers.attention.fft.

Written here rather than taken from a package: the maintained PyPI packages (performer-pytorch,
linformer, nystrom-attention) each bring their own q/k/v projections and head layout, while these
must read timm's fused ``qkv`` (so embeddings and the manifold key apply) and count exactly. Each is
tested against exact softmax attention where the method reduces to it (Linformer with E = F = I,
Nyström with m = N) and, for Performer, against softmax attention as the features grow
(tests/trainers/test_attention.py).

RoPE (``rope_grid``): timm's ``RotaryEmbeddingCat`` over the patch grid, applied to q and k of the
patch tokens (prefix tokens such as the class token are not rotated), as timm's EVA does.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import RotaryEmbeddingCat, apply_rot_embed_cat
from torch import nn

MIXERS = ("softmax", "performer", "linformer", "nystrom")
NYSTROM_CONV = 33     # kernel of the depthwise residual conv on v (Nystromformer's default)
PINV_ITERS = 6        # Newton-Schulz iterations of the Moore-Penrose inverse (Nystromformer's default)


class XAttention(nn.Module):
    """timm ``Attention`` with a chosen mixer; constructed by timm's Block through ``attn_layer``.

    mixer options: ``size`` = random features m (performer), projected length k (linformer) or
    landmarks m (nystrom); ``tokens`` = N, the fixed token count (linformer's E, F are k x N);
    ``rope_grid`` = (H, W) patch grid for RoPE, ``prefix`` = tokens before the patches.
    """

    options: dict = {}   # class-level defaults of the keywords below (``configured``)

    @classmethod
    def configured(cls, **options) -> type:
        """A subclass with these keyword defaults: timm's ``attn_layer`` must be a class."""
        return type(cls.__name__, (cls,), {"options": {**cls.options, **options}, "__module__": cls.__module__})

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, proj_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, device=None, dtype=None, **kwargs):
        super().__init__()
        opts = {"mixer": "softmax", "size": 0, "tokens": 0, "rope_grid": None, "prefix": 1, **self.options}
        opts.update({k: kwargs[k] for k in opts if k in kwargs})   # the rest: timm's (qk_norm, depth, ...)
        mixer, size, tokens, rope_grid, prefix = (opts[k] for k in ("mixer", "size", "tokens", "rope_grid",
                                                                    "prefix"))
        dd = {"device": device, "dtype": dtype}
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.mixer, self.size, self.tokens, self.prefix = mixer, size, tokens, prefix
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, **dd)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rope = None
        if rope_grid is not None:
            self.rope = RotaryEmbeddingCat(self.head_dim, in_pixels=False, feat_shape=list(rope_grid), **dd)
        if mixer == "performer":
            self.register_buffer("features", gaussian_orthogonal(size, self.head_dim, **dd))  # (m, dh)
        elif mixer == "linformer":
            self.proj_k = nn.Parameter(torch.empty(tokens, size, **dd))   # E: N -> k
            self.proj_v = nn.Parameter(torch.empty(tokens, size, **dd))   # F: N -> k
            for w in (self.proj_k, self.proj_v):
                nn.init.normal_(w, std=1 / math.sqrt(size))
        elif mixer == "nystrom":
            self.res_conv = nn.Conv2d(num_heads, num_heads, (NYSTROM_CONV, 1), padding=(NYSTROM_CONV // 2, 0),
                                      groups=num_heads, bias=False, **dd)
        elif mixer != "softmax":
            raise ValueError(f"attention: expected one of {', '.join(MIXERS)}, given {mixer!r}")

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.rope is not None:  # (B, heads, N, dh): rotate the patch tokens only
            emb = self.rope.get_embed()
            q, k = (torch.cat([t[:, :, :self.prefix], apply_rot_embed_cat(t[:, :, self.prefix:], emb)], dim=2)
                    .type_as(v) for t in (q, k))
        drop = self.attn_drop.p if self.training else 0.0
        if self.mixer == "softmax":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop, is_causal=is_causal)
        elif self.mixer == "linformer":
            k = torch.einsum("bhnd,nk->bhkd", k, self.proj_k)  # (B, heads, k, dh)
            v = torch.einsum("bhnd,nk->bhkd", v, self.proj_v)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        elif self.mixer == "performer":
            out = favor(q, k, v, self.features)
        else:
            out = nystrom(q, k, v, self.size) + self.res_conv(v)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def extra_repr(self) -> str:
        return f"mixer={self.mixer}, size={self.size}, heads={self.num_heads}, rope={self.rope is not None}"


class FNetMixer(nn.Module):
    """FNet: Re(FFT over tokens of FFT over channels), no parameters; drop-in for timm's ``attn_layer``."""

    def __init__(self, dim: int, *_args, **_timm_kwargs):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        return torch.fft.fft2(x.float(), dim=(-2, -1)).real.type_as(x)


# ---------------------------------------------------------------------------------------------- performer


def gaussian_orthogonal(m: int, d: int, device=None, dtype=None) -> torch.Tensor:
    """(m, d) random features: blocks of d orthogonal rows (QR of a Gaussian) scaled by chi(d) norms, as
    FAVOR+ draws them. Drawn once (a buffer: checkpoints keep them); on the meta device: shapes only."""
    if torch.device(device or torch.get_default_device()).type == "meta":
        return torch.empty(m, d, device="meta", dtype=dtype)
    blocks = []
    for _ in range(math.ceil(m / d)):
        q, _r = torch.linalg.qr(torch.randn(d, d, device=device))
        blocks.append(q.T)
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, device=device).norm(dim=1, keepdim=True)
    return (w * norms).to(dtype or torch.get_default_dtype())


def _phi(x: torch.Tensor, features: torch.Tensor, is_query: bool, eps: float = 1e-4) -> torch.Tensor:
    """FAVOR+ positive features exp(w·x - |x|²/2) / √m on x scaled by dh^-1/4 (so φ(q)·φ(k) ≈ e^{q·k/√dh})."""
    x = x * x.shape[-1] ** -0.25
    proj = x @ features.T                                   # (B, h, N, m)
    diag = (x * x).sum(-1, keepdim=True) / 2
    stab = proj.amax(dim=-1, keepdim=True) if is_query else proj.amax(dim=(-2, -1), keepdim=True)
    return (torch.exp(proj - diag - stab.detach()) + eps) / math.sqrt(features.shape[0])


def favor(q, k, v, features):
    """Linear attention with FAVOR+ features: (B, h, N, dh) -> (B, h, N, dh)."""
    qp, kp = _phi(q, features, True), _phi(k, features, False)   # (B, h, N, m)
    kv = kp.transpose(-2, -1) @ v                              # (B, h, m, dh)
    den = qp @ kp.sum(dim=-2).unsqueeze(-1)                    # (B, h, N, 1)
    return (qp @ kv) / den


# ---------------------------------------------------------------------------------------------- nystrom


def pinv(x: torch.Tensor, iters: int = PINV_ITERS) -> torch.Tensor:
    """Moore-Penrose inverse of (..., m, m) by Newton-Schulz iterations (Nystromformer's init)."""
    a = x.abs()
    z = x.transpose(-1, -2) / (a.sum(-1).amax() * a.sum(-2).amax())
    eye = torch.eye(x.shape[-1], device=x.device, dtype=x.dtype)
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * eye - xz @ (15 * eye - xz @ (7 * eye - xz)))
    return z


def nystrom(q, k, v, m: int, iters: int = PINV_ITERS):
    """Nyström attention with m landmarks: (B, h, N, dh) -> (B, h, N, dh).

    Tokens are zero-padded at the end to Np = ceil(N/m)·m; landmarks are the means of m segments of
    Np/m tokens over real tokens only; padded keys are masked out of k3. Products (counted): q k̃ᵀ
    (Np·m·dh), q̃ k̃ᵀ (m²·dh), q̃ kᵀ (m·Np·dh), pinv (4·m³ per iteration), k3 v (m·Np·dh),
    k1 pinv (Np·m²), (k1 pinv)(k3 v) (Np·m·dh).
    """
    B, h, N, d = q.shape
    pad = -N % m
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    real = F.pad(torch.ones(N, device=q.device, dtype=q.dtype), (0, pad))          # (Np,)
    seg = real.view(m, -1).sum(-1).clamp(min=1)[:, None]                          # real tokens per segment
    scale = d ** -0.5
    ql = q.reshape(B, h, m, -1, d).sum(-2) / seg                                  # (B, h, m, dh)
    kl = k.reshape(B, h, m, -1, d).sum(-2) / seg
    k1 = ((q * scale) @ kl.transpose(-1, -2)).softmax(-1)                         # (B, h, Np, m)
    k2 = ((ql * scale) @ kl.transpose(-1, -2)).softmax(-1)                        # (B, h, m, m)
    s3 = (ql * scale) @ k.transpose(-1, -2)                                       # (B, h, m, Np)
    k3 = s3.masked_fill(real == 0, float("-inf")).softmax(-1)
    out = (k1 @ pinv(k2, iters)) @ (k3 @ v)
    return out[:, :, :N]


def nystrom_macs(tokens: int, dh: int, m: int, heads: int) -> int:
    """MACs of ``nystrom`` plus the residual conv, batch 1 (padding counted)."""
    n_p = -(-tokens // m) * m
    per_head = (n_p * m * dh + m * m * dh + m * n_p * dh + PINV_ITERS * 4 * m ** 3
                + m * n_p * dh + n_p * m * m + n_p * m * dh)
    return heads * (per_head + tokens * dh * NYSTROM_CONV)
