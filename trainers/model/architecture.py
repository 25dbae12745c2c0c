"""The architecture keys of a trial (spaces.keys, group ``model``): ``Arch``, their values resolved to the
registered classes (trainers.model.choices), and the shape of a ViT stage those classes are built at.

``Arch.from_cfg(cfg)`` reads: attention (its size from the attention's size key), pos_embed, patch_embed,
key with key_charts, key_aggregation, key_context, and timm's constructor arguments (the macro shape: depth,
embed_dim, num_heads, mlp_ratio, token_mlp_ratio, patch_size; and qkv_bias; null = timm's default for the
model). A family (trainers.model.hosts) turns them into timm's constructor arguments; ``vit_stage`` reads the
stage's ``Shape`` off a ViT built with timm's own choices, and ``Arch.stage`` fits it to the architecture once
each chosen class has checked it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from timm.layers import Attention, PatchEmbed
from torch import nn

from qkvsearch.spaces.choices import POSITION_CHOICES
from qkvsearch.spaces.keys import ATTENTION_SIZE_KEY, KEYS, MACRO_KEYS, ConfigError
from qkvsearch.trainers.model.attention.positions import Learned
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.attention.softmax import Softmax
from qkvsearch.trainers.model.attention.stems import LinearStem
from qkvsearch.trainers.model.choices import KEY_TYPES, MIXERS, POSITIONS, STEMS

__all__ = ["Arch", "install_key", "vit_stage"]

# the declared defaults: timm's own choices (nothing is passed to timm), also where a key does not apply
DEFAULTS = {k: KEYS[k].default for k in ("attention", "pos_embed", "patch_embed", "key")}


@dataclass(frozen=True)
class Arch:
    """The architecture keys of a filled config (None: does not apply, or timm's default)."""

    attention: str | None = None
    attn_size: int | None = None        # the size key of the chosen attention (features, k, landmarks)
    pos_embed: str | None = None
    patch_embed: str | None = None
    key: str | None = None
    key_charts: int | None = None
    key_aggregation: str | None = None
    key_context: bool | None = None
    depth: int | None = None
    embed_dim: int | None = None
    num_heads: int | None = None
    mlp_ratio: float | None = None
    token_mlp_ratio: float | None = None
    patch_size: int | None = None
    qkv_bias: bool | None = None        # timm's qkv_bias: the q/k/v projections' bias (its attention classes take it)

    @classmethod
    def from_cfg(cls, cfg: dict) -> Arch:
        size_key = ATTENTION_SIZE_KEY.get(cfg.get("attention"))
        return cls(attention=cfg.get("attention"), attn_size=cfg.get(size_key) if size_key else None,
                   pos_embed=cfg.get("pos_embed"), patch_embed=cfg.get("patch_embed"),
                   key=cfg.get("key"), key_charts=cfg.get("key_charts"),
                   key_aggregation=cfg.get("key_aggregation"), key_context=cfg.get("key_context"),
                   **{k: cfg.get(k) for k in MACRO_KEYS})

    def macro(self) -> Arch:
        """timm's constructor arguments alone: timm's model with the default choices (what the cost model counts
        once)."""
        return Arch(**{k: getattr(self, k) for k in MACRO_KEYS})

    def macro_kwargs(self) -> dict:
        return {k: getattr(self, k) for k in MACRO_KEYS if getattr(self, k) is not None}

    # the chosen classes (the default where the key does not apply)
    def _choice(self, key: str) -> str:
        return getattr(self, key) or DEFAULTS[key]

    @property
    def mixer(self) -> type:
        return MIXERS[self._choice("attention")]

    @property
    def positions(self) -> type:
        return POSITIONS[self._choice("pos_embed")]

    @property
    def stem(self) -> type:
        return STEMS[self._choice("patch_embed")]

    @property
    def key_class(self) -> type:
        return KEY_TYPES[self._choice("key")]

    @property
    def rotary(self) -> bool:
        """The positions rotate q and k inside the attention (RoPE)."""
        return POSITION_CHOICES[self._choice("pos_embed")].rotary

    @property
    def timm_default(self) -> bool:
        """Nothing for timm's attention, positions or patches to change (XCiT, or ViT's own choices)."""
        return all(self._choice(k) == DEFAULTS[k] for k in ("attention", "pos_embed", "patch_embed"))

    def stage(self, base: Shape, model: str) -> Shape:
        """``base`` (the stage of timm's ``model`` with its own choices) with this architecture's sizes and
        key, once each chosen class has checked it (ConfigError naming the key)."""
        if not self.timm_default and not base.plain:
            raise ConfigError(f"model: expected a ViT/DeiT with timm's plain Attention, PatchEmbed and learned "
                              f"position table (no qk_norm, scale_norm, gate or patch norm) for attention "
                              f"{self.attention}, pos_embed {self.pos_embed} and patch_embed {self.patch_embed}, "
                              f"given {model}")
        s = replace(base, size=self.attn_size or 0, rotary=self.rotary, charts=self.key_charts or base.charts,
                    aggregation=self.key_aggregation or base.aggregation, context=bool(self.key_context))
        for key, cls in (("attention", self.mixer), ("pos_embed", self.positions), ("patch_embed", self.stem)):
            cls.check(s, self._choice(key))
        return s

    def vit_kwargs(self, s: Shape) -> dict:
        """timm VisionTransformer arguments for the mixer, positions and stem at stage shape ``s``."""
        rotation = self.positions if self.rotary else None
        kwargs: dict = {"pos_embed": self.positions.timm_pos_embed}
        if self.mixer is not Softmax or rotation is not None:
            kwargs["attn_layer"] = self.mixer.layer(s, rotation)
        if self.stem is not LinearStem:
            kwargs["embed_layer"] = self.stem
        return kwargs


def vit_stage(host: nn.Module) -> Shape:
    """The stage shape of a timm VisionTransformer built with timm's own choices (its first block tells
    heads and biases); ``plain`` where the registered classes replace its layers exactly."""
    pe, attn = host.patch_embed, getattr(host.blocks[0], "attn", None)
    if type(attn) is not Attention or type(pe) is not PatchEmbed:   # parallel blocks (ViT-22B style), a hybrid stem
        return Shape(dim=host.embed_dim, prefix=host.num_prefix_tokens, plain=False)
    plain = isinstance(attn.q_norm, nn.Identity) and isinstance(attn.norm, nn.Identity) \
        and getattr(attn, "gate", None) is None and isinstance(pe.norm, nn.Identity)
    s = Shape(dim=host.embed_dim, heads=attn.num_heads, grid=tuple(pe.grid_size), prefix=host.num_prefix_tokens,
              qkv_bias=attn.qkv.bias is not None, proj_bias=attn.proj.bias is not None,
              in_chans=pe.proj.in_channels, patch=pe.patch_size[0], stem_bias=pe.proj.bias is not None,
              table_prefix=not host.no_embed_class)
    pos = getattr(host, "pos_embed", None)
    return replace(s, plain=plain and pos is not None and pos.numel() == Learned.params(s))


def install_key(model: nn.Module, arch: Arch) -> None:
    """Put the config's key design into a built host's fused-qkv attentions: its class installs itself
    (trainers.model.attention.manifold: the shared key puts nothing, a manifold key one per attention)."""
    arch.key_class.install(model, arch)
