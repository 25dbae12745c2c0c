"""Model cost from the flat trial config, without training and without a GPU.

``model_cost(cfg)`` -> {"params", "params_m", "embed_params", "gmacs", "width"}:

- params: total trainable parameters (a Parameter shared by several modules, such as the network-wide
  F-SNE codes, counts once), params_m = params / 1e6;
- embed_params: parameters of the q/k/v embeddings alone (codes included; with ``key: manifold``, the
  q/v embedding plus the manifold keys);
- gmacs: multiply-accumulates (1e9) of one image (batch 1) at the model's input size. MACs are
  ``torch.utils.flop_counter.FlopCounterMode`` FLOPs / 2: matmuls, convolutions and attention products
  only (not norms, softmax or activations), the convention of fvcore and of the XCiT paper's "GFLOPs";
  FFTs (FNet) by the convention of trainers.model.attention.fft (2.5·L·log2 L MACs a length-L transform);
- width: the solved hidden width (0 for linear; ``hidden_width`` is the requested one).

``resolve_trial(cfg)`` -> (resolved config, cost): a trial's config with every default filled, its width
solved (``width``) and its cost, computed once when the trial is built; everything downstream (the trial
process, its workers, records, Parquet, reports) takes them from there.

How: timm's model of the trial's family at its macro shape, with timm's own choices (softmax attention,
learned positions, PatchEmbed, the model's own q/k/v projections), is built and counted once on the meta
device per (model, num_classes, img_size, in_chans, macro shape) and cached (``base_profile``). Every
registered choice then replaces what it replaces by its class's own exact counts, the counts of the
classes production builds (trainers.model.choices; each checked against the built module by
tests/trainers/test_choices.py): the mixer of every block, the positions and the stem
(``Host.substitutions``), the key and the q/k/v embedding of every fused-qkv site. So a configuration
costs microseconds. ``measure_cost(cfg)`` builds and counts the whole variant itself (the slow, direct
check the counts are tested against).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import nn

from qkvsearch.spaces.keys import ConfigError, fill
from qkvsearch.trainers.model.architecture import Arch
from qkvsearch.trainers.model.attention.fft import flop_counter
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.choices import EMBEDDINGS, KEY_TYPES, MIXERS, embedding_classes, family_of
from qkvsearch.trainers.model.embeddings import Linear
from qkvsearch.trainers.model.models import (
    EmbeddingSpec,
    ModelConfig,
    Site,
    build_model,
    codes_params,
    embedded_sites,
    find_sites,
    resolve_width,
    site_block,
    site_embeddings,
)

__all__ = ["count_macs", "measure_cost", "model_cost", "resolve_trial"]


@dataclass(frozen=True)
class BaseProfile:
    """timm's model with its own choices: total params and MACs, its q/k/v sites with their token counts,
    the stage shape the registered classes count at and its number of blocks."""

    params: int
    macs: int
    sites: tuple[Site, ...]
    tokens: dict  # site path -> tokens N entering the site (batch 1)
    stage: Shape | None    # read off timm's model, before an architecture fits it (Host.stage)
    blocks: int


def input_size(model: nn.Module, img_size: int | None) -> tuple[int, int]:
    if img_size is not None:
        return img_size, img_size
    size = model.pretrained_cfg["input_size"]  # (C, H, W) of timm's default config
    return size[1], size[2]


def count_macs(model: nn.Module, in_chans: int, img_size: int | None) -> int:
    """MACs (= counted FLOPs / 2) of one eval forward of one image; runs on the model's device (meta ok)."""
    h, w = input_size(model, img_size)
    device = next(model.parameters()).device
    x = torch.zeros(1, in_chans, h, w, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), flop_counter() as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2


def _linear_macs(site: Site, tokens: int) -> int:
    """MACs of the host's own projections at a site: fused qkv on all tokens; ClassAttn's q on one."""
    if site.class_attn:
        return site.dim * site.dim_out + 2 * tokens * site.dim * site.dim_out
    return Linear.macs(site.dim, 0, tokens, site.dim_out, parts=site.parts)


@lru_cache(maxsize=64)
def base_profile(model: str, num_classes: int | None, img_size: int | None, in_chans: int,
                 macro: Arch) -> BaseProfile:
    """Build timm's model at the ``macro`` shape with timm's own choices on the meta device, count it, and
    record each site's token count and the stage shape."""
    with torch.device("meta"):
        linear = EmbeddingSpec.from_cfg({"embedding": "linear"})
        host = ModelConfig(model, linear, num_classes, img_size, in_chans, drop_path_rate=0.0,
                           arch=macro).create_host()  # counted only
    stage = family_of(model).read_stage(host)
    sites = find_sites(host)
    tokens: dict[str, int] = {}
    hooks = [host.get_submodule(s.path).register_forward_pre_hook(
        lambda _m, args, path=s.path: tokens.__setitem__(path, args[0].shape[1])) for s in sites]
    try:
        macs = count_macs(host, in_chans, img_size)
    finally:
        for hook in hooks:
            hook.remove()
    params = sum(p.numel() for p in host.parameters())
    return BaseProfile(params, macs, sites, tokens, stage, len(getattr(host, "blocks", ())))


def _keyed(sites: tuple[Site, ...], key: type) -> tuple[Site, ...]:
    """The sites as the key leaves them: a manifold key takes the k out of each fused [q | k | v]."""
    if key.parts == 3:
        return sites
    return tuple(s if s.class_attn else replace(s, linear_params=s.linear_params // 3 * key.parts, parts=key.parts)
                 for s in sites)


def model_cost(cfg: dict) -> dict:
    """Cost of ``build_model(cfg)`` (see the module docstring); unknown keys of ``cfg`` are ignored."""
    spec = ModelConfig.from_cfg(cfg)
    arch, family = spec.arch, family_of(spec.model)
    base = base_profile(spec.model, spec.num_classes, spec.img_size, spec.in_chans, arch.macro())
    stage = family.stage(base.stage, arch, spec.model)
    params, macs = base.params, base.macs
    for default, chosen, times, shape in family.substitutions(arch, stage, base.blocks):
        params += times * (chosen.params(shape) - default.params(shape))
        macs += times * (chosen.macs(shape) - default.macs(shape))
    # the key, then the embedding, replace q/k/v projections of the sites (fused qkv: the mixer keeps them)
    qkv_free = family.qkv_free(arch)
    sites = () if qkv_free else base.sites
    key, key_params, key_macs = arch.key_class, 0, 0
    keyed = _keyed(sites, key)
    for s, k in zip(sites, keyed):
        if k is not s:   # [q | k | v] -> [q | v] and a key apart
            tokens = base.tokens[s.path]
            at = Shape.of_tokens(s.dim, tokens, charts=arch.key_charts, aggregation=arch.key_aggregation)
            key_params, key_macs = key_params + key.params(at), key_macs + key.macs(at)
            params += k.linear_params - s.linear_params
            macs += _linear_macs(k, tokens) - _linear_macs(s, tokens)
    emb = spec.emb
    sites = embedded_sites(emb, keyed, spec.model, qkv_free)
    h = resolve_width(emb.at(None), sites, base.params)
    n = emb.code_size or 0
    embed_params = codes_params(emb, sites)
    for s, own, width in site_embeddings(emb, sites, base.params):   # each site by its block's embedding
        if not own.row.hidden:
            embed_params += s.linear_params
            continue
        tokens = base.tokens[s.path]
        site_params = EMBEDDINGS[own.kind].params(s.dim, width, s.dim_out, n, s.parts)
        site_macs = EMBEDDINGS[own.kind].macs(s.dim, width, tokens, s.dim_out, n, s.parts)
        embed_params += site_params
        params += site_params - s.linear_params
        macs += site_macs - _linear_macs(s, tokens)
    params += codes_params(emb, sites)
    params += key_params
    macs += key_macs
    embed_params += key_params + family.qkv_free_params(arch, stage, base.blocks)
    return {"params": params, "params_m": params / 1e6, "embed_params": embed_params, "gmacs": macs / 1e9,
            "width": h}


# Beyond what any one node holds (4e11 bytes of fp32 weights alone): a width no machine could train.
MAX_PARAMS = 10**11


def resolve_trial(cfg: dict) -> tuple[dict, dict]:
    """(config, cost) of one trial: every key filled (spaces.keys.fill), ``width`` solved, cost counted.

    Raises ConfigError (a BadInput) naming the key when the config cannot make a model.
    """
    config = fill(cfg)
    cost = model_cost(config)
    if cost["params"] > MAX_PARAMS:
        raise ConfigError(f"hidden_width: expected a width whose model fits a machine (at most {MAX_PARAMS:.0e} "
                          f"parameters), given {config['hidden_width']!r} ({cost['params']:.3g} parameters)")
    config["width"] = cost.pop("width")
    return config, cost


def _embedding_modules(model: nn.Module, spec: ModelConfig) -> list[nn.Module]:
    """The q/k/v embedding modules of a built model (for linear: the host's own projections)."""
    keys = [m for m in model.modules() if isinstance(m, tuple(KEY_TYPES.values()))]   # keys of their own
    keys += [p for m in model.modules() if isinstance(m, tuple(MIXERS.values())) for p in m.qkv_projections()]
    out = [m for m in model.modules() if isinstance(m, embedding_classes())]
    for s in find_sites(model):   # the host's projections still in place: the sites a linear embedding keeps
        if s.class_attn and not spec.emb.class_attn or spec.emb.at(site_block(s)).row.hidden:
            continue
        attn = model.get_submodule(s.path)
        out += [attn.q, attn.k, attn.v] if s.class_attn else [attn.qkv.qv if s.parts == 2 else attn.qkv]
    return keys + out


def measure_cost(cfg: dict) -> dict:
    """Like ``model_cost`` but by building the variant on the meta device and counting it (slow)."""
    spec = ModelConfig.from_cfg(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    embed = {id(p): p.numel() for m in _embedding_modules(model, spec) for p in m.parameters()}
    params = sum(p.numel() for p in model.parameters())
    macs = count_macs(model, spec.in_chans, spec.img_size)
    return {"params": params, "params_m": params / 1e6, "embed_params": sum(embed.values()),
            "gmacs": macs / 1e9, "width": model.qkv_config["width"]}
