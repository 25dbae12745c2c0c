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
- width: the solved hidden width at the first site (0 for linear; ``hidden_width`` is the requested one).

``resolve_trial(cfg)`` -> (resolved config, cost): a trial's config with every default filled, its width
solved (``width``) and its cost, computed once when the trial is built; everything downstream (the trial
process, its workers, records, Parquet, reports) takes them from there.

How: timm's model of the trial's family at its macro shape, with timm's own choices (softmax attention,
learned positions, PatchEmbed, the model's own q/k/v projections), is built and counted once on the meta
device per (model, num_classes, img_size, in_chans, macro shape) and cached (``base_profile``). Every
registered choice then replaces what it replaces by its class's own exact counts, the counts of the
classes production builds (trainers.model.choices; each checked against the built module by
tests/trainers/test_choices.py): the mixer of every block, the positions and the stem
(``Host.substitutions``), the key and the q/k/v embedding of every q/k/v site (trainers.model.sites: each map's
MACs over the rows it saw in the counted forward, all windows of a Swin, the class token alone for a class
attention's q). So a configuration costs microseconds. ``measure_cost(cfg)`` builds and counts the whole
variant itself (the slow, direct check the counts are tested against).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache, partial

import torch
from torch import nn

from qkvsearch.spaces.blocks import block_keys, split_block_key
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import QUANT_KEYS, ConfigError, fill
from qkvsearch.trainers.model.architecture import Arch
from qkvsearch.trainers.model.attention.fft import flop_counter
from qkvsearch.trainers.model.attention.shape import Shape
from qkvsearch.trainers.model.choices import EMBEDDINGS, KEY_TYPES, MIXERS, family_of
from qkvsearch.trainers.model.embeddings import Linear
from qkvsearch.trainers.model.meta import skip_meta_init
from qkvsearch.trainers.model.models import (
    EmbeddingSpec,
    ModelConfig,
    Site,
    build_model,
    codes_params,
    embedded_sites,
    find_sites,
    resolve_width,
    served_sites,
    site_embeddings,
)
from qkvsearch.trainers.model.sites import PARTS, adapter_of

__all__ = ["count_macs", "measure_cost", "model_cost", "resolve_trial"]


@dataclass(frozen=True)
class BaseProfile:
    """timm's model with its own choices: total params and MACs, its q/k/v sites with the rows each map sees, the
    stage shape the registered classes count at and its number of blocks."""

    params: int
    macs: int
    sites: tuple[Site, ...]
    rows: dict  # (site path, map child) -> (rows, calls): the vectors the map embeds in one forward (batch 1)
    stage: Shape | None    # read off timm's model, before an architecture fits it (Host.stage)
    blocks: int

    def site_rows(self, site: Site) -> dict[str, tuple[int, int]]:
        """map child -> (rows, calls) of one site (a map a manifold key narrowed, ``qkv.qv``, sees what ``qkv`` saw)."""
        return {m.child: self.rows[(site.path, m.child.removesuffix(".qv"))] for m in site.maps}


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
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    try:
        # no parameter requires grad while counting: a view of one made under no_grad (CaiT's expanded class token
        # fed to a block) would require grad with no grad_fn, which the flop counter's module tracker refuses
        for p in params:
            p.requires_grad_(False)
        with torch.no_grad(), flop_counter() as counter:
            model(x)
    finally:
        for p in params:
            p.requires_grad_(True)
        model.train(was_training)
    return counter.get_total_flops() // 2


def _forward_error(model: str, img_size: int | None, err: Exception) -> ConfigError:
    text = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    if img_size is not None:
        return ConfigError(f"img_size: expected a size {model} runs at (timm: {text}), given {img_size}")
    return ConfigError(f'model: expected a timm model whose forward runs at its own size (timm: {text}), '
                       f'given "{model}"')


@lru_cache(maxsize=64)
def base_profile(model: str, num_classes: int | None, img_size: int | None, in_chans: int,
                 macro: Arch) -> BaseProfile:
    """Build timm's model at the ``macro`` shape with timm's own choices on the meta device, count it, and
    record the rows each q/k/v map of each site sees and the stage shape."""
    with torch.device("meta"):
        linear = EmbeddingSpec.from_cfg({"embedding": "linear"})
        host = ModelConfig(model, linear, num_classes, img_size, in_chans, drop_path_rate=0.0,
                           arch=macro).create_host()  # counted only
    stage = family_of(model).read_stage(host)
    sites = served_sites(host, model)
    for s in sites:   # the maps run as modules, as they will once embedded (BEiT: q/v biases added apart)
        adapter_of(host.get_submodule(s.path)).prepare(host.get_submodule(s.path))
    rows: dict[tuple[str, str], list[int]] = {(s.path, m.child): [0, 0] for s in sites for m in s.maps}

    def seen(key, _module, args):
        x = args[0]
        rows[key][0] += x.numel() // x.shape[-1]
        rows[key][1] += 1

    hooks = [host.get_submodule(f"{s.path}.{m.child}").register_forward_pre_hook(partial(seen, (s.path, m.child)))
             for s in sites for m in s.maps]
    try:
        macs = count_macs(host, in_chans, img_size)
    except (RuntimeError, AssertionError, ValueError, IndexError, TypeError, NotImplementedError) as err:
        raise _forward_error(model, img_size, err) from err
    finally:
        for hook in hooks:
            hook.remove()
    unseen = [f"{path}.{child}" for (path, child), (n, _) in rows.items() if not n]
    if unseen:   # a map the forward does not call as a module could not be counted, nor its embedding run
        raise ConfigError(f"model: expected a timm model whose attention calls its q/k/v maps as modules (its "
                          f"{unseen[0]} is not called{f', nor {len(unseen) - 1} more' if len(unseen) > 1 else ''}), "
                          f'given "{model}"')
    params = sum(p.numel() for p in host.parameters())
    return BaseProfile(params, macs, sites, {k: tuple(v) for k, v in rows.items()}, stage,
                       len(getattr(host, "blocks", ())))


def _keyed(sites: tuple[Site, ...], key: type) -> tuple[Site, ...]:
    """The sites as the key leaves them: a manifold key takes the k out of each fused [q | k | v]."""
    if key.parts == 3:
        return sites
    out = []
    for s in sites:
        fused = [m for m in s.maps if m.parts == PARTS and m.child == "qkv"]
        if not fused:
            out.append(s)
            continue
        m = fused[0]
        w = m.widths[0]
        qv = replace(m, child="qkv.qv", parts="qv", widths=(w, w), params=m.dim * 2 * w + (2 * w if m.bias else 0))
        out.append(s.with_maps((qv,)))
    return tuple(out)


def model_cost(cfg: dict) -> dict:
    """Cost of ``build_model(cfg)`` (see the module docstring); unknown keys of ``cfg`` are ignored."""
    spec = ModelConfig.from_cfg(cfg)
    arch, family = spec.arch, family_of(spec.model)
    family.check(spec)
    base = base_profile(spec.model, spec.num_classes, spec.img_size, spec.in_chans, arch.macro())
    for key in block_keys(cfg, QUANT_KEYS):   # a block's own precision names one of timm's ``blocks``
        if split_block_key(key)[1] >= base.blocks:
            where = (f"{base.blocks} blocks in timm's blocks" if base.blocks
                     else "its blocks in stages, none in timm's blocks")
            raise ConfigError(f"{key}: expected null for model {spec.model} (it has {where}), given {show(cfg[key])}")
    stage = family.stage(base.stage, arch, spec.model)
    params, macs = base.params, base.macs
    for default, chosen, times, shape in family.substitutions(arch, stage, base.blocks):
        params += times * (chosen.params(shape) - default.params(shape))
        macs += times * (chosen.macs(shape) - default.macs(shape))
    # the key, then the embedding, replace q/k/v maps of the sites (fused qkv: the mixer keeps them)
    qkv_free = family.qkv_free(arch)
    sites = () if qkv_free else base.sites
    key, key_params, key_macs = arch.key_class, 0, 0
    keyed = _keyed(sites, key)
    for s, k in zip(sites, keyed):
        if k is not s:   # [q | k | v] -> [q | v] and a key apart
            rows = base.site_rows(s)
            at = Shape.of_tokens(s.dim, rows["qkv"][0], charts=arch.key_charts, aggregation=arch.key_aggregation)
            key_params, key_macs = key_params + key.params(at), key_macs + key.macs(at)
            params += k.linear_params - s.linear_params
            macs += Linear.site_macs(k, 0, 0, base.site_rows(k)) - Linear.site_macs(s, 0, 0, rows)
    emb = spec.emb
    sites = embedded_sites(emb, keyed, spec.model, qkv_free)
    h = resolve_width(emb.at(None), sites, base.params)
    n = emb.code_size or 0
    embed_params = codes_params(emb, sites)
    for s, own, width in site_embeddings(emb, sites, base.params):   # each site by its block's embedding
        if not own.row.hidden:
            embed_params += s.linear_params
            continue
        rows = base.site_rows(s)
        site_params = EMBEDDINGS[own.kind].site_params(s, width, n)
        site_macs = EMBEDDINGS[own.kind].site_macs(s, width, n, rows)
        embed_params += site_params
        params += site_params - s.linear_params
        macs += site_macs - Linear.site_macs(s, 0, 0, rows)
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
    """The q/k/v embedding modules of a built model: every map of every embedded site (for linear: the host's own
    linears), the keys of their own and the projections of mixers without a fused qkv."""
    keys = [m for m in model.modules() if isinstance(m, tuple(KEY_TYPES.values()))]   # keys of their own
    keys += [p for m in model.modules() if isinstance(m, tuple(MIXERS.values())) for p in m.qkv_projections()]
    out = []
    for s in find_sites(model):
        if s.class_attn and not spec.emb.class_attn:
            continue
        attn = model.get_submodule(s.path)
        out += [attn.get_submodule(m.child) for m in s.maps]
    return keys + out


def measure_cost(cfg: dict) -> dict:
    """Like ``model_cost`` but by building the variant on the meta device and counting it (slow)."""
    spec = ModelConfig.from_cfg(cfg)
    with torch.device("meta"), skip_meta_init():
        model = build_model(cfg)
    embed = {id(p): p.numel() for m in _embedding_modules(model, spec) for p in m.parameters()}
    params = sum(p.numel() for p in model.parameters())
    macs = count_macs(model, spec.in_chans, spec.img_size)
    return {"params": params, "params_m": params / 1e6, "embed_params": sum(embed.values()),
            "gmacs": macs / 1e9, "width": model.qkv_config["width"]}
