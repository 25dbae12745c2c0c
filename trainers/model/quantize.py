"""Post-training quantization of a trained model under a trial's quantization policy (torchao).

A policy gives each part of the network a precision (spaces.keys ``quant_qkv``, ``quant_proj``, ``quant_mlp``,
``quant_token_mlp``; the choices: spaces.choices.PRECISION_CHOICES, one class each below), the part's in every
block, class-attention blocks included, and a block of timm's ``blocks`` may have its own (``quant_qkv.3``:
spaces.blocks; the class-attention blocks, outside ``blocks``, take the part's):

    quant_qkv        the q/k/v embedding's linears at every q/k/v site (trainers.model.sites): timm's fused ``qkv``
                     or its maps apart (``q`` and ``kv``, ClassAttn's q, k, v, ...), SNE / P-SNE / F-SNE layers, the
                     q and shared k/v projections of linformer_shared_kv(_heads)
    quant_proj       each attention's output projection ``proj``
    quant_mlp        the linears of each block's MLP (``mlp``; an MLP-Mixer's channel MLP ``mlp_channels``)
    quant_token_mlp  an MLP-Mixer's token-mixing MLP (``mlp_tokens``): a part of its own, so that a policy
                     written for ``quant_mlp`` before it existed quantizes what it did

The patch embedding, the head, norms, convolutions (XCiT's LPI) and token-axis projections (Linformer's E, F)
stay as trained. ``quantize_model`` swaps each quantized part's weights for torchao's int8 tensors in place
(``quantize_`` with one config per precision and a ``filter_fn`` naming the linears it holds). A policy key
that reaches no linear of the model (a part it has not, in every block or in the block named) raises ConfigError
naming the key.

torchao quantizes ``nn.Linear``. An embedding that computes otherwise (SNE's grouped second layers, F-SNE's sliced
first layer) is first given its class's form of plain linears, which computes the same outputs in floating point
(``linear_forms``; trainers.model.embedding_forms; tests compare them).
The manifold key's charts are batched matmuls too: a policy on its q/k/v is refused by spaces.choices.

``weights_bytes``: the bytes of a model's state_dict as stored (torch.save writes each distinct storage once; a
torchao tensor is its int8 data, scale and zero point), the ``size_mb`` cost (spaces.metrics.MEASURED).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from qkvsearch.spaces.blocks import block_value, split_block_key
from qkvsearch.spaces.choices import FULL_PRECISION, QUANT_PARTS
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.keys import QUANT_KEYS, ConfigError, quant_policy
from qkvsearch.trainers.model.choices import MIXERS, embedding_classes
from qkvsearch.trainers.model.embedding_forms import FSNELinears, SNELinears  # noqa: F401  (re-exported)
from qkvsearch.trainers.model.models import block_of, find_sites

__all__ = ["FullPrecision", "Int8Dynamic", "Int8WeightOnly", "FSNELinears", "SNELinears", "linear_forms",
           "part_linears", "precisions", "quantize_model", "quantized_copy", "weights_bytes"]

# a block's MLPs by their name in timm: timm's Block and XCiT's blocks, an MLP-Mixer's channel and token MLPs
MLP_PARTS = {"mlp": "quant_mlp", "mlp_channels": "quant_mlp", "mlp_tokens": "quant_token_mlp"}


# ---------------------------------------------------------------------------------------------- precisions


class FullPrecision:
    """``fp``: the part stays as trained."""

    @classmethod
    def config(cls, device: torch.device):
        return None


class Int8WeightOnly(FullPrecision):
    """``int8_weight_only``: int8 weights with a scale per output channel, dequantized in the matmul."""

    @classmethod
    def config(cls, device: torch.device):
        from torchao.quantization import Int8WeightOnlyConfig

        # set_inductor_config would change torch.compile's global settings for the trainings of this process
        return Int8WeightOnlyConfig(set_inductor_config=False)


class Int8Dynamic(FullPrecision):
    """``int8_dynamic``: int8 weights per output channel, activations quantized per token at run time, int8
    matmuls. On a CPU without VNNI, torchao's reduced range avoids overflowing the int16 accumulation
    (torchao.utils.should_reduce_range, as torchao documents the config)."""

    @classmethod
    def config(cls, device: torch.device):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig
        from torchao.utils import should_reduce_range

        return Int8DynamicActivationInt8WeightConfig(set_inductor_config=False,
                                                     reduce_range=should_reduce_range(torch.device(device)))


# ---------------------------------------------------------------------------------------------- linear forms


def linear_forms(model: nn.Module) -> nn.Module:
    """Replace, in place, every q/k/v embedding by its form of plain linears (its class's ``linear_form``: the
    same outputs in fp; an embedding of linears alone is its own). A module shared by several maps of a site
    (P-SNE's second layer) stays one module."""
    kinds, shared = embedding_classes(), {}
    for path, module in list(model.named_modules(remove_duplicate=False)):
        form = module.linear_form(shared) if isinstance(module, kinds) else module
        if form is not module:
            if hasattr(module, "qkv_map_of"):
                form.qkv_map_of = module.qkv_map_of   # the map it stands in (trainers.model.sites)
            parent, _, leaf = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, form)
    return model


# ---------------------------------------------------------------------------------------------- parts


def _linears(module: nn.Module, prefix: str) -> list[str]:
    return [f"{prefix}.{n}" if n else prefix for n, m in module.named_modules() if isinstance(m, nn.Linear)]


def part_linears(model: nn.Module) -> dict[str, list[str]]:
    """quant key -> the names of the part's nn.Linear modules (after ``linear_forms``), every block's: the maps of
    every q/k/v site (trainers.model.sites) and the q/k/v projections of the mixers without a fused qkv; each
    attention's output projection; each block's MLP. A linear shared by several maps is named once."""
    out: dict[str, list[str]] = {k: [] for k in QUANT_KEYS}
    for site in find_sites(model):
        for m in site.maps:
            out["quant_qkv"] += _linears(model.get_submodule(f"{site.path}.{m.child}"), f"{site.path}.{m.child}")
        if isinstance(proj := getattr(model.get_submodule(site.path), "proj", None), nn.Module):
            out["quant_proj"] += _linears(proj, f"{site.path}.proj")
    for path, m in model.named_modules():
        own = m.qkv_projections() if isinstance(m, tuple(MIXERS.values())) else []
        if own:                                             # linformer_shared_kv: q and the shared k/v head
            names = {id(p): n for n, p in m.named_modules()}
            out["quant_qkv"] += [f"{path}.{names[id(p)]}" for p in own]
            if isinstance(getattr(m, "proj", None), nn.Linear):
                out["quant_proj"].append(f"{path}.proj")
        elif (part := MLP_PARTS.get(path.rpartition(".")[2])) is not None:
            out[part] += _linears(m, path)
    seen: set[int] = set()
    for names in out.values():   # a module shared by two maps: quantized once, under its first name
        keep = [n for n in names if id(model.get_submodule(n)) not in seen]
        seen |= {id(model.get_submodule(n)) for n in keep}
        names[:] = keep
    return out


# ---------------------------------------------------------------------------------------------- quantizing


def _precision(name: str, key: str) -> type:
    from qkvsearch.trainers.model.choices import PRECISIONS

    try:
        return PRECISIONS[name]
    except ConfigError:
        raise ConfigError(f"{key}: expected one of {', '.join(PRECISIONS)}, given {show(name)}") from None


def precisions(parts: dict[str, list[str]], cfg: dict) -> dict[str, str]:
    """linear name -> its precision under the config's policy: its block's own precision of its part where the
    config gives one, else its part's (``parts``: ``part_linears``' answer)."""
    return {fqn: block_value(cfg, key, block_of(fqn)) or FULL_PRECISION for key, fqns in parts.items()
            for fqn in fqns}


def _check_reached(policy: dict, parts: dict[str, list[str]], model_name) -> None:
    """A policy key that quantizes (not fp) must name linears the model has: ConfigError naming it otherwise."""
    for key, name in policy.items():
        part, block = split_block_key(key) or (key, None)
        if name == FULL_PRECISION or any(block is None or block_of(f) == block for f in parts[part]):
            continue
        where = "" if block is None else f" in block {block}"
        raise ConfigError(f"{key}: expected {FULL_PRECISION} for model {model_name} (it has no {QUANT_PARTS[part]}"
                          f"{where}), given {show(name)}")


def quantize_model(model: nn.Module, cfg: dict, device=None) -> nn.Module:
    """``model`` (trained, in eval use) quantized in place under the policy of the filled config ``cfg`` (each
    block's own precisions included) and returned; unchanged when every part is ``fp``. device: where it runs
    (default: its weights' device), which picks torchao's settings. A policy key that reaches no part of the
    model raises ConfigError naming it."""
    policy = quant_policy(cfg)
    if not policy:
        return model
    device = torch.device(device) if device is not None else next(model.parameters()).device
    linear_forms(model)
    parts = part_linears(model)
    _check_reached(policy, parts, cfg.get("model"))
    chosen: dict[str, set[str]] = {}
    for fqn, name in precisions(parts, cfg).items():
        if name != FULL_PRECISION:
            chosen.setdefault(name, set()).add(fqn)
    from torchao.quantization import quantize_

    for name, fqns in chosen.items():
        quantize_(model, _precision(name, "quant").config(device), filter_fn=lambda _m, fqn, s=fqns: fqn in s)
    return model


def quantized_copy(model: nn.Module, cfg: dict, device=None) -> nn.Module:
    """A quantized copy of ``model`` in eval mode (``model`` itself, untouched, when the policy is all fp)."""
    if not quant_policy(cfg):
        return model
    return quantize_model(copy.deepcopy(model).eval(), cfg, device)


def _leaves(t: torch.Tensor):
    """The plain tensors a tensor stores: itself, or a tensor subclass's inner tensors (torchao's int8 data,
    scale, zero point)."""
    if type(t) in (torch.Tensor, nn.Parameter) or not hasattr(t, "__tensor_flatten__"):
        yield t
        return
    names, _ = t.__tensor_flatten__()
    for name in names:
        inner = getattr(t, name)
        if isinstance(inner, torch.Tensor):
            yield from _leaves(inner)


def weights_bytes(model: nn.Module) -> int:
    """Bytes of ``model.state_dict()`` as torch.save stores it: each distinct storage once, whole."""
    return state_bytes(model.state_dict())


def state_bytes(state: dict) -> int:
    """Bytes of a state dict as torch.save stores it: each distinct storage once, whole."""
    storages = {}
    for tensor in state.values():
        for leaf in _leaves(tensor):
            storage = leaf.untyped_storage()
            storages[(leaf.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())
