"""How a subnet's parameter is cut from the supernet's: which weights it shares (its branch) and how its
dims map onto the larger tensor that holds every subnet's (its parts).

Branches. A parameter under a block's attention (the Q/K/V embedding with its codes, the mixer, the key) has
weights of its own for each value of the categorical keys that change what it computes (spaces.supernet
``ATTENTION_BRANCH``: embedding type, attention type, key design, activation, code sharing); one of the stem for
each stem, of the position encoding for each position encoding. Every other parameter (MLPs, norms, the head,
the class token) is shared by all subnets. Only the keys that vary over the supernet's candidates split a
parameter.

Parts. Along each dim a tensor is one or more parts laid end to end, and a smaller subnet takes the leading
entries of each part: a fused ``qkv`` Linear (out 3d) is three parts of d (the q, k and v thirds), the first
layer of SNE and P-SNE three parts of h (q, k and v stacked), F-SNE's first layer reads two parts, the d
token columns then the n code columns, a manifold key's ``qv`` two parts. Everything else is one part per
dim: leading rows, columns and blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from qkvsearch.spaces.blocks import block_value
from qkvsearch.spaces.keys import APPLIES_WHEN
from qkvsearch.spaces.supernet import ATTENTION_BRANCH, POSITION_BRANCH, STEM_BRANCH
from qkvsearch.trainers.model.models import block_of


def branch_keys(name: str) -> tuple[str, ...]:
    """The categorical keys whose value gives parameter ``name`` weights of its own."""
    if ".attn." in name:
        return ATTENTION_BRANCH
    if name.startswith("patch_embed."):
        return STEM_BRANCH
    if name.startswith(("pos_embed", "rope")):
        return POSITION_BRANCH
    return ()


def master_key(name: str, cfg: dict, varying: frozenset) -> str:
    """The supernet tensor that holds parameter ``name`` of the subnet ``cfg``: its name, and the values of the
    branch keys that vary over the candidates (``varying``: a key whose per-block keys vary counts), each the
    value for the parameter's block (spaces.keys.block_value)."""
    keys = [k for k in branch_keys(name) if k in varying]
    block = block_of(name)
    return name + "".join(f"|{k}={_branch_value(cfg, k, block)}" for k in keys)


def _branch_value(cfg: dict, key: str, block: int | None):
    """``key``'s value for ``block``; null where the block's embedding (or key design) takes no such key, as for
    code sharing in a block that is not F-SNE: a key that does not apply splits nothing."""
    if key in APPLIES_WHEN:
        on, applies = APPLIES_WHEN[key]
        if block_value(cfg, on, block) not in applies:
            return None
    return block_value(cfg, key, block)


def parts(model: nn.Module, name: str, shape: torch.Size) -> tuple[tuple[int, ...], ...]:
    """(per dim) the sizes of the parts that lie end to end along it in parameter ``name`` of ``model``."""
    from qkvsearch.trainers.model.choices import embedding_classes

    out = [(s,) for s in shape]
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    parent_path, _, child = owner.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if isinstance(parent, embedding_classes()):                             # each embedding's own layout
        for dim, sizes in parent.tensor_parts(child, leaf, shape).items():
            out[dim] = sizes
    elif isinstance(module, nn.Linear) and child in ("qkv", "qv"):          # fused: (G d, d), (G d,)
        groups = module.out_features // module.in_features
        if groups * module.in_features == module.out_features and groups > 1:
            out[0] = _equal(shape[0], groups)
    return tuple(out)


def _equal(size: int, groups: int) -> tuple[int, ...]:
    return (size // groups,) * groups


def widest(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Part by part, the larger of two layouts of one tensor (both must cut it into as many parts)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        raise ValueError(f"layouts {a} and {b} cut one supernet tensor differently")
    return tuple(tuple(max(p, q) for p, q in zip(x, y)) for x, y in zip(a, b))


def fits(inner: tuple[tuple[int, ...], ...], outer: tuple[tuple[int, ...], ...]) -> bool:
    return len(inner) == len(outer) and all(
        len(x) == len(y) and all(p <= q for p, q in zip(x, y)) for x, y in zip(inner, outer))


def cut(master: torch.Tensor, outer: tuple[tuple[int, ...], ...], inner: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """The subnet's tensor: along each dim, the leading ``inner`` entries of each of ``outer``'s parts of
    ``master`` (a view when every dim is one part; gradients flow back to ``master`` either way)."""
    out = master
    for dim, (o, i) in enumerate(zip(outer, inner)):
        if len(o) == 1:
            if i[0] != o[0]:
                out = out.narrow(dim, 0, i[0])
            continue
        starts = [sum(o[:k]) for k in range(len(o))]
        out = torch.cat([out.narrow(dim, s, n) for s, n in zip(starts, i)], dim=dim)
    return out


def place(master: torch.Tensor, outer, inner, value: torch.Tensor) -> None:
    """Write ``value`` (a subnet's tensor) where ``cut`` reads it (initialisation, in place, no grad)."""
    if master.dim() == 0:
        with torch.no_grad():
            master.copy_(value)
        return
    index = []
    for o, i in zip(outer, inner):
        starts = [sum(o[:k]) for k in range(len(o))]
        index.append(torch.cat([torch.arange(s, s + n) for s, n in zip(starts, i)]))
    with torch.no_grad():
        master[torch.meshgrid(*index, indexing="ij")] = value.to(master.dtype)
