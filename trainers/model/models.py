"""timm vision transformers whose query/key/value embedding is replaced (see trainers.model.embeddings).

``build_model(cfg)`` builds a model from the model and embedding keys of a flat trial config (declared,
with their defaults, in qkvsearch.spaces.keys.KEYS; other keys are ignored). Widths:

  hidden_width     int (absolute) | float (ratio of the token dim d, rounded) | "match" | "paper", per site
                   (a hierarchical model's stages differ in d):
                   "paper" = the paper's Table 1 width: d/2 sne, 3d/4 psne, d fsne
                   "match" = the LARGEST width whose sites (of each shape) have no more parameters than their
                   linear maps (params are affine in h, so it is solved in closed form)
  width            the solved width at the first site (0 for linear); used as is when the config carries it

``linear`` leaves timm's model untouched (its state_dict loads strictly, outputs are bitwise equal).

The architecture keys (attention, pos_embed, patch_embed, key, the macro shape; trainers.model.architecture)
decide the host: timm's model of the model's family built with them (``create_host``, trainers.model.hosts);
the embedding (a class of the registry trainers.model.choices.EMBEDDINGS) is then applied to the host's q/k/v
sites (trainers.model.sites: every attention that makes q, k and v by linear maps of its tokens, in any stage;
with ``key: manifold``, to its q and v only). timm's own model is untouched unless an architecture key differs
from its default. Whatever a model cannot take is a ConfigError naming the model, the key and why.

The variants are also registered with timm as ``qkv_<timm name>`` (trainers.model.registry).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from qkvsearch.spaces.blocks import block_keys, split_block_key
from qkvsearch.spaces.checks import PAPER_WIDTH
from qkvsearch.spaces.choices import EMBEDDING_CHOICES, Choice
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import MODEL_GROUPS, ConfigError, fill, names
from qkvsearch.trainers.model.architecture import Arch
from qkvsearch.trainers.model.choices import EMBEDDINGS, family_of
from qkvsearch.trainers.model.embeddings import make_codes
from qkvsearch.trainers.model.meta import skip_meta_init
from qkvsearch.trainers.model.sites import PARTS, Site, adapter_of, scan

__all__ = [
    "EmbeddingSpec",
    "create_host",
    "ModelConfig",
    "Site",
    "apply_embedding",
    "build_model",
    "find_sites",
    "served_sites",
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
        family = family_of(self.model)
        family.check(self)
        kwargs = dict(num_classes=self.num_classes, img_size=self.img_size, in_chans=self.in_chans,
                      drop_path_rate=self.drop_path_rate)  # timm drops the None values itself
        host = create_host(self.model, self.arch, kwargs)
        if family.tiles_patches:
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


def _params(*modules: nn.Module) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def find_sites(model: nn.Module) -> tuple[Site, ...]:
    """Every q/k/v site of ``model`` (trainers.model.sites): each attention that makes q, k and v by linear maps of
    its tokens, with its maps."""
    return tuple(scan(model).sites)


def served_sites(model: nn.Module, name: str) -> tuple[Site, ...]:
    """``find_sites``, or the ConfigError naming the model and the first attention no embedding can take (its
    path, its timm class and why)."""
    found = scan(model)
    if found.unserved:
        u = found.unserved[0]
        more = f"; and {len(found.unserved) - 1} more" if len(found.unserved) > 1 else ""
        raise _bad("model", f"a timm model whose attention makes q, k and v by linear maps of its tokens (at "
                            f"{u.path}, {u.cls.__name__}: {u.why}{more})", name)
    return tuple(found.sites)


_BLOCK_PATH = re.compile(r"^blocks\.(\d+)\.")


def block_of(path: str) -> int | None:
    """The index of the block (timm's ``blocks``) a module or parameter path is in, e.g. 3 for "blocks.3.attn";
    None outside them (XCiT's class attention, the stem, the head, a hierarchical model's stages)."""
    match = _BLOCK_PATH.match(path)
    return int(match.group(1)) if match else None


def site_block(site: Site) -> int | None:
    return block_of(site.path)


def site_embeddings(emb: EmbeddingSpec, sites: tuple[Site, ...],
                    host_params: int) -> list[tuple[Site, EmbeddingSpec, int]]:
    """(site, its embedding, its solved width h) for each embedded site: per-block keys decide their block's; a
    width given as a ratio of d is of each site's own token dim, and ``match`` is solved for each shape of site."""
    solved: dict[tuple, int] = {}
    out = []
    for site in sites:
        own = emb.at(site_block(site))
        out.append((site, own, _site_width(own, site, sites, solved)))
    return out


# ---------------------------------------------------------------------------------------------- widths


def _site_width(emb: EmbeddingSpec, site: Site, sites: tuple[Site, ...], solved: dict) -> int:
    """The hidden width h of ``emb`` at ``site`` (one of the embedded ``sites``).

    An int is every site's; a ratio (and "paper", Table 1's ratio) is of the site's token dim d, rounded;
    ``width`` (already solved) is the first site's, and of the sites of its shape. "match": per shape of site,
    params(h) = Σ linear - Σ (a_s·h + b_s) - codes is affine in h: the largest integer h whose sites of that shape
    (and the codes they hold) have no more parameters than their linear maps (closed form, no search).
    """
    if not emb.row.hidden:
        return 0
    if emb.width is not None and site.shape == sites[0].shape:
        return emb.width
    w = emb.hidden_width
    if w == PAPER_WIDTH:
        w = emb.row.paper_width   # Table 1: h as a fraction of d
    if isinstance(w, float):
        h = round(w * site.dim)
        if h < 1:
            raise _bad("hidden_width", f"a ratio giving a width >= 1 at d={site.dim}", emb.hidden_width)
        return h
    if w != "match":
        return w
    if site.shape not in solved:
        group = [s for s in sites if s.shape == site.shape]
        n, cls = emb.code_size or 0, EMBEDDINGS[emb.kind]
        b = sum(cls.site_params(s, 0, n) for s in group)  # params at h = 0
        a = sum(cls.site_params(s, 1, n) for s in group) - b  # per unit of h
        codes = codes_params(emb, tuple(group)) if emb.code_sharing != "shared" or site.shape == sites[0].shape else 0
        h = (sum(s.linear_params for s in group) - b - codes) // a
        if h < 1:
            raise _bad("hidden_width", f"'match' only where a width >= 1 fits the baseline ({emb.kind})", w)
        solved[site.shape] = h
    return solved[site.shape]


def resolve_width(emb: EmbeddingSpec, sites: tuple[Site, ...], host_params: int) -> int:
    """The hidden width h of ``emb`` at the first of the (embedded) sites: the config's ``width`` (0 for linear)."""
    if not emb.row.hidden or not sites:
        return 0
    return _site_width(emb, sites[0], sites, {})


def code_letters(sites: tuple[Site, ...]) -> str:
    """The parts the network's codes stand for: "qkv" (Cq, Ck, Cv), "qv" beside a manifold key."""
    made = "".join(s.parts for s in sites)
    return "".join(p for p in PARTS if p in made)


def codes_params(emb: EmbeddingSpec, sites: tuple[Site, ...]) -> int:
    """Code parameters of the whole network: 3·n once (shared) or per F-SNE site (per_block); 0 without an
    F-SNE site. (2·n with a manifold key: codes for q and v only.)"""
    fsne = tuple(s for s in sites if emb.at(site_block(s)).row.codes)
    if not fsne:
        return 0
    if emb.code_sharing == "shared":
        return len(code_letters(fsne)) * emb.code_size
    return sum(len(s.parts) for s in fsne) * emb.code_size


def embedded_sites(emb: EmbeddingSpec, sites: tuple[Site, ...], model_name: str,
                   qkv_free: bool = False) -> tuple[Site, ...]:
    """The sites ``emb`` replaces: every self- and cross-attention site, plus class attention if ``class_attn``
    (none where the token mixing has no q/k/v: ``qkv_free``, e.g. FNet or an MLP-Mixer). An embedding a site
    cannot take (P-SNE or F-SNE where q, k and v differ in width) refuses the model, naming the site and why."""
    inc = tuple(s for s in sites if emb.class_attn or not s.class_attn)
    if not inc and qkv_free:
        return inc
    if not inc:
        raise _bad("model", "a timm model with attention from linear q/k/v maps of its tokens (a ViT, DeiT, XCiT, "
                            "Swin, CaiT, BEiT, EVA, ...: the hosts page of the docs lists them)", model_name)
    blocks = {b for s in inc if (b := site_block(s)) is not None}
    for key, value in emb.blocks:   # a block's own key names a block of timm's ``blocks`` that holds a site
        if split_block_key(key)[1] not in blocks:
            where = f"blocks {min(blocks)}-{max(blocks)}" if blocks else "its stages, none in timm's blocks"
            raise _bad(key, f"null for model {model_name} (it has no q/k/v site in timm's blocks."
                            f"{split_block_key(key)[1]}: its sites are in {where})", value)
    for site in inc:
        own = emb.at(site_block(site))
        why = EMBEDDINGS[own.kind].refuse(site)
        if why:
            fits = [k for k in EMBEDDINGS if all(EMBEDDINGS[k].refuse(s) is None for s in inc)]
            key = "embedding" if own.kind == emb.kind else f"embedding.{site_block(site)}"
            raise _bad(key, f"{' or '.join(fits)} for model {model_name} (at {site.path}, {site.adapter}: {why})",
                       own.kind)
    return inc


# ---------------------------------------------------------------------------------------------- models


def apply_embedding(model: nn.Module, **embedding_keys) -> nn.Module:
    """Replace the q/k/v embedding of a timm model in place and return it (``linear``: untouched).

    Keyword arguments are the embedding keys of a trial config (spaces.keys, group "embedding":
    embedding, hidden_width, code_size, code_sharing, activation, embed_class_attn), plus ``width``
    when the width is already solved; absent or None ones take their declared defaults.
    Each embedded site's maps are replaced by the embedding's modules (``build_site``), nothing else of the
    attention; new modules are created on the device and dtype of the maps they replace (meta included).
    An attention the embedding cannot take raises ConfigError naming the model, the site and why, so a model is
    never returned with the embedding left out anywhere it was asked for. The resolved embedding keys are
    recorded on the model as the plain dict ``model.qkv_config``.
    """
    emb = EmbeddingSpec.from_cfg({k: v for k, v in embedding_keys.items() if v is not None})
    name = getattr(model, "default_cfg", {}).get("architecture", type(model).__name__)
    sites = embedded_sites(emb, served_sites(model, name), name, qkv_free(model))
    host_params = _params(model)
    placed = site_embeddings(emb, sites, host_params)
    model.qkv_config = dict(embedding=emb.kind, hidden_width=emb.hidden_width,
                            width=resolve_width(emb.at(None), sites, host_params), code_size=emb.code_size,
                            code_sharing=emb.code_sharing, activation=emb.activation,
                            embed_class_attn=emb.class_attn, **dict(emb.blocks))
    letters = code_letters(tuple(s for s, own, _ in placed if own.row.codes))
    codes = None
    for site, own, width in placed:
        if not own.row.hidden:
            continue
        attn = model.get_submodule(site.path)
        ref = next(attn.get_submodule(site.maps[0].child).parameters())
        with torch.device(ref.device), skip_meta_init():
            if own.row.codes and (codes is None or emb.code_sharing == "per_block"):
                site_letters = letters if emb.code_sharing == "shared" else site.parts
                codes = make_codes(emb.code_size, len(site_letters))  # (3, n); one Parameter for every shared site
            modules = EMBEDDINGS[own.kind].build_site(site, width, emb.activation, emb.code_size, codes,
                                                      site_letters if own.row.codes else PARTS)
        for child, module in modules.items():
            module = module.to(ref.dtype)
            module.qkv_map_of = site.at(child)   # what it replaced (sites.scan reads it)
            _set_submodule(attn, child, module)
        adapter_of(attn).prepare(attn)
    if codes is not None:
        model.no_weight_decay = partial(_no_weight_decay, getattr(model, "no_weight_decay", None))
    _check_installed(model, placed, name)
    return model


def _check_installed(model: nn.Module, placed, name: str) -> None:
    """Every map of every site given a non-linear embedding holds it (a model is never returned without it)."""
    for site, own, _ in placed:
        if not own.row.hidden:
            continue
        attn = model.get_submodule(site.path)
        left = [m.child for m in site.maps if not hasattr(attn.get_submodule(m.child), "qkv_map_of")]
        if left:
            raise _bad("embedding", f"an embedding {name} can take at {site.path} (its {', '.join(left)} kept "
                                    f"timm's map)", own.kind)


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
