"""Per-block keys: a block's own value of a key, ``embedding.3`` (block 3's embedding), ``hidden_width.3``, and
the precision of a part of block 3 under a quantization policy (``quant_qkv.3``, ``quant_proj.3``, ...).

A per-block key is a trial key of its own: one Parquet column (``config_embedding.3``, typed as its key), one
Optuna parameter, one ehvi feature, one part of the trial's identity (spaces.keys.key_of gives its declaration:
its key's; a precision's is part of the policy, left out of the training identity as its key is). Blocks count
from 0 in timm's ``blocks`` order. A block without one takes the config's value of the key, as do the sites
outside ``blocks`` (XCiT's class attention); blocks past the config's depth have none (null). A space draws them
with ``per_block: true`` (spaces.dimensions); keys.fill checks them.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import lru_cache

from qkvsearch.spaces.checks import MAX_BLOCKS, Bad
from qkvsearch.spaces.choices import QUANT_PARTS

# the embedding and its width (they decide the model), and each part's precision (it decides the model as deployed)
PER_BLOCK_KEYS = ("embedding", "hidden_width", *QUANT_PARTS)
BLOCK_SEP = "."


def block_key(key: str, block: int) -> str:
    """The per-block key of ``key`` for ``block``: block_key("embedding", 3) == "embedding.3"."""
    return f"{key}{BLOCK_SEP}{block}"


@lru_cache(maxsize=8192)   # called for every key of every config a fill checks: thousands of times per config
def split_block_key(name) -> tuple[str, int] | None:
    """("embedding", 3) for "embedding.3"; None for any name that is not a per-block key."""
    base, sep, block = str(name).partition(BLOCK_SEP)
    if not sep or base not in PER_BLOCK_KEYS or not block.isdigit() or str(int(block)) != block \
            or int(block) >= MAX_BLOCKS:
        return None
    return base, int(block)


def base_key(name) -> str:
    """The key a name sets: "embedding" for "embedding.3", the name itself for any other."""
    split = split_block_key(name)
    return split[0] if split else str(name)


def is_block_key_of(name, key: str) -> bool:
    """Whether ``name`` is a per-block key of ``key`` ("embedding.3" of "embedding"; "embedding" is not)."""
    split = split_block_key(name)
    return split is not None and split[0] == key


def block_keys(cfg: Mapping, of: Collection[str] | None = None) -> list[str]:
    """The per-block keys ``cfg`` sets (not null), by key then block; ``of``: those of these keys only."""
    found = [(s, k) for k in cfg if cfg[k] is not None and (s := split_block_key(k)) and (of is None or s[0] in of)]
    return [k for _, k in sorted(found)]


def block_value(cfg: Mapping, key: str, block: int | None):
    """``key``'s value for ``block`` (None: a site outside ``blocks``): its per-block key's, else the config's."""
    if block is not None:
        own = cfg.get(block_key(key, block))
        if own is not None:
            return own
    return cfg.get(key)


def block_text(cfg: Mapping, key: str) -> str:
    """``key``'s value in words: the config's, or where blocks have their own, every block's in block order
    joined by "+" ("sne+sne+linear": blocks 0 and 1 SNE, block 2 linear)."""
    own = [split_block_key(k)[1] for k in block_keys(cfg) if split_block_key(k)[0] == key]
    if not own:
        return str(cfg.get(key))
    depth = cfg.get("depth") if isinstance(cfg.get("depth"), int) else max(own) + 1
    return "+".join(str(block_value(cfg, key, b)) for b in range(depth))


def block_values(cfg: Mapping, key: str) -> set:
    """Every value ``key`` takes in ``cfg``: the config's own and its per-block keys'."""
    return {cfg.get(key)} | {cfg[k] for k in block_keys(cfg) if split_block_key(k)[0] == key}


def check_blocks(out: dict, checks: Mapping, applies_when: Mapping, fail) -> None:
    """Check the per-block keys of a config in place: each value by its key's check (``checks``: key -> Check),
    null past the depth and where the block's embedding takes no width (``applies_when``: key -> (the key
    deciding it, its values)); "match" is a width solved for the whole model, never one block's. ``fail(key,
    expected, given)`` makes the error raised (spaces.keys.fill's). Per-block keys of keys not in ``checks`` are
    left as they are."""
    depth = out.get("depth")
    for name in sorted(k for k in out if (split := split_block_key(k)) and split[0] in checks):
        value, (base, block) = out[name], split_block_key(name)
        if value is None:
            continue
        if isinstance(depth, int) and block >= depth:
            raise fail(name, f"null unless depth > {block} (depth is {depth})", value)
        try:
            value = checks[base](value)
        except Bad as bad:
            raise fail(name, bad.expected or checks[base].expected, value) from None
        if base in applies_when:
            on, applies = applies_when[base]
            if (decided := block_value(out, on, block)) not in applies:
                raise fail(name, f"null unless block {block}'s {on} is {' or '.join(applies)} ({on} is {decided})",
                           value)
        if value == "match":
            raise fail(name, "a width of its own (an int, a ratio of d, or \"paper\"): \"match\" solves one width "
                             "for the whole model", value)
        out[name] = value
