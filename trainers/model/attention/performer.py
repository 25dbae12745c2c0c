"""``performer``: FAVOR+ linear attention with m positive orthogonal random features (Choromanski et al.
2021), φ(q) (φ(k)ᵀ v) / φ(q) Σφ(k).

The features are drawn once per block and kept as a buffer (checkpoints hold them). MACs per head:
φ(q) and φ(k) 2·N·dh·m, φ(k)ᵀ v N·m·dh, φ(q)(φ(k)ᵀ v) N·m·dh, the normaliser N·m; no parameters.
"""
from __future__ import annotations

import math

import torch

from qkvsearch.trainers.model.attention.base import QKVAttention
from qkvsearch.trainers.model.attention.shape import Shape


class Performer(QKVAttention):
    def init_mixer(self, device=None, dtype=None) -> None:
        self.register_buffer("features", gaussian_orthogonal(self.size, self.head_dim, device, dtype))  # (m, dh)

    def mix(self, q, k, v, attn_mask=None, is_causal=False):
        return favor(q, k, v, self.features)

    @classmethod
    def mix_macs(cls, s: Shape) -> int:
        return s.heads * (4 * s.tokens * s.head_dim * s.size + s.tokens * s.size)


def gaussian_orthogonal(m: int, d: int, device=None, dtype=None) -> torch.Tensor:
    """(m, d) random features: blocks of d orthogonal rows (QR of a Gaussian) scaled by chi(d) norms, as
    FAVOR+ draws them. On the meta device: shapes only."""
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
