"""The model families (spaces.choices.FAMILIES, told apart by the timm model name and, for a name of none, timm's
module): how each builds timm's model with the architecture keys, and what of it the registered classes replace.

- ``ViT`` (ViT, DeiT and any other timm VisionTransformer): the macro shape as timm's keyword arguments;
  the mixer as ``attn_layer``, the stem as ``embed_layer``, positions as ``pos_embed`` ('learn' | 'none';
  RoPE lives in the attention), found from a meta-device probe of one block. timm's own choices pass
  nothing, so timm's model is left untouched.
- ``XCiT``: keeps its cross-covariance attention, conv stem and Fourier positions; the macro shape only.
- ``Mixer``: timm's ``MlpMixer`` (Tolstikhin et al. 2021): no class token, mean pooling, no positions;
  ``depth`` is its ``num_blocks``, ``mlp_ratio`` its channel-mixing and ``token_mlp_ratio`` its
  token-mixing hidden width over d (timm's ``mlp_ratio=(tokens, channels)``). A stem other than
  ``linear`` replaces timm's ``stem`` (then timm's initialisation runs again over the whole model).
- ``Timm``: any other timm transformer (Swin, PiT, Twins, CrossViT, CaiT, BEiT, ConViT, LeViT, EVA, ...), told from
  a ViT by timm's module of its entrypoint (trainers.model.choices.family_name): its entrypoint's shape and timm's
  own attention; only the q/k/v embedding changes it (at every site trainers.model.sites finds).
Every family then puts the manifold keys into the fused-qkv attentions (``install_key``; Timm refuses the key).

``substitutions(arch, stage, blocks)``: for the cost model (trainers.model.cost), the registered classes whose
counts replace those of timm's default choices in the counted default model: (default class, chosen
class, how many, shape).
"""
from __future__ import annotations

import contextlib
import inspect
import re
from functools import partial
from typing import Any

import timm
import torch
from timm.models import build_model_with_cfg
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import DESIGN_KEYS, KEYS, MACRO_KEYS, ConfigError
from qkvsearch.trainers.model.architecture import Arch, install_key, vit_stage
from qkvsearch.trainers.model.attention.positions import Learned
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.attention.softmax import Softmax
from qkvsearch.trainers.model.attention.stems import LinearStem
from qkvsearch.trainers.model.choices import timm_module
from qkvsearch.trainers.model.meta import on_meta, skip_meta_init

__all__ = ["Host", "Mixer", "Timm", "ViT", "XCiT", "timm_model"]


def _bad(field: str, expected: str, given: Any) -> ConfigError:
    return ConfigError(f"{field}: expected {expected}, given {show(given)}")


def timm_model(model: str, kwargs: dict, num_heads: int | None = None, create=timm.create_model) -> nn.Module:
    """timm's ``model`` (no pretrained weights) on the current default device; ConfigError naming the key. On the
    meta device its initialisation is skipped (trainers.model.meta: there is nothing to fill)."""
    kwargs = dict(kwargs)
    while True:
        try:
            with contextlib.ExitStack() as stack:
                if on_meta():
                    stack.enter_context(skip_meta_init())
                return create(model, pretrained=False, **kwargs)
        except TypeError as err:  # e.g. a CNN: "__init__() got an unexpected keyword argument 'img_size'"
            unknown = _UNEXPECTED.search(str(err))
            name = unknown.group(1) if unknown else None
            if name in kwargs and (name == "img_size" or name in NEUTRAL and kwargs[name] == NEUTRAL[name]):
                del kwargs[name]   # a model without the argument builds with its neutral value already
                continue
            raise _bad("model", f"a timm model accepting {sorted(k for k, v in kwargs.items() if v is not None)} "
                                f"({err})", model) from err
        except AssertionError as err:  # "`patch_size` should divide image dimensions evenly", "dim % heads"
            text = str(err)
            if num_heads is not None and "patch" not in text:
                raise _bad("num_heads", f"a number of heads that divides embed_dim for {model} ({text})",
                           num_heads) from err
            if kwargs.get("img_size") is not None:
                size = f"a multiple of {model}'s patch size" if "patch" in text else f"a size {model} is built at"
                raise _bad("img_size", f"{size} (timm: {text or 'a multiple of its patch size'})",
                           kwargs.get("img_size")) from err
            raise _bad("model", f"a timm model that builds with {_given(kwargs)} (timm: {text})", model) from err
        except (ValueError, RuntimeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as err:
            raise _bad("model", f"a timm model that builds with {_given(kwargs)} (timm: {type(err).__name__}: "
                                f"{err})", model) from err


# arguments build_model passes that change nothing at these values: a model without them is built without them;
# and a model without ``img_size`` takes any size (PVT v2: the counted forward runs it at the size asked)
NEUTRAL = {"drop_path_rate": 0.0, "in_chans": 3}
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def _given(kwargs: dict) -> str:
    given = {k: v for k, v in kwargs.items() if v is not None}
    return ", ".join(f"{k}={v}" for k, v in given.items()) or "its own arguments"


class Host:
    """A family: ``create`` builds the model, ``stage`` reads the shape of timm's default model."""

    tiles_patches = True    # its patches tile the image or it crops silently: an img_size they do not tile is refused
    supernet = True         # one-shot search can slice its tensors (trainers.supernet)

    @classmethod
    def check(cls, spec) -> None:
        """Raise the ConfigError of a key the family cannot take (``spec``: models.ModelConfig); nothing here."""

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


class Timm(Host):
    """Any other timm transformer (Swin, PiT, Twins, CrossViT, CaiT, BEiT, ConViT, LeViT, EVA, NaFlexViT, VOLO,
    MViTv2, ...): timm's model as its entrypoint builds it, at the image size and classes asked; the q/k/v embedding
    goes into every site trainers.model.sites finds. Its shape is its entrypoint's, so the macro keys, the
    attention designs (a ViT's or DeiT's) and the manifold key (installed in a ViT's, DeiT's or XCiT's fused
    qkv) are refused naming the key; a block's own key (``embedding.3``) where its ``blocks.3`` holds a site."""

    DEFAULT_DESIGN = {k: KEYS[k].default for k in DESIGN_KEYS if KEYS[k].applies_to == ()}
    tiles_patches = False   # timm's own model checks the sizes it takes (PVT's overlapping patches take any)
    supernet = False

    @classmethod
    def check(cls, spec) -> None:
        module = timm_module(spec.model)
        for key in MACRO_KEYS:
            value = getattr(spec.arch, key)
            if value is not None:
                raise _bad(key, f"null for model {spec.model} (a {module} model: its shape is its entrypoint's; "
                                f"{key} shapes a ViT, DeiT, XCiT or MLP-Mixer)", value)
        for key, default in cls.DEFAULT_DESIGN.items():
            value = getattr(spec.arch, key, None)
            if value is not None and value != default:
                why = ("the manifold key is installed in the fused qkv of a ViT, DeiT or XCiT" if key == "key" else
                       f"timm's own {module} keeps its {key.replace('_', ' ')}; the designs of {key} replace a "
                       f"ViT's or DeiT's")
                raise _bad(key, f"{default} for model {spec.model} ({why})", value)
