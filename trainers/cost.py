"""Model cost from the flat trial config, without training and without a GPU.

``model_cost(cfg)`` -> {"params", "params_m", "embed_params", "gmacs", "width"}:

- params: total trainable parameters (a Parameter shared by several modules, such as the network-wide
  F-SNE codes, counts once), params_m = params / 1e6;
- embed_params: parameters of the q/k/v embeddings alone (codes included; with ``key: manifold``, the
  q/v embedding plus the manifold keys);
- gmacs: multiply-accumulates (1e9) of one image (batch 1) at the model's input size. MACs are
  ``torch.utils.flop_counter.FlopCounterMode`` FLOPs / 2: matmuls, convolutions and attention products
  only (not norms, softmax or activations), the convention of fvcore and of the XCiT paper's "GFLOPs";
  FFTs (FNet) by the convention of trainers.attention.fft (2.5·L·log2 L MACs a length-L transform);
- width: the solved hidden width (0 for linear; ``hidden_width`` is the requested one).

``resolve_trial(cfg)`` -> (resolved config, cost): a trial's config with every default filled, its width
solved (``width``) and its cost, computed once when the trial is built; everything downstream (the trial
process, its workers, records, Parquet, reports) takes them from there.

How: the linear baseline (timm's model with the trial's architecture keys: trainers.attention) is built
and counted once on the meta device per (model, num_classes, img_size, in_chans, architecture) and cached; each variant is then the baseline minus the
replaced q/k/v projections plus the closed-form cost of its embedding (trainers.embeddings), so a
configuration costs microseconds. ``measure_cost(cfg)`` builds and counts the variant itself (the slow,
direct check the closed form is tested against).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from qkvsearch.spaces.keys import ConfigError, fill
from qkvsearch.trainers.attention import Arch
from qkvsearch.trainers.attention.fft import flop_counter
from qkvsearch.trainers.attention.manifold import ManifoldKey
from qkvsearch.trainers.embeddings import FSNE, PSNE, SNE, embedding_macs, embedding_params
from qkvsearch.trainers.models import (
    EmbeddingSpec,
    ModelConfig,
    Site,
    build_model,
    codes_params,
    embedded_sites,
    find_sites,
    resolve_width,
)

__all__ = ["count_macs", "measure_cost", "model_cost", "resolve_trial"]


@dataclass(frozen=True)
class HostProfile:
    """The linear baseline: total params and MACs, its q/k/v sites and their token counts."""

    params: int
    macs: int
    sites: tuple[Site, ...]
    tokens: dict  # site path -> tokens N entering the site (batch 1)
    key_params: int = 0  # manifold keys (they belong to the q/k/v embedding)
    mixer: str | None = None


def _input_size(model: nn.Module, img_size: int | None) -> tuple[int, int]:
    if img_size is not None:
        return img_size, img_size
    size = model.pretrained_cfg["input_size"]  # (C, H, W) of timm's default config
    return size[1], size[2]


def count_macs(model: nn.Module, in_chans: int, img_size: int | None) -> int:
    """MACs (= counted FLOPs / 2) of one eval forward of one image; runs on the model's device (meta ok)."""
    h, w = _input_size(model, img_size)
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
    return embedding_macs("linear", site.dim, 0, tokens, site.dim_out, parts=site.parts)


@lru_cache(maxsize=64)
def host_profile(model: str, num_classes: int | None, img_size: int | None, in_chans: int,
                 arch: Arch | None = None) -> HostProfile:
    """Build timm's model on the meta device, count it, and record each site's token count."""
    arch = arch or Arch()
    with torch.device("meta"):
        linear = EmbeddingSpec.from_cfg({"embedding": "linear"})
        host = ModelConfig(model, linear, num_classes, img_size, in_chans, drop_path_rate=0.0,
                           arch=arch).create_host()  # counted only
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
    keys = sum(p.numel() for m in host.modules() if isinstance(m, ManifoldKey) for p in m.parameters())
    return HostProfile(params, macs, sites, tokens, keys, arch.attention)


def model_cost(cfg: dict) -> dict:
    """Cost of ``build_model(cfg)`` (see the module docstring); unknown keys of ``cfg`` are ignored."""
    spec = ModelConfig.from_cfg(cfg)
    host = host_profile(spec.model, spec.num_classes, spec.img_size, spec.in_chans, spec.arch)
    emb = spec.emb
    sites = embedded_sites(emb, host.sites, spec.model, host.mixer)
    h = resolve_width(emb, sites, host.params)
    n = emb.code_size or 0
    kind = emb.kind
    lin_params = sum(s.linear_params for s in sites)
    lin_macs = sum(_linear_macs(s, host.tokens[s.path]) for s in sites)
    if kind == "linear":
        embed_params, embed_macs = lin_params, lin_macs
    else:
        embed_params = codes_params(emb, sites) + sum(
            embedding_params(kind, s.dim, h, s.dim_out, n, s.parts) for s in sites)
        embed_macs = sum(embedding_macs(kind, s.dim, h, host.tokens[s.path], s.dim_out, n, s.parts)
                         for s in sites)
    params = host.params - lin_params + embed_params
    macs = host.macs - lin_macs + embed_macs
    return {"params": params, "params_m": params / 1e6, "embed_params": embed_params + host.key_params,
            "gmacs": macs / 1e9, "width": h}


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
    keys = [m for m in model.modules() if isinstance(m, ManifoldKey)]
    if spec.emb.kind != "linear":
        return keys + [m for m in model.modules() if isinstance(m, (SNE, PSNE, FSNE))]
    out = []
    for s in embedded_sites(spec.emb, find_sites(model), spec.model, spec.arch.attention):
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
