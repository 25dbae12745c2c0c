"""timm vision transformers whose query/key/value embedding is replaced (see trainers.model.embeddings).

``build_model(cfg)`` builds a model from the model and embedding keys of a flat trial config (declared,
with their defaults, in qkvsearch.spaces.keys.KEYS; other keys are ignored). Widths:

  hidden_width     int (absolute) | float (ratio of the token dim d, rounded) | "match" | "paper"
                   "paper" = the paper's Table 1 width: d/2 sne, 3d/4 psne, d fsne
                   "match" = the LARGEST width whose whole model has no more parameters than the
                   linear baseline (params are affine in h, so it is solved in closed form)
  width            the solved width (0 for linear); used as is when the config carries it

``linear`` leaves timm's model untouched (its state_dict loads strictly, outputs are bitwise equal).

The architecture keys (attention, pos_embed, patch_embed, key, the macro shape; trainers.model.architecture)
decide the host: timm's model of the model's family built with them (``create_host``, trainers.model.hosts);
the embedding (a class of the registry trainers.model.choices.EMBEDDINGS) is then applied to the host's q/k/v
sites (with ``key: manifold``, to its q and v only). timm's own model is untouched unless an architecture
key differs from its default.

The variants are also registered with timm as ``qkv_<timm name>`` (trainers.model.registry).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from timm.models.cait import ClassAttn
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from qkvsearch.spaces.blocks import block_keys, split_block_key
from qkvsearch.spaces.checks import PAPER_WIDTH
from qkvsearch.spaces.choices import EMBEDDING_CHOICES, Choice
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import MODEL_GROUPS, ConfigError, fill, names
from qkvsearch.trainers.model.architecture import Arch
from qkvsearch.trainers.model.attention.manifold import KeyedQKV
from qkvsearch.trainers.model.choices import EMBEDDINGS, family_of
from qkvsearch.trainers.model.embeddings import make_codes

__all__ = [
    "EmbeddingSpec",
    "create_host",
    "ModelConfig",
    "Site",
    "apply_embedding",
    "build_model",
    "find_sites",
]


def _bad(field: str, expected: str, given: Any) -> ConfigError:
    return ConfigError(f"{field}: expected {expected}, given {show(given)}")


@dataclass(frozen=True)
class EmbeddingSpec:
    """The embedding keys of a filled config (spaces.keys.fill: defaults are the declared ones)."""

    kind: str
    hidden_width: int | float | str   # as requested; resolve_width() turns it into an int
    code_size: int | None
    code_sharing: str | None
    activation: str
    class_attn: bool                  # also embed class-attention blocks
    width: int | None = None          # the solved width, when the config carries it
    blocks: tuple = ()                # per-block embedding keys, as sorted (name, value) pairs (spaces.blocks)

    @classmethod
    def from_cfg(cls, cfg: dict) -> EmbeddingSpec:
        cfg = fill(cfg, ("embedding",))
        return cls(kind=cfg["embedding"], hidden_width=cfg["hidden_width"], code_size=cfg["code_size"],
                   code_sharing=cfg["code_sharing"], activation=cfg["activation"],
                   class_attn=cfg["embed_class_attn"], width=cfg.get("width"),
                   blocks=tuple((k, cfg[k]) for k in block_keys(cfg, names("embedding"))))

    @property
    def row(self) -> Choice:
        """The embedding's facts (spaces.choices): a hidden layer, codes, the paper's width."""
        return EMBEDDING_CHOICES[self.kind]

    def at(self, block: int | None) -> EmbeddingSpec:
        """The embedding of one block's sites (None: a site outside ``blocks``): the block's own embedding and
        width where the config gives them; a width of its own is solved again (``width`` is the config's)."""
        own = {split_block_key(k)[0]: v for k, v in self.blocks if split_block_key(k)[1] == block}
        if not own:
            return replace(self, blocks=())
        kind, hidden = own.get("embedding", self.kind), own.get("hidden_width", self.hidden_width)
        if kind == self.kind and hidden == self.hidden_width:
            return replace(self, blocks=())
        return replace(self, kind=kind, hidden_width=hidden, width=None, blocks=())


@dataclass(frozen=True)
class ModelConfig:
    """The model keys of a filled config; ``None`` means timm's default."""

    model: str
    emb: EmbeddingSpec
    num_classes: int | None
    img_size: int | None
    in_chans: int
    drop_path_rate: float
    arch: Arch = Arch()

    @classmethod
    def from_cfg(cls, cfg: dict) -> ModelConfig:
        cfg = fill(cfg, MODEL_GROUPS)
        return cls(model=cfg["model"], emb=EmbeddingSpec.from_cfg(cfg), num_classes=cfg["num_classes"],
                   img_size=cfg["img_size"], in_chans=cfg["in_chans"], drop_path_rate=cfg["drop_path_rate"],
                   arch=Arch.from_cfg(cfg))

    def create_host(self) -> nn.Module:
        """timm's model (no pretrained weights) with the architecture keys, on the current default device."""
        kwargs = dict(num_classes=self.num_classes, img_size=self.img_size, in_chans=self.in_chans,
                      drop_path_rate=self.drop_path_rate)  # timm drops the None values itself
        host = create_host(self.model, self.arch, kwargs)
        self._check_patches(host)
        return host

    def _check_patches(self, host: nn.Module) -> None:
        """A ViT crops an image its patches do not tile, silently: refuse such an img_size."""
        embed = getattr(host, "patch_embed", None) or getattr(host, "stem", None)   # ViT, XCiT / MLP-Mixer
        patch = getattr(embed, "patch_size", None)
        patch = patch[0] if isinstance(patch, (tuple, list)) else patch
        if self.img_size is not None and isinstance(patch, int) and self.img_size % patch:
            raise _bad("img_size", f"a multiple of {self.model}'s patch size {patch}", self.img_size)


def create_host(model: str, arch: Arch, kwargs: dict) -> nn.Module:
    """timm's ``model`` built with ``kwargs`` and the architecture ``arch`` by its family (trainers.model.hosts)."""
    return family_of(model).create(model, arch, kwargs)


# ---------------------------------------------------------------------------------------------- sites


@dataclass(frozen=True)
class Site:
    """One place where a model embeds tokens into q, k, v."""

    path: str  # the attention module, e.g. "blocks.3.attn"
    class_attn: bool  # timm ClassAttn (XCiT/CaiT class attention: separate q, k, v linears)
    dim: int  # token dim d
    dim_out: int  # width of each of q, k, v
    linear_params: int  # parameters of the host's own q/k/v projections here
    parts: int = 3  # 3: the site embeds q, k, v; 2: q and v (the key is a manifold key)


def _params(*modules: nn.Module) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def find_sites(model: nn.Module) -> tuple[Site, ...]:
    """Attention modules with a fused ``qkv`` nn.Linear (d -> 3 d_out), and timm ClassAttn modules."""
    sites = []
    for path, m in model.named_modules():
        qkv = getattr(m, "qkv", None)
        if isinstance(qkv, KeyedQKV):  # a manifold key: q and v only
            qv, parts = qkv.qv, type(qkv.key).parts
            dim = qv.in_features if isinstance(qv, nn.Linear) else qv.dim
            dim_out = qv.out_features // parts if isinstance(qv, nn.Linear) else qv.dim_out
            sites.append(Site(path, False, dim, dim_out, _params(qv), parts=parts))
        elif isinstance(qkv, nn.Linear) and qkv.out_features % 3 == 0:
            sites.append(Site(path, False, qkv.in_features, qkv.out_features // 3, _params(qkv)))
        elif isinstance(m, ClassAttn):
            sites.append(Site(path, True, m.k.in_features, m.k.out_features, _params(m.q, m.k, m.v)))
    return tuple(sites)


_BLOCK_PATH = re.compile(r"^blocks\.(\d+)\.")


def block_of(path: str) -> int | None:
    """The index of the block (timm's ``blocks``) a module or parameter path is in, e.g. 3 for "blocks.3.attn";
    None outside them (XCiT's class attention, the stem, the head)."""
    match = _BLOCK_PATH.match(path)
    return int(match.group(1)) if match else None


def site_block(site: Site) -> int | None:
    return block_of(site.path)


def site_embeddings(emb: EmbeddingSpec, sites: tuple[Site, ...], host_params: int) -> list[tuple[Site, EmbeddingSpec, int]]:
    """(site, its embedding, its solved width h) for each embedded site: per-block keys decide their block's."""
    out = []
    for site in sites:
        own = emb.at(site_block(site))
        out.append((site, own, resolve_width(own, sites, host_params)))
    return out


# ---------------------------------------------------------------------------------------------- widths


def resolve_width(emb: EmbeddingSpec, sites: tuple[Site, ...], host_params: int) -> int:
    """The hidden width h of ``emb`` on a host with these (embedded) sites and total parameters.

    "match": params(h) = host_params - Σ linear + Σ (a_s·h + b_s) + codes is affine in h; the result
    is the largest integer h with params(h) <= host_params (closed form, no search).
    """
    if not emb.row.hidden:
        return 0
    if emb.width is not None:
        return emb.width
    d, w = sites[0].dim, emb.hidden_width
    if w == PAPER_WIDTH:
        w = emb.row.paper_width   # Table 1: h as a fraction of d
    if isinstance(w, float):
        h = round(w * d)
        if h < 1:
            raise _bad("hidden_width", f"a ratio giving a width >= 1 at d={d}", emb.hidden_width)
        return h
    if w != "match":
        return w
    n, cls = emb.code_size or 0, EMBEDDINGS[emb.kind]
    b = sum(cls.params(s.dim, 0, s.dim_out, n, s.parts) for s in sites)  # params at h = 0
    a = sum(cls.params(s.dim, 1, s.dim_out, n, s.parts) for s in sites) - b  # per unit of h
    budget = sum(s.linear_params for s in sites) - b - codes_params(emb, sites)
    h = budget // a
    if h < 1:
        raise _bad("hidden_width", f"'match' only where a width >= 1 fits the baseline ({emb.kind})", w)
    return h


def codes_params(emb: EmbeddingSpec, sites: tuple[Site, ...]) -> int:
    """Code parameters of the whole network: 3·n once (shared) or per F-SNE site (per_block); 0 without an
    F-SNE site. (2·n with a manifold key: codes for q and v only.)"""
    fsne = [s for s in sites if emb.at(site_block(s)).row.codes]
    if not fsne:
        return 0
    return fsne[0].parts * emb.code_size * (1 if emb.code_sharing == "shared" else len(fsne))


def embedded_sites(emb: EmbeddingSpec, sites: tuple[Site, ...], model_name: str,
                   qkv_free: bool = False) -> tuple[Site, ...]:
    """The sites ``emb`` replaces: every fused-qkv site, plus class attention if ``class_attn``
    (none where the token mixing has no fused q/k/v: ``qkv_free``, e.g. FNet or an MLP-Mixer)."""
    inc = tuple(s for s in sites if emb.class_attn or not s.class_attn)
    if not inc and qkv_free:
        return inc
    if not inc:
        raise _bad("model", "a timm model whose attention has a fused qkv nn.Linear (XCiT, ViT, DeiT)",
                   model_name)
    if len({(s.dim, s.dim_out) for s in inc}) > 1:  # (mixed parts: only linear, see keys.check_combinations)
        raise _bad("model", "a model whose q/k/v sites all share one token dim", model_name)
    return inc


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


def apply_embedding(model: nn.Module, **embedding_keys) -> nn.Module:
    """Replace the q/k/v embedding of a timm model in place and return it (``linear``: untouched).

    Keyword arguments are the embedding keys of a trial config (spaces.keys, group "embedding":
    embedding, hidden_width, code_size, code_sharing, activation, embed_class_attn), plus ``width``
    when the width is already solved; absent or None ones take their declared defaults.
    New modules are created on the device and dtype of the projections they replace (meta included).
    The resolved embedding keys are recorded on the model as the plain dict ``model.qkv_config``.
    """
    emb = EmbeddingSpec.from_cfg({k: v for k, v in embedding_keys.items() if v is not None})
    name = getattr(model, "default_cfg", {}).get("architecture", type(model).__name__)
    sites = embedded_sites(emb, find_sites(model), name, qkv_free(model))
    host_params = _params(model)
    h = resolve_width(emb.at(None), sites, host_params)
    model.qkv_config = dict(embedding=emb.kind, hidden_width=emb.hidden_width, width=h,
                            code_size=emb.code_size, code_sharing=emb.code_sharing,
                            activation=emb.activation, embed_class_attn=emb.class_attn, **dict(emb.blocks))
    codes = None
    for site, own, width in site_embeddings(emb, sites, host_params):
        if not own.row.hidden:
            continue
        attn = model.get_submodule(site.path)
        ref = attn.k.weight if site.class_attn else (attn.qkv.qv if site.parts == 2 else attn.qkv).weight
        with torch.device(ref.device):
            if own.row.codes and (codes is None or emb.code_sharing == "per_block"):
                codes = make_codes(emb.code_size, site.parts)  # (3, n); one Parameter for every shared site
            new = EMBEDDINGS[own.kind].build(site.dim, width, site.dim_out, emb.activation, emb.code_size, codes,
                                             site.parts).to(ref.dtype)
        if site.class_attn:
            _set_submodule(model, site.path, EmbeddedClassAttn(attn, new))
        elif site.parts == 2:
            attn.qkv.qv = new
        else:
            attn.qkv = new
    if codes is not None:
        model.no_weight_decay = partial(_no_weight_decay, getattr(model, "no_weight_decay", None))
    return model


def qkv_free(model: nn.Module) -> bool:
    """The model's token mixing has no fused q/k/v (FNet, Linformer with shared keys and values, MLP-Mixer)."""
    return isinstance(model, MlpMixer) or any(getattr(type(m), "fused_qkv", True) is False for m in model.modules())


CODES_PATTERN = "*.codes"  # fnmatch pattern, as timm's optimizer factory matches no_weight_decay names


def _no_weight_decay(inner) -> set[str]:
    """F-SNE codes are learned token-like vectors (as cls_token): timm's optimizer leaves them undecayed."""
    return (set(inner()) if callable(inner) else set()) | {CODES_PATTERN}


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def build_model(cfg: dict) -> nn.Module:
    """A timm model with the q/k/v embedding of the flat trial config ``cfg`` (keys of other groups
    are ignored; a ``width`` already solved is used as is)."""
    spec = ModelConfig.from_cfg(cfg)
    e = spec.emb
    return apply_embedding(spec.create_host(), embedding=e.kind, hidden_width=e.hidden_width,
                           code_size=e.code_size, code_sharing=e.code_sharing, activation=e.activation,
                           embed_class_attn=e.class_attn, width=e.width, **dict(e.blocks))
