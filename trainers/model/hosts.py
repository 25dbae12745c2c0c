"""The model families (spaces.choices.FAMILIES, told apart by the timm model name): how each builds timm's
model with the architecture keys, and what of it the registered classes replace.

- ``ViT`` (ViT, DeiT and any other timm VisionTransformer): the macro shape as timm's keyword arguments;
  the mixer as ``attn_layer``, the stem as ``embed_layer``, positions as ``pos_embed`` ('learn' | 'none';
  RoPE lives in the attention), found from a meta-device probe of one block. timm's own choices pass
  nothing, so timm's model is left untouched.
- ``XCiT``: keeps its cross-covariance attention, conv stem and Fourier positions; the macro shape only.
- ``Mixer``: timm's ``MlpMixer`` (Tolstikhin et al. 2021): no class token, mean pooling, no positions;
  ``depth`` is its ``num_blocks``, ``mlp_ratio`` its channel-mixing and ``token_mlp_ratio`` its
  token-mixing hidden width over d (timm's ``mlp_ratio=(tokens, channels)``). A stem other than
  ``linear`` replaces timm's ``stem`` (then timm's initialisation runs again over the whole model).
Every family then puts the manifold keys into the fused-qkv attentions (``install_key``).

``substitutions(arch, stage, blocks)``: for the cost model (trainers.model.cost), the registered classes whose
counts replace those of timm's default choices in the counted default model: (default class, chosen
class, how many, shape).
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import timm
import torch
from timm.models import build_model_with_cfg
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import ConfigError
from qkvsearch.trainers.model.architecture import Arch, install_key, vit_stage
from qkvsearch.trainers.model.attention.positions import Learned
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.attention.softmax import Softmax
from qkvsearch.trainers.model.attention.stems import LinearStem

__all__ = ["Host", "Mixer", "ViT", "XCiT", "timm_model"]


def _bad(field: str, expected: str, given: Any) -> ConfigError:
    return ConfigError(f"{field}: expected {expected}, given {show(given)}")


def timm_model(model: str, kwargs: dict, num_heads: int | None = None, create=timm.create_model) -> nn.Module:
    """timm's ``model`` (no pretrained weights) on the current default device; ConfigError naming the key."""
    try:
        return create(model, pretrained=False, **kwargs)
    except TypeError as err:  # e.g. a CNN: "__init__() got an unexpected keyword argument 'img_size'"
        raise _bad("model", f"a timm vision transformer with a fused qkv (XCiT, ViT, DeiT) or an MLP-Mixer "
                            f"accepting {sorted(kwargs)} ({err})", model) from err
    except AssertionError as err:  # "`patch_size` should divide image dimensions evenly", "dim % heads"
        text = str(err)
        if "patch_size" in text or not text:
            raise _bad("img_size", f"a multiple of {model}'s patch size ({err})", kwargs.get("img_size")) from err
        raise _bad("num_heads", f"a number of heads that divides embed_dim for {model} ({text})", num_heads) from err


class Host:
    """A family: ``create`` builds the model, ``stage`` reads the shape of timm's default model."""

    @classmethod
    def timm_kwargs(cls, arch: Arch) -> dict:
        return arch.macro_kwargs()

    @classmethod
    def create(cls, model: str, arch: Arch, kwargs: dict) -> nn.Module:
        host = timm_model(model, {**kwargs, **cls.timm_kwargs(arch)}, arch.num_heads)
        install_key(host, arch)
        return host

    @classmethod
    def read_stage(cls, host: nn.Module) -> Shape | None:
        """The shape the registered classes count at, read off timm's model with its own choices."""
        return None

    @classmethod
    def stage(cls, base: Shape | None, arch: Arch, model: str) -> Shape | None:
        """``base`` fitted to ``arch`` and checked by its classes (ConfigError naming the key)."""
        return base

    @classmethod
    def substitutions(cls, arch: Arch, s: Shape | None, blocks: int) -> list[tuple[type, type, int, Shape]]:
        return []

    @classmethod
    def qkv_free(cls, arch: Arch) -> bool:
        """The token mixing has no fused q/k/v for an embedding or a manifold key to replace."""
        return False

    @classmethod
    def qkv_free_params(cls, arch: Arch, s: Shape | None, blocks: int) -> int:
        """Parameters of q/k/v projections that are not fused-qkv sites (counted as the embedding's)."""
        return 0


class XCiT(Host):
    @classmethod
    def create(cls, model: str, arch: Arch, kwargs: dict) -> nn.Module:
        host = super().create(model, arch, kwargs)
        heads = host.blocks[0].attn.num_heads if len(host.blocks) else None   # timm's XCA asserts nothing
        if heads and host.embed_dim % heads:
            key, given = ("num_heads", heads) if arch.num_heads is not None else ("embed_dim", host.embed_dim)
            raise _bad(key, f"an embed_dim that {model}'s {heads} heads divide (embed_dim {host.embed_dim})"
                       if key == "embed_dim" else f"a number of heads that divides embed_dim {host.embed_dim} "
                                                  f"for {model}", given)
        return host


class ViT(Host):
    @classmethod
    def create(cls, model: str, arch: Arch, kwargs: dict) -> nn.Module:
        kwargs = {**kwargs, **cls.timm_kwargs(arch)}
        if not arch.timm_default:
            with torch.device("meta"):
                probe = timm_model(model, {**kwargs, "depth": 1}, arch.num_heads)  # one block tells the shape
            s = cls.stage(cls.read_stage(probe), arch, model)
            kwargs.update(arch.vit_kwargs(s))
        host = timm_model(model, kwargs, arch.num_heads)
        install_key(host, arch)
        return host

    @classmethod
    def read_stage(cls, host: nn.Module) -> Shape:
        return vit_stage(host)

    @classmethod
    def stage(cls, base: Shape | None, arch: Arch, model: str) -> Shape:
        return arch.stage(base, model)

    @classmethod
    def substitutions(cls, arch: Arch, s: Shape | None, blocks: int) -> list[tuple[type, type, int, Shape]]:
        if arch.timm_default:
            return []
        return [(Softmax, arch.mixer, blocks, s), (Learned, arch.positions, 1, s),
                (LinearStem, arch.stem, 1, s)]

    @classmethod
    def qkv_free(cls, arch: Arch) -> bool:
        return not arch.mixer.fused_qkv

    @classmethod
    def qkv_free_params(cls, arch: Arch, s: Shape | None, blocks: int) -> int:
        return 0 if arch.mixer.fused_qkv else blocks * arch.mixer.qkv_params(s)


class Mixer(Host):
    @classmethod
    def timm_kwargs(cls, arch: Arch) -> dict:
        default_tokens, default_channels = inspect.signature(MlpMixer).parameters["mlp_ratio"].default
        kwargs = {"num_blocks": arch.depth, "embed_dim": arch.embed_dim, "patch_size": arch.patch_size}
        if arch.mlp_ratio is not None or arch.token_mlp_ratio is not None:
            kwargs["mlp_ratio"] = (arch.token_mlp_ratio or default_tokens, arch.mlp_ratio or default_channels)
        return {k: v for k, v in kwargs.items() if v is not None}

    @classmethod
    def create(cls, model: str, arch: Arch, kwargs: dict) -> nn.Module:
        shape = cls.timm_kwargs(arch)
        if shape:  # timm's mixer_* entrypoints fix patch_size, num_blocks and embed_dim: build the class itself
            with torch.device("meta"):
                probe = timm_model(model, {})   # the entrypoint's own shape, at its own image size
            own = {"patch_size": probe.stem.patch_size[0], "num_blocks": len(probe.blocks),
                   "embed_dim": probe.embed_dim}
            host = timm_model(model, {**own, **kwargs, **shape}, create=partial(build_model_with_cfg, MlpMixer))
        else:
            host = timm_model(model, kwargs)
        if arch.stem is not LinearStem:
            s = cls.stage(cls.read_stage(host), arch, model)
            ref = host.stem.proj.weight
            host.stem = arch.stem(s.img, s.patch, s.in_chans, s.dim, bias=s.stem_bias, device=ref.device,
                                  dtype=ref.dtype)
            host.init_weights()   # timm's MLP-Mixer initialisation, the new stem included
        return host

    @classmethod
    def read_stage(cls, host: nn.Module) -> Shape:
        pe = host.stem
        return Shape(dim=host.embed_dim, grid=tuple(pe.grid_size), prefix=0, in_chans=pe.proj.in_channels,
                     patch=pe.patch_size[0], stem_bias=pe.proj.bias is not None)

    @classmethod
    def stage(cls, base: Shape | None, arch: Arch, model: str) -> Shape:
        arch.stem.check(base, arch.patch_embed)
        return base

    @classmethod
    def substitutions(cls, arch: Arch, s: Shape | None, blocks: int) -> list[tuple[type, type, int, Shape]]:
        return [] if arch.stem is LinearStem else [(LinearStem, arch.stem, 1, s)]

    @classmethod
    def qkv_free(cls, arch: Arch) -> bool:
        return True
