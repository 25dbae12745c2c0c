"""The architecture keys of a trial (spaces.keys, group ``model``) as timm constructor arguments, and the
registry of their building blocks with closed-form costs.

``Arch.from_cfg(cfg)`` reads: attention (softmax | performer | linformer | nystrom | fnet) and its size
(attn_features, attn_proj_len, attn_landmarks), pos_embed (learned | rope | none), patch_embed (linear |
conv), key (shared | manifold) with key_charts, key_aggregation, key_context, and the macro shape
(depth, embed_dim, num_heads, mlp_ratio, patch_size; null = timm's default for the model).

Everything goes through timm's own constructor: macro dims as its keyword arguments, the mixer as
``attn_layer`` (mixers.XAttention configured, or FNetMixer), the stem as ``embed_layer``, positions
as ``pos_embed`` ('learn' | 'none'; RoPE lives in the attention). The default architecture (softmax,
learned, linear, shared) passes nothing, so timm's model is left untouched. The manifold key is put
into each self-attention's ``qkv`` slot after timm builds the model (``add_manifold_keys``).

``BLOCKS[(dimension, choice)]`` is one registered block per choice: how to build it at a ``Shape``
and its parameter and MAC counts (batch 1), checked against the built module and FlopCounterMode in
tests/trainers/test_attention.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from timm.layers import Attention, PatchEmbed, RotaryEmbeddingCat
from torch import nn

from qkvsearch.spaces.keys import ATTENTION_SIZE_KEY, DESIGN_KEYS, MACRO_KEYS, ConfigError
from qkvsearch.trainers.attention.fft import fft_macs
from qkvsearch.trainers.attention.manifold import KeyedQKV, ManifoldKey, manifold_macs, manifold_params
from qkvsearch.trainers.attention.mixers import FNetMixer, XAttention, nystrom_macs
from qkvsearch.trainers.attention.stems import (
    ConvStem,
    linear_patch_macs,
    linear_patch_params,
    stem_macs,
    stem_params,
)

__all__ = ["BLOCKS", "DESIGN_KEYS", "MACRO_KEYS", "Arch", "Block", "Shape", "add_manifold_keys"]



@dataclass(frozen=True)
class Arch:
    """The architecture keys of a filled config (None: does not apply, or timm's default)."""

    attention: str | None = None
    attn_size: int | None = None        # the size key of the chosen attention (features, k, landmarks)
    pos_embed: str | None = None
    patch_embed: str | None = None
    key: str = "shared"
    key_charts: int | None = None
    key_aggregation: str | None = None
    key_context: bool | None = None
    depth: int | None = None
    embed_dim: int | None = None
    num_heads: int | None = None
    mlp_ratio: float | None = None
    patch_size: int | None = None

    @classmethod
    def from_cfg(cls, cfg: dict) -> Arch:
        size_key = ATTENTION_SIZE_KEY.get(cfg.get("attention"))
        return cls(attention=cfg.get("attention"), attn_size=cfg.get(size_key) if size_key else None,
                   pos_embed=cfg.get("pos_embed"), patch_embed=cfg.get("patch_embed"),
                   key=cfg.get("key") or "shared", key_charts=cfg.get("key_charts"),
                   key_aggregation=cfg.get("key_aggregation"), key_context=cfg.get("key_context"),
                   **{k: cfg.get(k) for k in MACRO_KEYS})

    def macro_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in MACRO_KEYS if getattr(self, k) is not None}

    @property
    def timm_default(self) -> bool:
        """Nothing for timm's attention, positions or patches to change (XCiT, or ViT's own choices)."""
        return self.attention in (None, "softmax") and self.pos_embed in (None, "learned") \
            and self.patch_embed in (None, "linear")

    def vit_kwargs(self, probe: nn.Module) -> dict:
        """timm VisionTransformer arguments for the mixer, positions and stem; ``probe``: the model built
        with the macro shape alone (meta), which gives the token count, patch grid and prefix tokens."""
        grid = tuple(probe.patch_embed.grid_size)
        prefix = probe.num_prefix_tokens
        tokens = probe.patch_embed.num_patches + prefix
        dim, heads = probe.embed_dim, probe.blocks[0].attn.num_heads if len(probe.blocks) else 1
        self.check(dim, heads, tokens)
        rope = grid if self.pos_embed == "rope" else None
        kwargs: dict = {"pos_embed": "learn" if self.pos_embed == "learned" else "none"}
        if self.attention == "fnet":
            kwargs["attn_layer"] = FNetMixer
        elif self.attention != "softmax" or rope is not None:
            kwargs["attn_layer"] = XAttention.configured(mixer=self.attention, size=self.attn_size or 0,
                                                         tokens=tokens, rope_grid=rope, prefix=prefix)
        if self.patch_embed == "conv":
            kwargs["embed_layer"] = ConvStem
        return kwargs

    def check(self, dim: int, heads: int, tokens: int) -> None:
        """The rules that need the resolved shape; raise ConfigError naming the key."""
        dh = dim // heads
        if self.pos_embed == "rope" and dh % 4:
            raise ConfigError(f"pos_embed: expected a head dim (embed_dim / num_heads) divisible by 4 for rope "
                              f"(timm's 2-D rotary bands), given rope with head dim {dh}")
        if self.attention in ("linformer", "nystrom") and self.attn_size > tokens:
            key = ATTENTION_SIZE_KEY[self.attention]
            raise ConfigError(f"{key}: expected at most the token count {tokens} ({self.attention} needs a fixed "
                              f"token count of at least its {key}), given {self.attn_size}")


def add_manifold_keys(model: nn.Module, arch: Arch) -> None:
    """Put a manifold key into every fused-qkv self-attention: qkv -> KeyedQKV(Linear(d, 2d), key)."""
    if arch.key != "manifold":
        return
    for _path, m in list(model.named_modules()):
        qkv = getattr(m, "qkv", None)
        if isinstance(qkv, nn.Linear) and qkv.out_features == 3 * qkv.in_features:
            d = qkv.in_features
            with torch.device(qkv.weight.device):
                qv = nn.Linear(d, 2 * d, bias=qkv.bias is not None)
                key = ManifoldKey(d, arch.key_charts, arch.key_aggregation, arch.key_context)
            m.qkv = KeyedQKV(qv.to(qkv.weight.dtype), key.to(qkv.weight.dtype))


# ---------------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Shape:
    """What a block is built at: token dim, heads, tokens N (prefix included), the patch grid, sizes."""

    dim: int
    heads: int
    grid: tuple[int, int]
    prefix: int = 1
    size: int = 8                # performer features / linformer k / nystrom landmarks
    in_chans: int = 3
    patch: int = 1
    charts: int = 4
    aggregation: str = "vanilla"
    context: bool = False

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1] + self.prefix

    @property
    def img(self) -> int:
        return self.grid[0] * self.patch


@dataclass(frozen=True)
class Block:
    build: Callable[[Shape], nn.Module]
    params: Callable[[Shape], int]
    macs: Callable[[Shape], int]
    example: Callable[[Shape], torch.Tensor]    # an input (batch 1) for the forward


def _tokens(s: Shape) -> torch.Tensor:
    return torch.randn(1, s.tokens, s.dim)


def _heads_tensor(s: Shape) -> torch.Tensor:
    return torch.randn(1, s.heads, s.tokens - s.prefix, s.dim // s.heads)


def _image(s: Shape) -> torch.Tensor:
    return torch.randn(1, s.in_chans, s.img, s.img)


def _attn(mixer: str, extra_params, mix_macs) -> Block:
    def build(s: Shape) -> nn.Module:
        if mixer == "softmax":
            return Attention(s.dim, s.heads, qkv_bias=True)      # timm's own: fused SDPA
        return XAttention(s.dim, s.heads, qkv_bias=True, mixer=mixer, size=s.size, tokens=s.tokens)

    return Block(build, lambda s: 4 * s.dim * s.dim + 4 * s.dim + extra_params(s),
                 lambda s: 4 * s.tokens * s.dim * s.dim + mix_macs(s), _tokens)


BLOCKS: dict[tuple[str, str], Block] = {
    ("attention", "softmax"): _attn("softmax", lambda s: 0, lambda s: 2 * s.tokens ** 2 * s.dim),
    ("attention", "performer"): _attn("performer", lambda s: 0, lambda s: s.heads * (
        4 * s.tokens * (s.dim // s.heads) * s.size + s.tokens * s.size)),
    ("attention", "linformer"): _attn("linformer", lambda s: 2 * s.tokens * s.size,
                                      lambda s: 4 * s.tokens * s.size * s.dim),
    ("attention", "nystrom"): _attn("nystrom", lambda s: s.heads * 33,
                                    lambda s: nystrom_macs(s.tokens, s.dim // s.heads, s.size, s.heads)),
    ("attention", "fnet"): Block(lambda s: FNetMixer(s.dim), lambda s: 0,
                                 lambda s: fft_macs((1, s.tokens, s.dim), (1, 2)), _tokens),
    ("pos_embed", "learned"): Block(lambda s: nn.ParameterList([nn.Parameter(torch.zeros(1, s.tokens, s.dim))]),
                                    lambda s: s.tokens * s.dim, lambda s: 0, _tokens),
    ("pos_embed", "rope"): Block(lambda s: RotaryEmbeddingCat(s.dim // s.heads, in_pixels=False,
                                                              feat_shape=list(s.grid)),
                                 lambda s: 0, lambda s: 0, _heads_tensor),
    ("pos_embed", "none"): Block(lambda s: nn.Identity(), lambda s: 0, lambda s: 0, _tokens),
    ("patch_embed", "linear"): Block(lambda s: PatchEmbed(s.img, s.patch, s.in_chans, s.dim),
                                     lambda s: linear_patch_params(s.in_chans, s.dim, s.patch),
                                     lambda s: linear_patch_macs(s.in_chans, s.dim, s.patch, s.img), _image),
    ("patch_embed", "conv"): Block(lambda s: ConvStem(s.img, s.patch, s.in_chans, s.dim),
                                   lambda s: stem_params(s.in_chans, s.dim, s.patch),
                                   lambda s: stem_macs(s.in_chans, s.dim, s.patch, s.img), _image),
    ("key", "shared"): Block(lambda s: nn.Linear(s.dim, s.dim), lambda s: s.dim * s.dim + s.dim,
                             lambda s: s.tokens * s.dim * s.dim, _tokens),
    ("key", "manifold"): Block(lambda s: ManifoldKey(s.dim, s.charts, s.aggregation, s.context),
                               lambda s: manifold_params(s.dim, s.charts, s.aggregation),
                               lambda s: manifold_macs(s.dim, s.charts, s.aggregation, s.tokens), _tokens),
}
