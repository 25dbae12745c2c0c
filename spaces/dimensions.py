"""The ``space:`` section: parsing, conditions, and grid expansion.

Grammar (one entry per flat trial key; see spaces/__init__.py for the whole file)::

    space:
      embedding: {choice: [linear, sne, psne, fsne]}     # sampled by the searcher
      code_size: {grid: [8, 16], when: {embedding: fsne}} # enumerated (grid algorithm only)
      lr: {float: [1.0e-4, 1.0e-3], log: true}           # range: [low, high], log-uniform if log
      depth_seed: {int: [0, 3]}                          # int range, both ends included
      activation: [relu, gelu]                           # a list = choice
      code_sharing: shared                               # a scalar = fixed value
      embedding: {choice: [linear, sne], per_block: true} # one key per block: embedding.0, embedding.1, ...
      variants:                                          # explicit combinations, one per trial family
        - {embedding: linear}
        - {embedding: sne, hidden_width: 0.5}

A trial takes one variant and one value for every *active* dimension. ``when: {key: v or [v, ...]}``
switches a dimension on only when each named key (another dimension or a variant key) holds one of
the values; an inactive key is left out of the trial config.

Keys that only mean something for some embeddings (hidden_width: sne/psne/fsne; code_size and
code_sharing: fsne) get that condition added automatically when the embedding can take other values,
so a space never yields two trials that differ only in an ignored key. An explicit ``when`` on
embedding that admits an embedding the key does not apply to is an error, and so is a variant that
sets such a key without setting a matching embedding.

``per_block: true`` (spaces.blocks.PER_BLOCK_KEYS: embedding, hidden_width, the precisions quant_qkv,
quant_proj, quant_mlp, quant_token_mlp) draws a value per block: the dimension becomes one per block,
``embedding.0`` to ``embedding.<D-1>`` for the space's largest depth D, each with the entry's values; block i's
is active only for depths above i (the space must set depth as a choice, a value or per variant).
``hidden_width.<i>`` follows block i's embedding (``embedding.<i>`` when the embedding is drawn per block, else
``embedding``). Where the embedding is drawn per block, a key that follows it (hidden_width for the blocks
without their own, code_size, code_sharing) is drawn for every trial, and is null in a trial none of whose
blocks takes it (spaces.keys.fill).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from qkvsearch.spaces.blocks import PER_BLOCK_KEYS, block_key, is_block_key_of, split_block_key
from qkvsearch.spaces.checks import Bad, Check
from qkvsearch.spaces.errors import Collector, hint
from qkvsearch.spaces.errors import show as _show
from qkvsearch.spaces.keys import APPLIES_WHEN, SEARCHABLE, searchable_check
from qkvsearch.spaces.schema import Dimension, FrozenMap, Space, tagged

KINDS = ("choice", "grid", "int", "float")
ABSENT = object()   # "this key is not set" among a key's possible values


def parse_space(raw, c: Collector, path: str = "space") -> Space:
    if raw is None:
        return Space()
    if not isinstance(raw, Mapping):
        c.expected(path, "a mapping of trial keys to dimensions", raw)
        return Space()
    dims, per_block = [], []
    for key, entry in raw.items():
        if key == "variants":
            continue
        dim = _parse_dimension(str(key), entry, c, f"{path}.{key}")
        if dim is not None:
            dims.append(dim)
            if isinstance(entry, Mapping) and entry.get("per_block") is True and dim.key in PER_BLOCK_KEYS:
                per_block.append(dim)
    variants = _parse_variants(raw.get("variants"), {d.key for d in dims}, c, f"{path}.variants")
    for dim in per_block:
        dims[dims.index(dim):dims.index(dim) + 1] = _per_block(dim, dims, variants, c, f"{path}.{dim.key}")
    dims = [_apply_conditions(d, dims, variants, c, f"{path}.{d.key}") for d in dims]
    _check_variant_applicability(variants, dims, c, f"{path}.variants")
    whole = [d for d in dims if not split_block_key(d.key)]
    ordered = _condition_order(whole, c, path)
    ordered += _block_order([d for d in dims if split_block_key(d.key)], {d.key for d in dims}, {d.key for d in whole},
                            c, path)
    return Space(tuple(ordered), tuple(variants))


def _per_block(dim: Dimension, dims, variants, c: Collector, path: str) -> list[Dimension]:
    """A ``per_block: true`` dimension as one dimension per block, block i's active for depths above i."""
    depths = possible_values("depth", dims, variants)
    if depths is None or ABSENT in depths:
        c.add(f"{path}.per_block", "needs the space to set depth in every trial, as a choice, a value or per "
                                   "variant (the blocks to draw for), given " +
              ("a depth range" if depths is None else "a space without depth" if depths == [ABSENT] else
               "a depth some trials leave unset"))
        return [dim]
    depths = sorted({int(d) for d in depths})
    out = []
    for block in range(depths[-1]):
        when = dict(dim.when)
        if block >= depths[0]:
            when["depth"] = tuple(d for d in depths if d > block)
        out.append(Dimension(block_key(dim.key, block), dim.kind, dim.values, dim.low, dim.high, dim.log,
                             FrozenMap(when)))
    return out


def check_value(check: Check, value, c: Collector, path: str):
    """Normalised value, or ABSENT after recording an error naming the path."""
    try:
        return check(value)
    except Bad as bad:
        expected = bad.expected or check.expected
        suffix = hint(value, check.options) if check.options and isinstance(value, str) else ""
        c.add(path, f"expected {expected}, given {_show(value)}{suffix}")
        return ABSENT


def _parse_dimension(key: str, entry, c: Collector, path: str) -> Dimension | None:
    if key == "epochs":
        c.add(path, "epochs cannot be searched: it is the scheduler's budget (set train.epochs)")
        return None
    check = searchable_check(key)
    if check is None:
        c.add(path, "unknown search key" + hint(key, [*SEARCHABLE, "variants"]))
        return None
    if isinstance(entry, list):
        entry = {"choice": entry}
    elif not isinstance(entry, Mapping):
        value = check_value(check, entry, c, path)
        return None if value is ABSENT else Dimension(key, "choice", (value,))
    c.unknown_keys(path, entry, [*KINDS, "log", "when", "per_block"])
    if "per_block" in entry:
        if key not in PER_BLOCK_KEYS:
            c.add(f"{path}.per_block", f"only {', '.join(PER_BLOCK_KEYS)} take a value per block, given {key}")
        elif not isinstance(entry["per_block"], bool):
            c.expected(f"{path}.per_block", "true or false", entry["per_block"])
    kinds = [k for k in KINDS if k in entry]
    if len(kinds) != 1:
        c.add(path, f"expected exactly one of {', '.join(KINDS)}, given {kinds or 'none'}")
        return None
    kind = kinds[0]
    when = _parse_when(entry.get("when"), c, f"{path}.when")
    if kind in ("choice", "grid"):
        if "log" in entry:
            c.add(f"{path}.log", f"log applies to int and float ranges, not to {kind}")
        values = _parse_values(check, entry[kind], c, f"{path}.{kind}")
        return None if values is None else Dimension(key, kind, values, when=when)
    bounds = _parse_range(key, check, kind, entry[kind], entry.get("log", False), c, path)
    if bounds is None:
        return None
    return Dimension(key, kind, low=bounds[0], high=bounds[1], log=bounds[2], when=when)


def _parse_values(check: Check, raw, c: Collector, path: str) -> tuple | None:
    if not isinstance(raw, list):
        c.expected(path, f"a list of {check.plural}", raw)
        return None
    if not raw:
        c.expected(path, f"a non-empty list of {check.plural}", raw)
        return None
    values, seen, ok = [], set(), True
    for i, item in enumerate(raw):
        value = check_value(check, item, c, f"{path}[{i}]")
        if value is ABSENT:
            ok = False
        elif tagged(value) in seen:
            c.add(f"{path}[{i}]", f"duplicate value {_show(item)}")
            ok = False
        else:
            seen.add(tagged(value))
            values.append(value)
    return tuple(values) if ok else None


def _parse_range(key, check: Check, kind: str, raw, log, c: Collector, path: str):
    """(low, high, log) for an int/float range, or None after recording errors."""
    numeric = check.numeric or ""
    if kind not in numeric:
        what = "a choice (ranges need a numeric key)" if not numeric else f"a {numeric} range"
        c.add(f"{path}.{kind}", f"{key} takes {check.expected}: expected {what}")
        return None
    if not isinstance(log, bool):
        c.expected(f"{path}.log", "true or false", log)
        return None
    if not (isinstance(raw, list) and len(raw) == 2):
        c.expected(f"{path}.{kind}", f"[low, high] ({kind}s)", raw)
        return None
    bounds = []
    for i, item in enumerate(raw):
        if kind == "int" and (not isinstance(item, int) or isinstance(item, bool)):
            c.expected(f"{path}.{kind}[{i}]", "an int", item)
            return None
        if kind == "float" and isinstance(item, int) and not isinstance(item, bool):
            item = float(item)
        value = check_value(check, item, c, f"{path}.{kind}[{i}]")
        if value is ABSENT:
            return None
        bounds.append(value)
    low, high = bounds
    if not low < high:
        c.add(f"{path}.{kind}", f"expected low < high, given [{low}, {high}]")
        return None
    if log and low <= 0:
        c.add(f"{path}.{kind}", f"a log range needs low > 0, given {low}")
        return None
    return low, high, log


def _parse_when(raw, c: Collector, path: str) -> FrozenMap:
    """{key: value or [values]} -> FrozenMap(key -> tuple); values are checked against the key later."""
    if raw is None:
        return FrozenMap()
    if not isinstance(raw, Mapping) or not raw:
        c.expected(path, "a mapping {key: value or [values]}", raw)
        return FrozenMap()
    out = {}
    for key, value in raw.items():
        values = tuple(value) if isinstance(value, list) else (value,)
        if not values:
            c.expected(f"{path}.{key}", "a value or a non-empty list of values", value)
            continue
        out[str(key)] = values
    return FrozenMap(out)


def _parse_variants(raw, dim_keys: set[str], c: Collector, path: str) -> list[FrozenMap]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        c.expected(path, "a non-empty list of mappings {trial key: value}", raw)
        return []
    variants, seen = [], set()
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping) or not item:
            c.expected(where, "a non-empty mapping {trial key: value}", item)
            continue
        variant = {}
        for key, value in item.items():
            check = searchable_check(key)
            if check is None or key == "epochs":
                c.add(f"{where}.{key}", "unknown search key" + hint(key, SEARCHABLE))
            elif key in dim_keys:
                c.add(f"{where}.{key}", "is also a space dimension: set it in one place only")
            else:
                value = check_value(check, value, c, f"{where}.{key}")
                if value is not ABSENT:
                    variant[key] = value
        frozen = FrozenMap(variant)
        if len(variant) == len(item):
            if frozen in seen:
                c.add(where, "duplicate variant (each combination runs once; use search.repeats)")
            seen.add(frozen)
            variants.append(frozen)
    return variants


def possible_values(key: str, dims, variants) -> list | None:
    """Values a key can take (ABSENT included when a trial may leave it unset); None for ranges."""
    dim = next((d for d in dims if d.key == key), None)
    if dim is not None:
        if not dim.enumerable:
            return None
        return list(dim.values) + ([ABSENT] if dim.when else [])
    if not any(key in v for v in variants):
        return [ABSENT]
    return [v.get(key, ABSENT) for v in variants]


def _apply_conditions(dim: Dimension, dims, variants, c: Collector, path: str) -> Dimension:
    """Check the dimension's explicit conditions and add the embedding condition it implies."""
    keys = {d.key for d in dims} | {k for v in variants for k in v}
    for key, allowed in dim.when.items():
        where = f"{path}.when.{key}"
        if key == dim.key:
            c.add(where, "a key cannot be conditioned on itself")
        elif key not in keys:
            c.add(where, "unknown key: conditions name other space keys" + hint(key, keys - {dim.key}))
        else:
            _check_condition_values(key, allowed, dims, variants, c, where)
    split = split_block_key(dim.key)
    base = split[0] if split else dim.key
    if base not in APPLIES_WHEN:
        return dim
    on, applies = APPLIES_WHEN[base]
    if split and block_key(on, split[1]) in keys:   # a block's width follows the block's own embedding
        on = block_key(on, split[1])
    elif not split and any(is_block_key_of(k, on) for k in keys):
        return dim   # drawn for the whole model; null in a trial none of whose blocks takes it (keys.fill)
    return _implied_condition(dim, on, applies, dims, variants, c, path)


def _check_condition_values(key, allowed, dims, variants, c: Collector, where: str) -> None:
    possible = possible_values(key, dims, variants)
    if possible is None:
        c.add(where, f"conditions need a choice/grid key, but {key} is a range")
        return
    taken = {tagged(v) for v in possible if v is not ABSENT}
    for value in allowed:
        if check_value(searchable_check(key), value, c, where) is ABSENT:
            continue
        if tagged(value) not in taken:
            shown = ", ".join(_show(v) for v in possible if v is not ABSENT)
            c.add(where, f"{key} never takes {_show(value)} in this space (it takes {shown})")


def _implied_condition(dim: Dimension, on: str, applies, dims, variants, c: Collector, path: str) -> Dimension:
    """``dim`` with ``when: {on: applies}`` added where ``on`` (embedding, attention, key) may take other values."""
    embeddings = possible_values(on, dims, variants)
    need = " or ".join(applies)
    if on in dim.when:
        wrong = [e for e in dim.when[on] if e not in applies]
        if wrong:
            c.add(f"{path}.when.{on}", f"{dim.key} applies only to {on} {need}, "
                                       f"given {', '.join(map(_show, wrong))}")
        return dim
    if embeddings == [ABSENT]:
        c.add(path, f"{dim.key} applies only when {on} is {need}, but the space does not set "
                    f"{on} (add e.g. {on}: {applies[-1]})")
        return dim
    if all(e in applies for e in embeddings):
        return dim
    keep = tuple(dict.fromkeys(e for e in embeddings if e is not ABSENT and e in applies))
    if not keep:
        c.add(path, f"{dim.key} applies only when {on} is {need}, which this space never searches")
        return dim
    when = dict(dim.when)
    when[on] = keep
    return Dimension(dim.key, dim.kind, dim.values, dim.low, dim.high, dim.log, FrozenMap(when))


def _check_variant_applicability(variants, dims, c: Collector, path: str) -> None:
    for i, variant in enumerate(variants):
        for key, (on, applies) in APPLIES_WHEN.items():
            if key not in variant:
                continue
            on_dim = next((d for d in dims if d.key == on), None)
            if any(is_block_key_of(k, on) for k in (*variant, *(d.key for d in dims))):
                ok = True   # the blocks draw their own: null where none takes it (keys.fill)
            elif on in variant:
                ok = variant[on] in applies
            else:
                ok = on_dim is not None and on_dim.enumerable and all(e in applies for e in on_dim.values)
            if not ok:
                got = _show(variant[on]) if on in variant else f"no {on}"
                c.add(f"{path}[{i}].{key}", f"applies only when {on} is {' or '.join(applies)}, "
                                           f"but this variant has {got}")


def _condition_order(dims: list[Dimension], c: Collector, path: str) -> list[Dimension]:
    """Dimensions sorted so each comes after the dimensions its conditions name (input order otherwise)."""
    by_key = {d.key: d for d in dims}
    ordered, placed = [], set()
    pending = list(dims)
    while pending:
        ready = [d for d in pending if all(k in placed or k not in by_key or k == d.key for k in d.when)]
        if not ready:
            c.add(path, "conditions form a cycle among " + ", ".join(d.key for d in pending))
            return ordered + pending
        for d in ready:
            ordered.append(d)
            placed.add(d.key)
        pending = [d for d in pending if d.key not in placed]
    return ordered


def _block_order(dims: list[Dimension], keys: set, placed: set, c: Collector, path: str) -> list[Dimension]:
    """Per-block dimensions after the others, block by block (block i's embedding, then its width): each comes
    right after what its conditions name, so counting and drawing a space of 4^12 mixtures follows one block at
    a time (``count`` remembers only the keys later conditions read)."""
    pending = sorted(dims, key=lambda d: (split_block_key(d.key)[1], PER_BLOCK_KEYS.index(split_block_key(d.key)[0])))
    ordered, placed = [], set(placed)
    while pending:
        ready = next((d for d in pending if all(k in placed or k not in keys or k == d.key for k in d.when)), None)
        if ready is None:
            c.add(path, "conditions form a cycle among " + ", ".join(d.key for d in pending))
            return ordered + pending
        ordered.append(ready)
        placed.add(ready.key)
        pending.remove(ready)
    return ordered


def count(space: Space) -> int:
    """len(expand(space)), without enumerating: variants x product of the active dimensions' sizes.

    Only dimensions that a condition names need their values followed one by one; every other
    active dimension multiplies the count. The walk is memoised on the values of the keys that later
    conditions still read, so it costs about the product of the condition keys' sizes at most.
    Raises ValueError for a space with ranges (they have no finite count).
    """
    dims = space.dimensions
    if not space.enumerable:
        raise ValueError("count: a space with int/float ranges has no finite number of points")
    named = {k for d in dims for k in d.when}
    # read_after[i]: the keys a condition of dims[i:] reads, i.e. all that matters of the partial config
    read_after = [frozenset()] * (len(dims) + 1)
    for i in range(len(dims) - 1, -1, -1):
        read_after[i] = read_after[i + 1] | frozenset(dims[i].when)
    memo: dict = {}

    def walk(i: int, partial: dict) -> int:
        state = (i, tuple(sorted((k, tagged(partial[k])) for k in read_after[i] if k in partial)))
        if state in memo:
            return memo[state]
        total, j = 1, i
        while j < len(dims) and (dims[j].key not in named or not dims[j].active(partial)):
            if dims[j].active(partial):
                total *= len(dims[j].values)
            j += 1
        if j < len(dims):   # an active dimension a condition reads: follow each value
            dim = dims[j]
            total *= sum(walk(j + 1, {**partial, dim.key: value}) for value in dim.values)
        memo[state] = total
        return total

    return sum(walk(0, dict(variant)) for variant in space.variants or (FrozenMap(),))


def expand(space: Space) -> list[dict]:
    """Every trial's space keys for an enumerable space: variants x active dimension values, each once."""
    return list(iterate(space))


def iterate(space: Space) -> Iterator[dict]:
    """``expand`` one configuration at a time, in the same order (a large grid never sits in memory)."""
    for variant in space.variants or (FrozenMap(),):
        yield from _walk(space.dimensions, 0, dict(variant))


def _walk(dims, i: int, partial: dict) -> Iterator[dict]:
    if i == len(dims):
        yield dict(partial)
        return
    dim = dims[i]
    if not dim.active(partial):
        yield from _walk(dims, i + 1, partial)
        return
    for value in dim.values:
        partial[dim.key] = value
        yield from _walk(dims, i + 1, partial)
    del partial[dim.key]
