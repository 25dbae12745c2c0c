"""Quantization policies on this CPU: what int8 does to a trained model's predictions, its size and its measured
latency, policy by policy, beside the same model in full precision, measured in one run.

The task is one where int8 moves predictions: digits_clutter (trainers.data.formats: a digit among pieces of
others, 32 px, patch 8: 17 tokens), validated on VAL_COPIES copies of each of its 360 validation digits (2,160
images at 6; the dataset's own 1,800 are the first 5 copies), each copy at other places among other pieces. The
model (XCiT-N12, d 128, 12 blocks, linear q/k/v by default) is trained with the campaign's engine
(trainers.training.engine.Run), then quantized under each policy (trainers.model.quantize) and measured:

- top-1 over the validation images, and Δ top-1 against fp with a 95 % bootstrap interval over the source digits
  (the 360 digits resampled with replacement, each with all its copies: copies of one digit are not independent
  images), the fp and int8 predictions paired image by image;
- changed: the share of images whose predicted class differs from fp's (a change can fix a wrong prediction as
  well as break a right one, so it can be above |Δ top-1|);
- size (trainers.model.quantize.weights_bytes) and latency (batch 1, one thread, inference_mode; all policies of a model
  timed in interleaved rounds, median of per-round medians).

Policies: per part, uniform over the blocks (fp or int8_weight_only for each part the model has, and
int8_dynamic everywhere; ``--all-parts``: every precision for each part, 27 on an XCiT, at ~11x fp's CPU time for
each int8_dynamic evaluation here), and per block (``block_policies``: one int8 precision in every part but some
blocks, as ``quant_qkv.<i>`` keys). It prints fp, the two uniform int8 policies, the per-block policies and the
per-part mixed ones on the front over (top-1 max, latency min, size min) that no uniform policy dominates; then,
per model, which per-block policies are on that front and which of them no uniform policy dominates.

    python benchmarks/bench_quant.py            # the table in benchmarks/README.md
    python benchmarks/bench_quant.py --quick    # a short training, 360 images, fewer rounds: a smoke test
    python benchmarks/bench_quant.py --models T12 --embeddings sne fsne   # other models
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
from qkvsearch.spaces.blocks import block_key
from qkvsearch.spaces.choices import FULL_PRECISION, PRECISION_CHOICES, policy_text
from qkvsearch.spaces.keys import quant_policy
from qkvsearch.trainers.data.formats import digits_clutter
from qkvsearch.trainers.data.sources import TensorSource
from qkvsearch.trainers.model.cost import resolve_trial
from qkvsearch.trainers.model.quantize import linear_forms, part_linears, quantize_model, weights_bytes
from qkvsearch.trainers.training.engine import Dist, Run

MODELS = {"N12 (d 128)": "xcit_nano_12_p8_224", "T12 (d 192)": "xcit_tiny_12_p8_224"}
EMBEDDINGS = {"linear": {}, "sne": {"embedding": "sne"}, "psne": {"embedding": "psne"},
              "fsne": {"embedding": "fsne", "code_size": 8}}
DEFAULT_EMBEDDINGS = ("linear",)
INT8 = tuple(p for p in PRECISION_CHOICES if p != FULL_PRECISION)   # int8_weight_only, int8_dynamic
VAL_COPIES = 6         # copies of each validation digit: 6 x 360 = 2,160 images
BOOTSTRAP = 2000       # resamples of the source digits
CPU = torch.device("cpu")


def train(model: str, keys: dict, epochs: int, steps: int | None) -> tuple[dict, Run]:
    """The campaign's engine on one process: ``epochs`` of digits_clutter (4,311 training images, 67 updates of 64
    each, or ``steps``)."""
    cfg, _ = resolve_trial({"model": model, "img_size": 32, "dataset": "digits_clutter", "epochs": epochs,
                            "batch_size": 64, "lr": 2e-3, "warmup_epochs": 0.5, "max_steps_per_epoch": steps,
                            "seed": 0, **keys})
    run = Run(cfg, Dist())
    run.train()
    return cfg, run


def validation(cfg: dict, copies: int) -> tuple[TensorSource, np.ndarray]:
    """(the validation images, (N,) the source digit of each): ``copies`` of each validation digit."""
    _, (images, labels) = digits_clutter(cfg, val_copies=copies)
    digits = len(labels) // copies
    return TensorSource(images, labels, cfg["img_size"], cfg["in_chans"]), np.arange(len(labels)) % digits


def block_policies(parts: list[str], depth: int) -> dict[str, dict]:
    """name -> a per-block policy of a model of ``depth`` blocks (``quant_qkv.<i>`` keys): one int8 precision in
    every part but some blocks, left in fp or given the other precision."""
    weight_only, dynamic = INT8
    w8, a8w8 = PRECISION_CHOICES[weight_only].tag, PRECISION_CHOICES[dynamic].tag
    last, front = depth - 1, range(depth // 2)

    def at(precision: str, blocks=(), other: str = FULL_PRECISION) -> dict:   # every part, but these blocks
        return {**dict.fromkeys(parts, precision), **{block_key(k, b): other for k in parts for b in blocks}}

    return {f"{w8}, block 0 fp": at(weight_only, [0]),
            f"{w8}, block {last} fp": at(weight_only, [last]),
            f"{w8}, blocks 0 and {last} fp": at(weight_only, [0, last]),
            f"{w8}, blocks 0-{len(front) - 1} fp": at(weight_only, front),
            f"{a8w8}, blocks 0 and {last} fp": at(dynamic, [0, last]),
            f"{w8} in blocks 0-{len(front) - 1}, {a8w8} the rest": at(dynamic, front, weight_only)}


def policies_of(model: torch.nn.Module, all_parts: bool) -> list[tuple[str, str, dict]]:
    """(kind, name, policy) of every policy measured: "uniform" (one precision everywhere), "part" (per part,
    uniform over the blocks: fp or int8_weight_only for each part, or with ``all_parts`` any precision), "block"
    (block_policies)."""
    parts = [k for k, names in part_linears(linear_forms(copy.deepcopy(model))).items() if names]
    precisions = list(PRECISION_CHOICES) if all_parts else [FULL_PRECISION, INT8[0]]
    combos = list(itertools.product(precisions, repeat=len(parts)))
    combos += [] if all_parts else [(INT8[1],) * len(parts)]   # int8_dynamic everywhere
    out = []
    for combo in combos:
        policy = dict(zip(parts, combo))
        out.append(("uniform" if len(set(combo)) == 1 else "part", policy_text(quant_policy(policy)), policy))
    out += [("block", name, policy) for name, policy in block_policies(parts, len(model.blocks)).items()]
    return out


@torch.inference_mode()
def predictions(model: torch.nn.Module, source: TensorSource) -> np.ndarray:
    """(N,) the predicted class of every image of ``source``."""
    out = [model(x).argmax(dim=1) for x, _ in source.batches(source.part(1, 0), 256, CPU, drop_last=False)]
    return torch.cat(out).numpy()


def delta_interval(correct: np.ndarray, correct_fp: np.ndarray, sources: np.ndarray) -> tuple[float, float, float]:
    """(Δ top-1, its 2.5 and 97.5 percentiles) in points, the source digits resampled with replacement BOOTSTRAP
    times (the same resamples for every policy: seed 0)."""
    per = np.bincount(sources, weights=correct.astype(float) - correct_fp)   # (digits,) right minus fp's right
    size = np.bincount(sources)                                               # (digits,) copies of each
    picks = np.random.default_rng(0).integers(len(per), size=(BOOTSTRAP, len(per)))
    boot = 100.0 * per[picks].sum(axis=1) / size[picks].sum(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return 100.0 * per.sum() / size.sum(), float(lo), float(hi)


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


def rows_of(cfg: dict, run: Run, val: TensorSource, sources: np.ndarray, rounds: int, calls: int,
            all_parts: bool) -> list[dict]:
    base = run.raw.eval()
    labels = val.labels.numpy()
    fp_pred = predictions(base, val)
    fp_right = fp_pred == labels
    models, rows = [], []
    for kind, name, policy in policies_of(base, all_parts):
        q = quantize_model(copy.deepcopy(base), {**cfg, **policy}, "cpu")
        pred = predictions(q, val)
        delta, lo, hi = delta_interval(pred == labels, fp_right, sources)
        models.append(q)
        rows.append({"kind": kind, "name": name, "top1": 100.0 * float(np.mean(pred == labels)), "delta": delta,
                     "lo": lo, "hi": hi, "changed": 100.0 * float(np.mean(pred != fp_pred)),
                     "size_mb": weights_bytes(q) / 1e6})
    for row, ms in zip(rows, latencies(models, rounds, calls)):
        row["latency_ms"] = ms
    return rows


def mark_front(rows: list[dict]) -> None:
    """Set each row's "front" (on the front of all rows over top-1 max, latency min, size min) and "beats" (no
    uniform row dominates it)."""
    directions = ["max", "min", "min"]
    pts = np.array([[r["top1"], r["latency_ms"], r["size_mb"]] for r in rows])   # (rows, 3)
    uniform = pts[[r["kind"] == "uniform" for r in rows]]                          # (uniform rows, 3)
    for r, p, on in zip(rows, pts, nondominated_mask(pts, directions)):
        r["front"], r["beats"] = bool(on), bool(nondominated_mask(np.vstack([uniform, p]), directions)[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", choices=[label.split()[0] for label in MODELS], default=["N12"])
    ap.add_argument("--embeddings", nargs="+", choices=list(EMBEDDINGS), default=list(DEFAULT_EMBEDDINGS))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--val-copies", type=int, default=VAL_COPIES, help="copies of each validation digit")
    ap.add_argument("--all-parts", action="store_true",
                    help="every per-part policy (27 on an XCiT), int8_dynamic mixes included: ~11x fp's CPU time each")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    epochs, steps, copies, rounds, calls = (1, 5, 1, 2, 3) if args.quick else (args.epochs, None, args.val_copies,
                                                                                 6, 10)
    models = {label: name for label, name in MODELS.items() if label.split()[0] in args.models}
    embeddings = dict.fromkeys(args.embeddings[:1]) if args.quick else dict.fromkeys(args.embeddings)
    print(f"torch {torch.__version__}, 1 thread, batch 1, 32 px digits_clutter, {epochs} epochs; "
          f"{copies} copies of each of 360 validation digits; Δ top-1 [95 % bootstrap interval over the digits]\n")
    print("| model | embedding | policy | top-1 % | Δ top-1 [95 % CI] | changed % | size MB | size ratio | "
          "latency ms | latency ratio | front |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for label, name in models.items():
        for emb in embeddings:
            start = time.process_time()
            cfg, run = train(name, EMBEDDINGS[emb], epochs, steps)
            val, sources = validation(cfg, copies)
            rows = rows_of(cfg, run, val, sources, rounds, calls, args.all_parts)
            mark_front(rows)
            fp = rows[0]
            shown = [r for r in rows if r["kind"] in ("uniform", "block")]
            shown += sorted((r for r in rows if r["kind"] == "part" and r["front"] and r["beats"]),
                            key=lambda r: r["latency_ms"])[:3]
            for r in shown:
                front = ("yes" + ("" if r["beats"] else ", a uniform one dominates")) if r["front"] else ""
                if r["kind"] == "part":
                    front = "yes (per part)"
                print(f"| {label} | {emb} | {r['name']} | {r['top1']:.2f} | {r['delta']:+.2f} "
                      f"[{r['lo']:+.2f}, {r['hi']:+.2f}] | {r['changed']:.2f} | {r['size_mb']:.2f} | "
                      f"{r['size_mb'] / fp['size_mb']:.2f} | {r['latency_ms']:.2f} | "
                      f"{r['latency_ms'] / fp['latency_ms']:.2f} | {front} |", flush=True)
            on = [r["name"] for r in rows if r["kind"] == "block" and r["front"]]
            alone = [r["name"] for r in rows if r["kind"] == "block" and r["front"] and r["beats"]]
            summary.append(f"{label} {emb}: {len(rows)} policies, {len(on)} per-block ones on the front "
                           f"({'; '.join(on) or 'none'}), {len(alone)} of them dominated by no uniform policy "
                           f"({'; '.join(alone) or 'none'}); {time.process_time() - start:.0f} s CPU")
    print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
