"""The quantization policy of a trial config: its keys and the rules that read them.

A policy gives each part of the network a precision (``QUANT_KEYS``: quant_qkv, quant_proj, quant_mlp,
quant_token_mlp; spaces.choices.QUANT_PARTS says what each holds), the part's in every block, and a block may
have its own (``quant_qkv.3``: spaces.blocks). It applies after training (trainers.model.quantize): it changes the
model as deployed, not the training. spaces.keys declares the keys and leaves them out of the training identity
by ``is_policy_key``; every module that tells a policy apart reads it through ``quant_policy``.
"""
from __future__ import annotations

from collections.abc import Mapping

from qkvsearch.spaces.blocks import base_key, block_keys, split_block_key
from qkvsearch.spaces.choices import FULL_PRECISION, QUANT_PARTS

QUANT_KEYS = tuple(QUANT_PARTS)   # the quantization policy's keys, one per part (and per block: quant_qkv.3)


def is_policy_key(name) -> bool:
    """Whether a trial key sets part of the quantization policy: a part's precision (quant_qkv) or a block's own
    (quant_qkv.3)."""
    return base_key(name) in QUANT_KEYS


def quant_policy(config: Mapping) -> dict:
    """The parts a config quantizes: quant key -> precision, the parts in full precision left out, then each
    block's own precision where it differs from its part's (``quant_qkv.3``, by key then block); {}: none. Two
    configs that quantize each block alike have one policy here, whatever keys they spell it with (a block's own
    equal to its part's is left out; one in fp under a quantized part is kept)."""
    out = {k: config[k] for k in QUANT_KEYS if config.get(k) not in (None, FULL_PRECISION)}
    for name in block_keys(config, QUANT_KEYS):
        if config[name] != (config.get(base_key(name)) or FULL_PRECISION):
            out[name] = config[name]
    return out


def full_precision(config: Mapping) -> dict:
    """The config with every part of its quantization policy at full precision, the blocks' own precisions left
    out: the model it trains (a policy changes no weight: it applies after training)."""
    return {**{k: v for k, v in config.items() if not (split_block_key(k) and is_policy_key(k))},
            **{k: FULL_PRECISION for k in QUANT_KEYS if k in config}}
