"""``nystrom``: Nyström attention with m landmarks (Xiong et al. 2021), k1 pinv(k2) (k3 v), plus a
depthwise convolution (33 x 1 over the tokens, per head, no bias) on v as a residual, as the
Nystromformer's default.

Tokens are zero-padded at the end to Np = ceil(N/m)·m; the landmarks are the means of m segments of
Np/m tokens over the real tokens only; padded keys are masked out of k3; the Moore-Penrose inverse
takes 6 Newton-Schulz steps. Parameters: the conv, 33 a head. MACs: ``nystrom_macs``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qkvsearch.trainers.model.attention.base import QKVAttention, check_size_within_tokens
from qkvsearch.trainers.model.attention.shape import Shape

NYSTROM_CONV = 33     # kernel of the depthwise residual conv on v (Nystromformer's default)
PINV_ITERS = 6        # Newton-Schulz iterations of the Moore-Penrose inverse (Nystromformer's default)


class Nystrom(QKVAttention):
    def init_mixer(self, device=None, dtype=None) -> None:
        h = self.num_heads
        self.res_conv = nn.Conv2d(h, h, (NYSTROM_CONV, 1), padding=(NYSTROM_CONV // 2, 0), groups=h, bias=False,
                                  device=device, dtype=dtype)

    def mix(self, q, k, v, attn_mask=None, is_causal=False):
        return nystrom(q, k, v, self.size) + self.res_conv(v)

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        check_size_within_tokens(s, name)

    @classmethod
    def mix_params(cls, s: Shape) -> int:
        return s.heads * NYSTROM_CONV

    @classmethod
    def mix_macs(cls, s: Shape) -> int:
        return nystrom_macs(s.tokens, s.head_dim, s.size, s.heads)


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

    Products (counted): q k̃ᵀ (Np·m·dh), q̃ k̃ᵀ (m²·dh), q̃ kᵀ (m·Np·dh), pinv (4·m³ per iteration),
    k3 v (m·Np·dh), k1 pinv (Np·m²), (k1 pinv)(k3 v) (Np·m·dh).
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
