"""Every model a campaign's space can build, without training: `qkvsearch cost` and the checks of
`validate` / `launch` (a width below one channel, an MLP without a hidden unit, an image size the patches
do not tile, a model no machine could hold are found here, before anything is written).

A model's size is first estimated in closed form from its macro keys (``check_size``), before it is built:
counting a model builds it block by block on the meta device, which for a runaway size would take minutes
and gigabytes; the estimate and the exact count share one bound (trainers.model.cost.MAX_PARAMS).

Only keys that change the model matter (spaces.keys groups model and embedding); training keys are left
out. Integer or float ranges over a model key (e.g. `hidden_width: {int: [32, 256]}`) are checked at
their bounds.
"""
from __future__ import annotations

import csv
import io
import itertools
import logging

from qkvsearch.spaces import SpecError, base_config, dimensions
from qkvsearch.spaces.blocks import split_block_key
from qkvsearch.spaces.choices import EMBEDDING_CHOICES
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import (
    ARCHITECTURE_KEYS,
    KEYS,
    MODEL_GROUPS,
    ConfigError,
    fill,
    identity,
    model_keys,
    names,
)
from qkvsearch.spaces.sections import section_path
from qkvsearch.trainers.model.cost import MAX_PARAMS, model_cost, resolve_trial

log = logging.getLogger(__name__)
COST_KEYS = names(*MODEL_GROUPS)


def model_configs(spec) -> list[dict]:
    """Every distinct model configuration of the space (variants x model-key dimensions), unresolved. Keys drawn
    per block are taken alike in every block, each combination of their values once: a value's fault does not
    depend on its block, and 4^12 mixtures would be checked one by one otherwise."""
    base = base_config(spec)
    variants = [dict(v) for v in spec.space.variants] or [{}]
    dims = [d for d in spec.space.dimensions if d.key in COST_KEYS]
    per_block = [d for d in spec.space.dimensions if split_block_key(d.key)]
    alike: dict = {}   # key -> the values its per-block dimensions take
    for d in per_block:
        alike.setdefault(split_block_key(d.key)[0], d.values if d.enumerable else sorted({d.low, d.high}))
    out, seen = [], set()

    def expand(chosen: dict, rest: list) -> None:
        if not rest:
            for values in itertools.product(*alike.values()):
                cfg = {**base, **chosen}
                for d in per_block:   # in condition order: a block's width after its embedding
                    if d.active(cfg):
                        cfg[d.key] = dict(zip(alike, values))[split_block_key(d.key)[0]]
                key = repr(sorted(model_keys(cfg).items()))
                if key not in seen:
                    seen.add(key)
                    out.append(cfg)
            return
        dim, tail = rest[0], rest[1:]
        if not dim.active(chosen):
            return expand(chosen, tail)
        values = dim.values if dim.enumerable else sorted({dim.low, dim.high})
        for value in values:
            expand({**chosen, dim.key: int(value) if dim.kind == "int" else value}, tail)

    for variant in variants:
        expand(variant, dims)
    return out


def _label(cfg: dict) -> str:
    keys = ("embedding", "hidden_width", "code_size", "code_sharing", *ARCHITECTURE_KEYS)
    return " ".join(f"{k}={cfg[k]}" for k in ("model", *keys) if cfg.get(k) is not None)


def _where(message: str, labels: list[str]) -> str:
    """A section key at fault is named by its path (model.img_size); a space key by its configurations."""
    placed = section_path(message)
    if placed != message:
        return placed
    shown = "; ".join(labels[:3]) + (f"; and {len(labels) - 3} more" if len(labels) > 3 else "")
    return f"space ({shown}): {message}"


DEFAULT_MLP_RATIO = 4.0  # timm's for ViT and XCiT: the estimate's stand-in for a null mlp_ratio


def estimated_params(cfg: dict) -> float:
    """A lower estimate of the parameters of the model ``cfg`` describes, from its macro keys alone: per block
    (4 + 2 mlp_ratio) d^2 (the attention's q, k, v and output projections, the MLP's two layers), plus the
    position table, tokens x d. A key left null (timm's default) counts as its smallest value, so the
    estimate never exceeds the model's exact size by more than its rounding."""
    depth, dim = cfg.get("depth") or 1, cfg.get("embed_dim") or 1
    ratio = cfg.get("mlp_ratio") or DEFAULT_MLP_RATIO
    img, patch = cfg.get("img_size"), cfg.get("patch_size")
    tokens = (img // patch) ** 2 if img and patch else 0
    return float(depth) * dim * dim * (4 + 2 * ratio) + float(tokens) * dim


def check_size(cfg: dict) -> None:
    """ConfigError naming the macro key at fault when the model ``cfg`` describes is estimated
    (``estimated_params``) above MAX_PARAMS, or its MLP has no hidden unit at the given embed_dim; checked
    before the model is built."""
    if estimated_params(cfg) > MAX_PARAMS:
        key = next(k for k in ("embed_dim", "depth", "mlp_ratio", "patch_size") if cfg.get(k) is not None)
        shape = ", ".join(f"{k} {cfg[k]}" for k in ("depth", "embed_dim", "mlp_ratio", "img_size", "patch_size")
                          if cfg.get(k) is not None and k != key)
        with_shape = f" with {shape}" if shape else ""
        raise ConfigError(f"{key}: expected a model of at most {MAX_PARAMS:.0e} parameters{with_shape}, given "
                          f"{cfg[key]} (estimated {estimated_params(cfg):.3g} parameters: depth x embed_dim^2 x "
                          f"(4 + 2 mlp_ratio) for the blocks, tokens x embed_dim for the positions)")
    if cfg.get("embed_dim") is not None:
        _check_mlp_units(cfg, cfg["embed_dim"])


def _check_mlp_units(cfg: dict, dim: int) -> None:
    """ConfigError naming mlp_ratio (token_mlp_ratio) when the MLP has fewer than one hidden unit at token
    dim ``dim``: timm builds int(d x ratio) units, and an MLP of none passes nothing on."""
    for key in ("mlp_ratio", "token_mlp_ratio"):
        ratio = cfg.get(key)
        if ratio is not None and int(dim * ratio) < 1:
            raise ConfigError(f"{key}: expected a ratio giving at least one hidden unit at the token dim {dim} "
                              f"(at least {1 / dim:.3g}), given {ratio:g} "
                              f"({dim} x {ratio:g} = {dim * ratio:.3g} units)")


def _token_dim(config: dict) -> int | None:
    """A resolved config's token dim d: embed_dim, else timm's default, read off the base model that resolving
    the config built (trainers.model.cost.base_profile, cached: nothing is built again)."""
    if config.get("embed_dim") is not None:
        return config["embed_dim"]
    from qkvsearch.trainers.model.cost import base_profile
    from qkvsearch.trainers.model.models import ModelConfig

    spec = ModelConfig.from_cfg(config)
    base = base_profile(spec.model, spec.num_classes, spec.img_size, spec.in_chans, spec.arch.macro())
    if base.stage is not None:
        return base.stage.dim
    return base.sites[0].dim if base.sites else None


def check_models(spec) -> list[tuple[dict, dict]]:
    """(resolved config, cost) of every distinct model of the space.

    Raises SpecError listing each configuration no model can be made of, with the key at fault; warns
    (logging) when no configuration meets the constraints.
    """
    resolved, failing, seen = [], {}, set()   # failing: message -> labels of the configurations it holds for
    for cfg in model_configs(spec):
        try:
            check_size(cfg)  # first: a runaway size would take minutes to build
            config, cost = resolve_trial(cfg)
            if config.get("embed_dim") is None and (dim := _token_dim(config)) is not None:
                _check_mlp_units(config, dim)
        except BadInput as err:
            failing.setdefault(str(err), []).append(_label(cfg))
            continue
        model = identity(model_keys(config, "width"))
        if model not in seen:  # 0.5 of d and 64 units are one model: listed once
            seen.add(model)
            resolved.append((config, cost))
    if failing:
        raise SpecError([_where(message, labels) for message, labels in failing.items()], spec.source)
    if spec.constraints and resolved and all(spec.violations(cost) for _, cost in resolved):
        log.warning("constraints: no configuration of the space meets them; every trial would be infeasible")
    return resolved


DISTINCT_LIMIT = 10_000  # resolving costs ~0.1 ms a configuration: larger grids are not counted


def distinct_configurations(spec) -> int | None:
    """How many distinct trainings an enumerable space holds (spaces.keys.identity of each resolved
    configuration; repeats not counted), or None for ranges or a grid over DISTINCT_LIMIT points."""
    if not spec.space.enumerable or dimensions.count(spec.space) > DISTINCT_LIMIT:
        return None
    base, widths, seen = base_config(spec), {}, set()
    for sampled in dimensions.iterate(spec.space):
        config = fill({**base, **sampled})
        model_key = repr(sorted(model_keys(config).items()))  # the requested width decides the solved one
        if model_key not in widths:
            widths[model_key] = model_cost(config)["width"]
        seen.add(identity({**config, "width": widths[model_key]}))
    return len(seen)


def cost_table(spec) -> list[dict]:
    from qkvsearch.trainers.model.paper_counts import paper_figures

    rows = []
    for cfg, cost in check_models(spec):
        broken = spec.violations(cost)
        rows.append({
            "model": cfg["model"], "embedding": cfg["embedding"], "hidden_width": cfg["hidden_width"],
            "width": cfg["width"], "code_size": cfg["code_size"], "code_sharing": cfg["code_sharing"],
            "params": cost["params"], "params_m": cost["params_m"], "embed_params": cost["embed_params"],
            "gmacs": cost["gmacs"], "feasible": "yes" if not broken else "no: " + "; ".join(broken),
            **{k: cfg[k] for k in ARCHITECTURE_KEYS},
        })
        rows[-1].update(paper_figures(cfg) or {})  # one of the Vision X-formers paper's designs: its counts
    if any("params_rule" in r for r in rows):  # the columns only in tables that hold such a design
        for r in rows:
            r.setdefault("params_rule", None)
            r.setdefault("params_paper", None)
    return rows


def _architecture(row: dict) -> str:
    """The architecture keys that differ from the default (null ones: timm's), e.g. attention=nystrom."""
    return " ".join(f"{k}={row[k]}" for k in ARCHITECTURE_KEYS
                    if row.get(k) is not None and row[k] != KEYS[k].default) or "-"


def format_table(rows: list[dict], as_csv: bool = False) -> str:
    if as_csv:
        return _as_csv(rows)
    paper = any("params_rule" in r for r in rows)
    header = (f"{'model':<24} {'embedding':<9} {'width (asked)':>15} {'code':>5} {'sharing':<9} "
              f"{'params M':>9} {'embed params':>12} {'GMACs':>8}  "
              + (f"{'params':>9} {'rule':>9} {'paper':>9}  " if paper else "") + f"{'feasible':<9} architecture")
    lines = [header, "-" * len(header)]
    for r in rows:
        width = f"{r['width']} ({r['hidden_width']})" if EMBEDDING_CHOICES[r["embedding"]].hidden else "-"
        counts = " ".join(f"{'-' if r[k] is None else f'{r[k]:,}':>9}"
                          for k in ("params", "params_rule", "params_paper")) + "  " if paper else ""
        lines.append(f"{r['model']:<24} {r['embedding']:<9} {width:>15} {r['code_size'] or '-':>5} "
                     f"{r['code_sharing'] or '-':<9} {r['params_m']:>9.3f} {r['embed_params']:>12,} "
                     f"{r['gmacs']:>8.4f}  {counts}{r['feasible']:<9} {_architecture(r)}")
    lines.append(f"{len(rows)} distinct model(s); GMACs = multiply-accumulates per image (the papers' 'FLOPs'; "
                 f"FFTs at 2.5·L·log2 L a transform)")
    if paper:
        lines.append("params: every parameter; rule: the Vision X-formers paper's count of the same model "
                     "(torchsummary's: weight and bias of each module run, no bare Parameters); paper: its "
                     "printed count (qkvsearch.trainers.model.paper_counts)")
    if any(r.get("key") == "manifold" for r in rows):
        lines.append("key=manifold follows the paper's description (arXiv 2402.00534, no public code); the shapes "
                     "it leaves open are chosen in qkvsearch.trainers.model.attention.manifold")
    return "\n".join(lines)


def _as_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue().rstrip("\n")
