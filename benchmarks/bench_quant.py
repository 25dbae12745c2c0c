"""Quantization policies on this CPU: top-1 drop, size and measured latency of every policy of a trained model,
as ratios to the same model in full precision, measured in one run.

For linear, SNE, P-SNE and F-SNE at two widths (XCiT-N12, d 128, and XCiT-T12, d 192; 12 blocks each, 32 px
digits, patch 8: 17 tokens), each model is trained briefly with the campaign's own engine (trainers.engine.fit),
then quantized under each of the 27 policies (fp | int8_weight_only | int8_dynamic for each of q/k/v, proj,
mlp; trainers.quantize) and measured: validation top-1 (the whole split), size (trainers.quantize.weights_bytes)
and latency (batch 1, one thread, eval under inference_mode; all policies of a model timed in interleaved
rounds, median of per-round medians). Per model it prints fp, the two uniform int8 policies, and the mixed
policies on the front over (top1_q max, latency min, size min) that no uniform policy dominates.

    python benchmarks/bench_quant.py            # the table in benchmarks/README.md
    python benchmarks/bench_quant.py --quick    # one width, fewer steps and rounds: a smoke test
    python benchmarks/bench_quant.py --models T12 --embeddings psne fsne   # some rows of the table
"""
from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time

import numpy as np
import torch

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.spaces.choices import PRECISION_CHOICES, policy_text
from qkvsearch.spaces.keys import QUANT_KEYS, quant_policy
from qkvsearch.trainers.cost import resolve_trial
from qkvsearch.trainers.engine import Dist, Run, evaluate
from qkvsearch.trainers.quantize import quantize_model, weights_bytes

MODELS = {"N12 (d 128)": "xcit_nano_12_p8_224", "T12 (d 192)": "xcit_tiny_12_p8_224"}
EMBEDDINGS = {"linear": {}, "sne": {"embedding": "sne"}, "psne": {"embedding": "psne"},
              "fsne": {"embedding": "fsne", "code_size": 8}}
POLICIES = [dict(zip(QUANT_KEYS, p)) for p in itertools.product(PRECISION_CHOICES, repeat=len(QUANT_KEYS))]
UNIFORM = {"fp", "int8_weight_only", "int8_dynamic"}


def train(model: str, keys: dict, epochs: int) -> tuple[dict, Run]:
    """The campaign's engine on one process: ``epochs`` of digits (1,437 training images, 22 updates each)."""
    cfg, _ = resolve_trial({"model": model, "img_size": 32, "dataset": "digits", "epochs": epochs, "batch_size": 64,
                            "lr": 2e-3, "warmup_epochs": 0.5, "seed": 0, **keys})
    run = Run(cfg, Dist())
    run.train()
    return cfg, run


def latencies(models: list[torch.nn.Module], rounds: int, calls: int) -> list[float]:
    """Median ms of a batch-1 forward of each model: every round times each model ``calls`` times, in a rotating
    order; the result is the median over rounds of each round's median."""
    x = torch.randn(1, 3, 32, 32)
    per = [[] for _ in models]
    with torch.inference_mode():
        for m in models:   # warm-up
            for _ in range(10):
                m(x)
        for r in range(rounds):
            order = list(range(len(models)))
            order = order[r % len(order):] + order[: r % len(order)]
            for i in order:
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    models[i](x)
                    times.append((time.perf_counter() - t0) * 1e3)
                per[i].append(statistics.median(times))
    return [statistics.median(p) for p in per]


def rows_of(cfg: dict, run, rounds: int, calls: int) -> list[dict]:
    base = run.raw.eval()
    models, rows = [], []
    for policy in POLICIES:
        q = quantize_model(copy.deepcopy(base), {**cfg, **policy}, "cpu")
        top1 = evaluate(q, run.val_src, Dist(), batch_size=256)["top1"]
        models.append(q)
        rows.append({"policy": policy, "top1": top1, "size_mb": weights_bytes(q) / 1e6})
    for row, ms in zip(rows, latencies(models, rounds, calls)):
        row["latency_ms"] = ms
    return rows


def front_report(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the uniform rows: fp, all int8_weight_only, all int8_dynamic; the mixed rows on the front over (top1
    max, latency min, size min) that no uniform row dominates)."""
    pts = np.array([[r["top1"], r["latency_ms"], r["size_mb"]] for r in rows])
    front = nondominated_mask(pts, ["max", "min", "min"])
    uniform = [r for r in rows if len(set(r["policy"].values())) == 1]
    uniform.sort(key=lambda r: ["fp", "int8_weight_only", "int8_dynamic"].index(next(iter(r["policy"].values()))))

    def dominated_by_uniform(r):
        return any(u["top1"] >= r["top1"] and u["latency_ms"] <= r["latency_ms"] and u["size_mb"] <= r["size_mb"]
                   and (u["top1"], u["latency_ms"], u["size_mb"]) != (r["top1"], r["latency_ms"], r["size_mb"])
                   for u in uniform)

    mixed = [r for r, f in zip(rows, front) if f and len(set(r["policy"].values())) > 1 and not dominated_by_uniform(r)]
    return uniform, sorted(mixed, key=lambda r: r["latency_ms"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", choices=[label.split()[0] for label in MODELS],
                    help="some widths only (default: both; --quick: N12)")
    ap.add_argument("--embeddings", nargs="+", choices=list(EMBEDDINGS), default=list(EMBEDDINGS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    epochs, rounds, calls = (1, 3, 5) if args.quick else (2, 6, 10)
    models = dict(list(MODELS.items())[:1]) if args.quick else MODELS
    if args.models:
        models = {label: name for label, name in MODELS.items() if label.split()[0] in args.models}
    embeddings = {emb: EMBEDDINGS[emb] for emb in args.embeddings}
    print(f"torch {torch.__version__}, 1 thread, batch 1, 32 px digits; ratios to the same model in fp\n")
    print("| model | embedding | policy | top-1 % | Δ top-1 | size MB | size ratio | latency ms | latency ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    found_mixed = 0
    for label, name in models.items():
        for emb, keys in embeddings.items():
            cfg, run = train(name, keys, epochs)
            rows = rows_of(cfg, run, rounds, calls)
            uniform, mixed = front_report(rows)
            fp = uniform[0]
            found_mixed += bool(mixed)
            for r in uniform + mixed[:3]:
                text = policy_text(quant_policy(r["policy"]))
                kind = "" if len(set(r["policy"].values())) == 1 else " (mixed, front)"
                print(f"| {label} | {emb} | {text}{kind} | {r['top1']:.2f} | {r['top1'] - fp['top1']:+.2f} | "
                      f"{r['size_mb']:.2f} | {r['size_mb'] / fp['size_mb']:.2f} | {r['latency_ms']:.2f} | "
                      f"{r['latency_ms'] / fp['latency_ms']:.2f} |", flush=True)
    print(f"\nmodels whose front holds a mixed policy no uniform one dominates: {found_mixed} of "
          f"{len(models) * len(embeddings)}")


if __name__ == "__main__":
    main()
