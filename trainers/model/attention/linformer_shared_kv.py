"""Linformer with shared keys and values as the Vision X-formers paper built it (Jeevan & Sethi 2021, from
lucidrains' ``linformer`` with ``share_kv=True``): the keys are the values, projected along the tokens by one
E (N x k) for both (E = F).

- ``linformer_shared_kv`` (``LinformerSharedKV``, its ``ViL.py``: ``one_kv_head=True``): one key/value head
  of dh, shared by every query head;
- ``linformer_shared_kv_heads`` (``LinformerSharedKVHeads``, its ``ViLRoPE.py`` and ``HybridViLRoPE.py``, the
  RoPE rows of its Table 6: ``one_kv_head=False``): a key/value head per query head, from one d -> d projection.

Per block: q = x Wq (d -> d, heads of dh), kv = x Wkv (d -> dh·g, g key/value heads: 1, or the query heads),
K = V = E kv (k x dh per head), then softmax(q Kᵀ / √dh) V per query head and the output projection. With
rotary positions the keys are rotated and the values not (as the paper's code, which takes the values before
rotating the keys), so E then projects both apart. There is no fused q/k/v, so a q/k/v embedding or a manifold
key has nothing to replace (spaces.choices refuses them). The projections take timm's ``qkv_bias`` (the paper's
have none: ``qkv_bias: false``).

Parameters: Wq d² (+d), Wkv d·dh·g (+dh·g), E N·k, the output projection d² (+d).
MACs: N·d² + N·d·dh·g + N·k·dh·g (twice with rotary positions) + 2·N·k·d (attention over k) + N·d².
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from qkvsearch.trainers.model.attention.base import check_size_within_tokens, configured
from qkvsearch.trainers.model.attention.shape import Counted, Shape


class LinformerSharedKV(nn.Module, Counted):
    options: ClassVar[dict] = {"size": 0, "tokens": 0, "prefix": 1, "grid": (1, 1), "rotation": None}
    fused_qkv: ClassVar[bool] = False
    one_kv_head: ClassVar[bool] = True     # one key/value head for every query head (else one per query head)

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, proj_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, device=None, dtype=None, **kwargs):
        super().__init__()
        opts = {**self.options, **{k: kwargs[k] for k in self.options if k in kwargs}}  # the rest: timm's
        dd = {"device": device, "dtype": dtype}
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.kv_heads = 1 if self.one_kv_head else num_heads
        self.size, self.tokens, self.prefix = opts["size"], opts["tokens"], opts["prefix"]
        self.q = nn.Linear(dim, dim, bias=qkv_bias, **dd)                  # queries, every head
        self.kv = nn.Linear(dim, self.head_dim * self.kv_heads, bias=qkv_bias, **dd)   # keys = values
        self.proj_kv = nn.Parameter(torch.empty(self.tokens, self.size, **dd))   # E = F: N -> k
        bound = 1 / math.sqrt(self.size)
        nn.init.uniform_(self.proj_kv, -bound, bound)                       # the reference's init
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        rotation = opts["rotation"]
        self.rope = None if rotation is None else rotation.rotation(self.head_dim, opts["grid"], self.prefix,
                                                                    self.tokens, **dd)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, self.head_dim).transpose(1, 2)       # (B, h, N, dh)
        kv = self.kv(x).reshape(B, N, self.kv_heads, self.head_dim).transpose(1, 2)   # (B, g, N, dh), g: 1 or h
        k = kv
        if self.rope is not None:
            q, k = self.rope(q, kv)                                         # the values stay unrotated
        k = torch.einsum("bhnd,nk->bhkd", k, self.proj_kv)                  # (B, g, k, dh)
        v = k if self.rope is None else torch.einsum("bhnd,nk->bhkd", kv, self.proj_kv)
        drop = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k.expand(-1, h, -1, -1), v.expand(-1, h, -1, -1), dropout_p=drop)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def qkv_projections(self) -> list[nn.Module]:
        """Its q/k/v projections (counted as a model's q/k/v embedding)."""
        return [self.q, self.kv]

    def extra_repr(self) -> str:
        return (f"size={self.size}, heads={self.num_heads}, kv_heads={self.kv_heads}, "
                f"rope={type(self.rope).__name__ if self.rope else None}")

    @classmethod
    def layer(cls, s: Shape, rotation: type | None = None) -> type:
        return configured(cls, size=s.size, tokens=s.tokens, prefix=s.prefix, grid=s.grid, rotation=rotation)

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        check_size_within_tokens(s, name)

    @classmethod
    def kv_dim(cls, s: Shape) -> int:
        """Width of the key/value projection: dh per key/value head."""
        return s.head_dim if cls.one_kv_head else s.dim

    @classmethod
    def qkv_params(cls, s: Shape) -> int:
        return s.dim * s.dim + s.dim * cls.kv_dim(s) + ((s.dim + cls.kv_dim(s)) if s.qkv_bias else 0)

    @classmethod
    def params(cls, s: Shape) -> int:
        return cls.qkv_params(s) + s.tokens * s.size + s.dim * s.dim + (s.dim if s.proj_bias else 0)

    @classmethod
    def macs(cls, s: Shape) -> int:
        n, d, kv, k = s.tokens, s.dim, cls.kv_dim(s), s.size
        projected = n * k * kv * (2 if s.rotary else 1)
        return n * d * d + n * d * kv + projected + 2 * n * k * d + n * d * d


class LinformerSharedKVHeads(LinformerSharedKV):
    """``linformer_shared_kv_heads``: a key/value head per query head (the paper's RoPE rows)."""

    one_kv_head: ClassVar[bool] = False
