"""Position choices (``pos_embed``) of a ViT: what timm's VisionTransformer is given (``timm_pos_embed``)
and, for RoPE, the rotation an attention applies to q and k (``rotation(...)``).

- ``learned``: timm's learned table (``pos_embed='learn'``), (N or N - prefix) x d parameters added to
  the tokens, the original ViT's; no MACs.
- ``rope``: 2-D RoPE over the patch grid, timm's ``RotaryEmbeddingCat`` (in_pixels=False) as timm's EVA
  uses it; the prefix tokens (the class token) are not rotated; head dim divisible by 4.
- ``rope1d``: the Vision X-formers paper's RoPE (Jeevan & Sethi 2021, from lucidrains' rotary code): 1-D
  over the flattened sequence with the class token at position 0, every head dim rotated in interleaved
  pairs, frequencies 10000^(-2i/dh); even head dim.
- ``none``: no positions.
RoPE has no parameters; its rotation is element-wise, so it adds no MACs (trainers.model.cost's convention).
"""
from __future__ import annotations

from typing import ClassVar

import torch
from timm.layers import RotaryEmbeddingCat, apply_rot_embed, apply_rot_embed_cat, freq_bands
from torch import nn

from qkvsearch.spaces.keys import ConfigError
from qkvsearch.trainers.model.attention.shape import Counted, Shape

ROPE_BASE = 10000.0   # the rotary frequencies' base (temperature), as RoFormer and the paper's code


class Positions(Counted):
    timm_pos_embed: ClassVar[str] = "none"    # timm VisionTransformer's pos_embed argument

    @classmethod
    def rotation(cls, head_dim: int, grid: tuple[int, int], prefix: int, tokens: int, device=None,
                 dtype=None) -> nn.Module | None:
        """The module that rotates (q, k) of shape (B, heads, N, dh); None: positions do not rotate."""
        return None


class Learned(Positions):
    timm_pos_embed = "learn"

    @classmethod
    def params(cls, s: Shape) -> int:
        return (s.tokens if s.table_prefix else s.patches) * s.dim


class NoPositions(Positions):
    pass


class Rope(Positions):
    @classmethod
    def rotation(cls, head_dim, grid, prefix, tokens, device=None, dtype=None):
        return GridRotation(head_dim, grid, prefix, device=device, dtype=dtype)

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        if s.head_dim % 4:
            raise ConfigError(f"pos_embed: expected a head dim (embed_dim / num_heads) divisible by 4 for {name} "
                              f"(timm's 2-D rotary bands), given {name} with head dim {s.head_dim}")


class Rope1d(Positions):
    @classmethod
    def rotation(cls, head_dim, grid, prefix, tokens, device=None, dtype=None):
        return SequenceRotation(head_dim, tokens, device=device)

    @classmethod
    def check(cls, s: Shape, name: str) -> None:
        if s.head_dim % 2:
            raise ConfigError(f"pos_embed: expected an even head dim (embed_dim / num_heads) for {name} (dims "
                              f"rotate in pairs), given {name} with head dim {s.head_dim}")


class GridRotation(nn.Module):
    """2-D RoPE of the patch tokens over their (H, W) grid; the ``prefix`` tokens before them stay as they are."""

    def __init__(self, head_dim: int, grid: tuple[int, int], prefix: int, device=None, dtype=None):
        super().__init__()
        self.prefix = prefix
        self.rope = RotaryEmbeddingCat(head_dim, in_pixels=False, feat_shape=list(grid), device=device, dtype=dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.rope.get_embed()                                                    # (H·W, 2·dh)
        p = self.prefix
        return tuple(torch.cat([t[:, :, :p], apply_rot_embed_cat(t[:, :, p:], emb)], dim=2).type_as(t)
                     for t in (q, k))


class SequenceRotation(nn.Module):
    """1-D RoPE over positions 0..N-1 of the whole sequence (class token first), every dim in pairs."""

    def __init__(self, head_dim: int, tokens: int, device=None):
        super().__init__()
        bands = freq_bands(head_dim, temperature=ROPE_BASE, step=2, device=device)     # (dh/2,) 10000^(-2i/dh)
        angles = torch.arange(tokens, device=device, dtype=torch.float32)[:, None] * bands  # (N, dh/2)
        # interleaved layout [f0, f0, f1, f1, ...], as timm's rot() pairs dims (2i, 2i+1)
        self.register_buffer("sin", angles.sin().repeat_interleave(2, -1), persistent=False)   # (N, dh)
        self.register_buffer("cos", angles.cos().repeat_interleave(2, -1), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rot_embed(q, self.sin, self.cos), apply_rot_embed(k, self.sin, self.cos)
