"""``QKVAttention``: timm's ``Attention`` whose product of q, k and v a subclass chooses.

It keeps timm's layout, so the q/k/v embeddings (trainers.model.embeddings) and the manifold key plug into
``qkv`` unchanged: a fused ``qkv`` projection (B, N, d) -> (B, N, 3d) read as ``[q | k | v]``, heads of
dh = d/heads, an output ``proj``. A subclass gives ``mix(q, k, v)`` ((B, heads, N, dh) each ->
(B, heads, N, dh)), the parameters that the mixing adds (``init_mixer``) and its counts. With rotary
positions (trainers.model.attention.positions) q and k are rotated before the product.

timm's Block builds it through ``attn_layer``, which must be a class: ``layer(shape)`` returns a
subclass whose keyword defaults fix the block's shape (size, token count, prefix, rotation).
Counts at a Shape (batch 1): the projections 3d² + d² weights (+ 3d, d biases) and 4·N·d² MACs, plus
``mix_params`` and ``mix_macs``.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from timm.layers import Attention

from qkvsearch.spaces.keys import ATTENTION_SIZE_KEY, ConfigError
from qkvsearch.trainers.model.attention.shape import Counted, Shape


def check_size_within_tokens(s: Shape, name: str) -> None:
    """A projected length or landmark count of at most the token count; ConfigError naming its key."""
    key = ATTENTION_SIZE_KEY[name]
    if s.size > s.tokens:
        raise ConfigError(f"{key}: expected at most the token count {s.tokens} ({name} needs a fixed token count "
                          f"of at least its {key}), given {s.size}")


def configured(cls: type, **options) -> type:
    """A subclass of ``cls`` with these keyword defaults (``options``): timm's ``attn_layer`` must be a class."""
    return type(cls.__name__, (cls,), {"options": {**cls.options, **options}, "__module__": cls.__module__})


class QKVAttention(Attention, Counted):
    options: ClassVar[dict] = {"size": 0, "tokens": 0, "prefix": 1, "grid": (1, 1), "rotation": None}
    fused_qkv: ClassVar[bool] = True   # a [q | k | v] projection that embeddings and the manifold key replace

    @classmethod
    def layer(cls, s: Shape, rotation: type | None = None) -> type:
        """The ``attn_layer`` timm's Block builds at shape ``s``; ``rotation``: a positions class that
        rotates q and k, or None."""
        return configured(cls, size=s.size, tokens=s.tokens, prefix=s.prefix, grid=s.grid, rotation=rotation)

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 norm_layer=None, device=None, dtype=None, **kwargs):
        super().__init__(dim, num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, scale_norm=scale_norm,
                         proj_bias=proj_bias, attn_drop=attn_drop, proj_drop=proj_drop, norm_layer=norm_layer,
                         device=device, dtype=dtype)
        opts = {**self.options, **{k: kwargs[k] for k in self.options if k in kwargs}}  # the rest: timm's
        self.size, self.tokens, self.prefix = opts["size"], opts["tokens"], opts["prefix"]
        dd = {"device": device, "dtype": dtype}
        rotation = opts["rotation"]
        self.rope = None if rotation is None else rotation.rotation(self.head_dim, opts["grid"], self.prefix,
                                                                    self.tokens, **dd)
        self.init_mixer(**dd)

    def init_mixer(self, device=None, dtype=None) -> None:
        """Parameters and buffers the product adds (after qkv and proj, so the draws keep their order)."""

    def qkv_projections(self) -> list[torch.nn.Module]:
        """Its q/k/v projections other than a fused ``qkv`` (which the model's sites, embeddings and keys hold):
        counted as its model's q/k/v embedding and quantized as ``quant_qkv``. Every token mixer declares it
        (tests/trainers/test_choices.py); none here."""
        return []

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None,
            is_causal: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)        # (B, heads, N, dh); Identity in a plain ViT
        if self.rope is not None:
            q, k = self.rope(q, k)
        out = self.mix(q, k, v, attn_mask, is_causal)  # (B, heads, N, dh)
        return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(B, N, self.attn_dim))))

    def extra_repr(self) -> str:
        return f"size={self.size}, heads={self.num_heads}, rope={type(self.rope).__name__ if self.rope else None}"

    # ------------------------------------------------------------------------------------------ counts

    @classmethod
    def qkv_params(cls, s: Shape) -> int:
        """The fused qkv projection: what a q/k/v embedding replaces."""
        return 3 * s.dim * s.dim + (3 * s.dim if s.qkv_bias else 0)

    @classmethod
    def params(cls, s: Shape) -> int:
        return cls.qkv_params(s) + s.dim * s.dim + (s.dim if s.proj_bias else 0) + cls.mix_params(s)

    @classmethod
    def macs(cls, s: Shape) -> int:
        return 4 * s.tokens * s.dim * s.dim + cls.mix_macs(s)

    @classmethod
    def mix_params(cls, s: Shape) -> int:
        return 0

    @classmethod
    def mix_macs(cls, s: Shape) -> int:
        raise NotImplementedError
