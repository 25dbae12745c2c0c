"""`qkvsearch cost`: parameters and MACs of every model a campaign's space can build, without training.

Only keys that change the model matter here; training hyper-parameters are left out. Integer or
float ranges over a model key (e.g. `hidden_width: {int: [32, 256]}`) are shown at their bounds.
"""
from __future__ import annotations

import csv
import io

from qkvsearch.spaces import base_config
from qkvsearch.trainers.cost import model_cost

COST_KEYS = ("model", "embedding", "hidden_width", "code_size", "code_sharing", "activation",
             "embed_class_attn", "img_size", "num_classes", "in_chans")


def model_configs(spec) -> list[dict]:
    """Every distinct model configuration of the space (variants x enumerable model-key dimensions)."""
    base = base_config(spec)
    variants = [dict(v) for v in spec.space.variants] or [{}]
    dims = [d for d in spec.space.dimensions if d.key in COST_KEYS]
    out, seen = [], set()

    def expand(chosen: dict, rest: list) -> None:
        if not rest:
            cfg = {**base, **chosen}
            key = tuple(sorted((k, repr(cfg.get(k))) for k in COST_KEYS))
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


def cost_table(spec) -> list[dict]:
    rows = []
    for cfg in model_configs(spec):
        cost = model_cost(cfg)
        broken = spec.violations(cost)
        fsne = cfg.get("embedding") == "fsne"
        rows.append({
            "model": cfg["model"], "embedding": cfg.get("embedding", "linear"),
            "hidden_width": cfg.get("hidden_width"), "width": cost["hidden_width"],
            "code_size": cfg.get("code_size") or (8 if fsne else None),
            "code_sharing": cfg.get("code_sharing") or ("shared" if fsne else None),
            "params": cost["params"], "params_m": cost["params_m"], "embed_params": cost["embed_params"],
            "gmacs": cost["gmacs"], "feasible": "yes" if not broken else "no: " + "; ".join(broken),
        })
    return rows


def format_table(rows: list[dict], as_csv: bool = False) -> str:
    if as_csv:
        return _as_csv(rows)
    header = (f"{'model':<24} {'embedding':<9} {'width (asked)':>15} {'code':>5} {'sharing':<9} "
              f"{'params M':>9} {'embed params':>12} {'GMACs':>8}  feasible")
    lines = [header, "-" * len(header)]
    for r in rows:
        asked = "" if r["hidden_width"] is None else f" ({r['hidden_width']})"
        width = "-" if r["embedding"] == "linear" else f"{r['width']}{asked}"
        lines.append(f"{r['model']:<24} {r['embedding']:<9} {width:>15} {r['code_size'] or '-':>5} "
                     f"{r['code_sharing'] or '-':<9} {r['params_m']:>9.3f} {r['embed_params']:>12,} "
                     f"{r['gmacs']:>8.4f}  {r['feasible']}")
    lines.append(f"{len(rows)} configuration(s); GMACs = multiply-accumulates per image (the papers' 'FLOPs')")
    return "\n".join(lines)


def _as_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue().rstrip("\n")
