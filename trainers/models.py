"""timm vision transformers whose query/key/value embedding is replaced (see trainers.embeddings).

``build_model(cfg)`` builds a model from the flat trial config (model keys below; other keys are ignored):

  model            timm name: any XCiT, or a ViT/DeiT (any model whose attention has a fused ``qkv``
                   ``nn.Linear``); a registered ``qkv_<name>`` is accepted too and means ``<name>``
  embedding        linear | sne | psne | fsne                                  (default linear)
  hidden_width     int (absolute) | float (ratio of the token dim d, rounded) | "match" | None
                   None = the paper's Table 1 width: d/2 sne, 3d/4 psne, d fsne
                   "match" = the LARGEST width whose whole model has no more parameters than the
                   linear baseline (params are affine in h, so it is solved in closed form)
                   ignored for linear, whose resolved width is reported as 0
  code_size        fsne only, int >= 1 (default 8); giving it for another embedding is an error
  code_sharing     fsne only: shared (one (3, n) codes Parameter for the whole network) | per_block
  activation       relu | gelu                                                 (default relu)
  num_classes, img_size, in_chans (default 3), drop_path_rate (default 0.0)   passed to timm
  embed_class_attn bool (default False): also embed XCiT's class-attention blocks

``linear`` leaves timm's model untouched (its state_dict loads strictly, outputs are bitwise equal).

The variants are also registered with timm as ``qkv_<timm name>`` (every ``xcit_*`` model plus ViT/DeiT
tiny/small/base at patch 16, 224; ``register_qkv_model(name)`` adds others), taking the model keys as
keyword arguments::

    timm.create_model("qkv_xcit_nano_12_p16_224", embedding="fsne", code_size=8)
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import timm
import torch
from timm.models import register_model
from timm.models.cait import ClassAttn
from torch import nn

from qkvsearch.trainers.embeddings import (
    ACTIVATIONS,
    EMBEDDINGS,
    build_embedding,
    embedding_params,
    make_codes,
)

__all__ = [
    "EmbeddingSpec",
    "ModelConfig",
    "Site",
    "apply_embedding",
    "build_model",
    "find_sites",
    "register_qkv_model",
    "resolve_hidden_width",
]

CODE_SHARING = ("shared", "per_block")
DEFAULT_CODE_SIZE = 8
PAPER_WIDTH_RATIO = {"sne": 0.5, "psne": 0.75, "fsne": 1.0}  # Table 1: h as a fraction of d
REGISTERED_PREFIX = "qkv_"


def _bad(field: str, expected: str, given: Any) -> ValueError:
    return ValueError(f"{field}: expected {expected}, given {given!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _opt_int(cfg: dict, key: str, minimum: int, default: int | None) -> int | None:
    v = cfg.get(key)
    if v is None:
        return default
    if not _is_int(v) or v < minimum:
        raise _bad(key, f"an integer >= {minimum}", v)
    return int(v)


def _choice(cfg: dict, key: str, allowed: tuple[str, ...], default: str) -> str:
    v = cfg.get(key)
    if v is None:
        return default
    if v not in allowed:
        raise _bad(key, f"one of {allowed}", v)
    return v


def _check_width(v: Any) -> int | float | str | None:
    if v is None or v == "match":
        return v
    if _is_int(v):
        if v <= 0:
            raise _bad("hidden_width", 'an integer >= 1, a positive float ratio of d, "match" or None', v)
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0 and v == v:  # v == v: not NaN
        return float(v)
    raise _bad("hidden_width", 'an integer >= 1, a positive float ratio of d, "match" or None', v)


@dataclass(frozen=True)
class EmbeddingSpec:
    """The embedding keys, validated; ``code_size`` is resolved (8 for fsne when absent, else None)."""

    kind: str = "linear"
    hidden_width: int | float | str | None = None  # as given; resolve_width() turns it into an int
    code_size: int | None = None
    code_sharing: str = "shared"
    activation: str = "relu"
    class_attn: bool = False  # also embed class-attention blocks

    @classmethod
    def from_cfg(cls, cfg: dict) -> EmbeddingSpec:
        kind = _choice(cfg, "embedding", EMBEDDINGS, "linear")
        code_size = _opt_int(cfg, "code_size", 1, None)
        if kind == "fsne":
            code_size = DEFAULT_CODE_SIZE if code_size is None else code_size
        elif code_size is not None:
            raise _bad("code_size", f"None unless embedding is 'fsne' (embedding is {kind!r})", code_size)
        eca = cfg.get("embed_class_attn")
        if eca is not None and not isinstance(eca, bool):
            raise _bad("embed_class_attn", "a bool", eca)
        return cls(
            kind=kind,
            hidden_width=_check_width(cfg.get("hidden_width")),
            code_size=code_size,
            code_sharing=_choice(cfg, "code_sharing", CODE_SHARING, "shared"),
            activation=_choice(cfg, "activation", ACTIVATIONS, "relu"),
            class_attn=bool(eca),
        )


@dataclass(frozen=True)
class ModelConfig:
    """The model keys of a flat trial config, validated; ``None`` means timm's default."""

    model: str
    emb: EmbeddingSpec
    num_classes: int | None = None
    img_size: int | None = None
    in_chans: int = 3
    drop_path_rate: float = 0.0

    @classmethod
    def from_cfg(cls, cfg: dict) -> ModelConfig:
        name = cfg.get("model")
        if not isinstance(name, str) or not timm.is_model(host_name(name)):
            raise _bad("model", "the name of a timm model (e.g. 'xcit_nano_12_p16_224')", name)
        dpr = cfg.get("drop_path_rate")
        dpr = 0.0 if dpr is None else dpr
        if not isinstance(dpr, numbers.Real) or isinstance(dpr, bool) or not 0.0 <= dpr < 1.0:
            raise _bad("drop_path_rate", "a float in [0, 1)", dpr)
        return cls(
            model=host_name(name),
            emb=EmbeddingSpec.from_cfg(cfg),
            num_classes=_opt_int(cfg, "num_classes", 0, None),
            img_size=_opt_int(cfg, "img_size", 1, None),
            in_chans=_opt_int(cfg, "in_chans", 1, 3),
            drop_path_rate=float(dpr),
        )

    def create_host(self) -> nn.Module:
        """timm's own model (no pretrained weights) on the current default device."""
        kwargs = dict(num_classes=self.num_classes, img_size=self.img_size, in_chans=self.in_chans,
                      drop_path_rate=self.drop_path_rate)  # timm drops the None values itself
        try:
            return timm.create_model(self.model, pretrained=False, **kwargs)
        except TypeError as err:  # e.g. a CNN: "__init__() got an unexpected keyword argument 'img_size'"
            raise _bad("model", f"a timm vision transformer with a fused qkv (XCiT, ViT, DeiT) accepting "
                                f"{sorted(kwargs)} ({err})", self.model) from err


def host_name(name: str) -> str:
    """``qkv_<timm name>`` -> ``<timm name>``; other names unchanged."""
    if name.startswith(REGISTERED_PREFIX) and timm.is_model(name[len(REGISTERED_PREFIX):]):
        return name[len(REGISTERED_PREFIX):]
    return name


# ---------------------------------------------------------------------------------------------- sites


@dataclass(frozen=True)
class Site:
    """One place where a model embeds tokens into q, k, v."""

    path: str  # the attention module, e.g. "blocks.3.attn"
    class_attn: bool  # timm ClassAttn (XCiT/CaiT class attention: separate q, k, v linears)
    dim: int  # token dim d
    dim_out: int  # width of each of q, k, v
    linear_params: int  # parameters of the host's own q/k/v projections here


def _params(*modules: nn.Module) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def find_sites(model: nn.Module) -> tuple[Site, ...]:
    """Attention modules with a fused ``qkv`` nn.Linear (d -> 3 d_out), and timm ClassAttn modules."""
    sites = []
    for path, m in model.named_modules():
        qkv = getattr(m, "qkv", None)
        if isinstance(qkv, nn.Linear) and qkv.out_features % 3 == 0:
            sites.append(Site(path, False, qkv.in_features, qkv.out_features // 3, _params(qkv)))
        elif isinstance(m, ClassAttn):
            sites.append(Site(path, True, m.k.in_features, m.k.out_features, _params(m.q, m.k, m.v)))
    return tuple(sites)


# ---------------------------------------------------------------------------------------------- widths


def resolve_width(emb: EmbeddingSpec, sites: tuple[Site, ...], host_params: int) -> int:
    """The hidden width h of ``emb`` on a host with these (embedded) sites and total parameters.

    "match": params(h) = host_params - Σ linear + Σ (a_s·h + b_s) + codes is affine in h; the result
    is the largest integer h with params(h) <= host_params (closed form, no search).
    """
    if emb.kind == "linear":
        return 0
    d, w = sites[0].dim, emb.hidden_width
    if w is None:
        w = PAPER_WIDTH_RATIO[emb.kind]
    if isinstance(w, float):
        h = round(w * d)
        if h < 1:
            raise _bad("hidden_width", f"a ratio giving a width >= 1 at d={d}", emb.hidden_width)
        return h
    if w != "match":
        return w
    n = emb.code_size or 0
    b = sum(embedding_params(emb.kind, s.dim, 0, s.dim_out, n) for s in sites)  # params at h = 0
    a = sum(embedding_params(emb.kind, s.dim, 1, s.dim_out, n) for s in sites) - b  # params per unit of h
    budget = sum(s.linear_params for s in sites) - b - codes_params(emb, len(sites))
    h = budget // a
    if h < 1:
        raise _bad("hidden_width", f"'match' only where a width >= 1 fits the baseline ({emb.kind})", w)
    return h


def codes_params(emb: EmbeddingSpec, n_sites: int) -> int:
    """Code parameters of the whole network: 3·n once (shared) or per site (per_block); 0 unless fsne."""
    if emb.kind != "fsne":
        return 0
    return 3 * emb.code_size * (1 if emb.code_sharing == "shared" else n_sites)


@lru_cache(maxsize=64)
def host_summary(model: str, num_classes: int | None, img_size: int | None,
                 in_chans: int) -> tuple[int, tuple[Site, ...]]:
    """(total params, all q/k/v sites) of a timm model, built on the meta device (no weights, fast)."""
    with torch.device("meta"):
        host = ModelConfig(model, EmbeddingSpec(), num_classes, img_size, in_chans).create_host()
    return _params(host), find_sites(host)


def embedded_sites(emb: EmbeddingSpec, sites: tuple[Site, ...], model_name: str) -> tuple[Site, ...]:
    """The sites ``emb`` replaces: every fused-qkv site, plus class attention if ``class_attn``."""
    inc = tuple(s for s in sites if emb.class_attn or not s.class_attn)
    if not inc:
        raise _bad("model", "a timm model whose attention has a fused qkv nn.Linear (XCiT, ViT, DeiT)",
                   model_name)
    if len({(s.dim, s.dim_out) for s in inc}) > 1:
        raise _bad("model", "a model whose q/k/v sites all share one token dim", model_name)
    return inc


def resolve_hidden_width(cfg: dict) -> int:
    """The hidden width ``build_model(cfg)`` uses (0 for linear), without building the model."""
    spec = ModelConfig.from_cfg(cfg)
    params, sites = host_summary(spec.model, spec.num_classes, spec.img_size, spec.in_chans)
    return resolve_width(spec.emb, embedded_sites(spec.emb, sites, spec.model), params)


# ---------------------------------------------------------------------------------------------- models


class EmbeddedClassAttn(nn.Module):
    """timm's ClassAttn (XCiT/CaiT class attention) fed by a fused ``[q | k | v]`` embedding.

    q, k, v are embedded for all tokens (the non-linear embeddings share work across them); the class
    token's q then attends over all tokens exactly as in ClassAttn. Output: (B, 1, C).
    """

    def __init__(self, attn: ClassAttn, qkv: nn.Module):
        super().__init__()
        self.num_heads, self.scale, self.fused_attn = attn.num_heads, attn.scale, attn.fused_attn
        self.qkv = qkv
        self.attn_drop, self.proj, self.proj_drop = attn.attn_drop, attn.proj, attn.proj_drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, N, C/heads)
        q = q[:, :, :1]  # class token only: (B, heads, 1, C/heads)
        if self.fused_attn:
            x_cls = nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = self.attn_drop((q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1))
            x_cls = attn @ v
        x_cls = x_cls.transpose(1, 2).reshape(B, 1, C)
        return self.proj_drop(self.proj(x_cls))


def apply_embedding(
    model: nn.Module,
    embedding: str = "linear",
    hidden_width: int | float | str | None = None,
    code_size: int | None = None,
    code_sharing: str | None = "shared",
    activation: str | None = "relu",
    include_class_attn: bool = False,
) -> nn.Module:
    """Replace the q/k/v embedding of a timm model in place and return it (``linear``: untouched).

    Arguments are the embedding keys of the flat config (``include_class_attn`` = ``embed_class_attn``).
    New modules are created on the device and dtype of the projections they replace (meta included).
    The resolved settings are recorded on the model as the plain dict ``model.qkv_config``.
    """
    emb = EmbeddingSpec.from_cfg(dict(embedding=embedding, hidden_width=hidden_width, code_size=code_size,
                                      code_sharing=code_sharing, activation=activation,
                                      embed_class_attn=include_class_attn))
    name = getattr(model, "default_cfg", {}).get("architecture", type(model).__name__)
    sites = embedded_sites(emb, find_sites(model), name)
    h = resolve_width(emb, sites, _params(model))
    model.qkv_config = dict(embedding=emb.kind, hidden_width=h, code_size=emb.code_size,
                            code_sharing=emb.code_sharing if emb.kind == "fsne" else None,
                            activation=emb.activation, embed_class_attn=emb.class_attn)
    if emb.kind == "linear":
        return model
    codes = None
    for site in sites:
        attn = model.get_submodule(site.path)
        ref = attn.k.weight if site.class_attn else attn.qkv.weight
        with torch.device(ref.device):
            if emb.kind == "fsne" and (codes is None or emb.code_sharing == "per_block"):
                codes = make_codes(emb.code_size)  # (3, n); one Parameter object for every shared site
            new = build_embedding(emb.kind, site.dim, h, site.dim_out, emb.activation,
                                  emb.code_size or DEFAULT_CODE_SIZE, codes).to(ref.dtype)
        if site.class_attn:
            _set_submodule(model, site.path, EmbeddedClassAttn(attn, new))
        else:
            attn.qkv = new
    if codes is not None:
        model.no_weight_decay = partial(_no_weight_decay, getattr(model, "no_weight_decay", None))
    return model


CODES_PATTERN = "*.codes"  # fnmatch pattern, as timm's optimizer factory matches no_weight_decay names


def _no_weight_decay(inner) -> set[str]:
    """F-SNE codes are learned token-like vectors (as cls_token): timm's optimizer leaves them undecayed."""
    return (set(inner()) if callable(inner) else set()) | {CODES_PATTERN}


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def build_model(cfg: dict) -> nn.Module:
    """A timm model with the q/k/v embedding of the flat trial config ``cfg`` (unknown keys ignored)."""
    spec = ModelConfig.from_cfg(cfg)
    model = spec.create_host()
    e = spec.emb
    return apply_embedding(model, e.kind, e.hidden_width, e.code_size, e.code_sharing, e.activation,
                           e.class_attn)


# ---------------------------------------------------------------------------------------------- timm registry


def register_qkv_model(name: str) -> str:
    """Register ``qkv_<name>`` with timm (idempotent); returns the registered name.

    ``timm.create_model("qkv_<name>", embedding=..., hidden_width=..., code_size=..., code_sharing=...,
    activation=..., embed_class_attn=..., **timm_kwargs)`` builds ``<name>`` with that embedding.
    """
    reg = REGISTERED_PREFIX + name
    if reg in globals() and timm.is_model(reg):
        return reg

    def entrypoint(pretrained: bool = False, embedding: str = "linear", hidden_width=None, code_size=None,
                   code_sharing=None, activation=None, embed_class_attn: bool = False, **kwargs):
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
        return apply_embedding(model, embedding, hidden_width, code_size, code_sharing, activation,
                               embed_class_attn)

    entrypoint.__name__ = entrypoint.__qualname__ = reg
    entrypoint.__doc__ = f"timm {name} with a chosen q/k/v embedding (see trainers.models)."
    globals()[reg] = entrypoint  # timm lists it in this module's __all__, so it must exist here
    register_model(entrypoint)
    return reg


_DEFAULT_HOSTS = [f"{f}_{s}_patch16_224" for f in ("vit", "deit") for s in ("tiny", "small", "base")]
for _name in timm.list_models("xcit_*") + _DEFAULT_HOSTS:
    register_qkv_model(_name)
