"""Forward+backward time of the q/k/v embedding variants, measured side by side in one run.

Prints, per model: median step time, the median of per-round ratios to its reference (timm's own
model for ``linear``; our ``linear`` for the others) and, for the variants, the ratio of MACs
(trainers.cost). Runs on CPU in float32, or on CUDA under bf16 autocast when a GPU is present.
All models are timed in every round, in a rotating order (interleaved A/B), after warm-up steps.

    python benchmarks/bench_model.py            # XCiT-N12 (size S), 224 px, batch 8
    python benchmarks/bench_model.py --quick    # fewer rounds, smaller batch: a smoke test
"""
from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

from trainers import build_model
from trainers.cost import model_cost

VARIANTS = {  # name -> model keys on top of the base config
    "timm": None,
    "linear": dict(embedding="linear"),
    "sne": dict(embedding="sne"),
    "psne": dict(embedding="psne"),
    "fsne-c8": dict(embedding="fsne", code_size=8, code_sharing="shared"),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="xcit_nano_12_p16_224")
    p.add_argument("--img-size", type=int, default=224, help="pixels per side")
    p.add_argument("--batch", type=int, default=None, help="images per step (default 8; 4 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="timed steps per model (default 12; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--quick", action="store_true", help="smoke-test size: batch 4, 3 rounds")
    args = p.parse_args()
    args.batch = args.batch or (4 if args.quick else 8)
    args.rounds = args.rounds or (3 if args.quick else 12)
    return args


def make_models(base: dict, device: torch.device) -> dict[str, torch.nn.Module]:
    models = {}
    for name, keys in VARIANTS.items():
        torch.manual_seed(0)
        if keys is None:
            m = timm.create_model(base["model"], pretrained=False, num_classes=base["num_classes"],
                                  img_size=base["img_size"])
        else:
            m = build_model({**base, **keys})
        models[name] = m.to(device).train()
    return models


def step(model: torch.nn.Module, x: torch.Tensor, device: torch.device) -> float:
    """Seconds of one forward + backward (gradients dropped afterwards)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return dt


def measure(models: dict, x: torch.Tensor, device: torch.device, rounds: int, warmup: int) -> dict:
    names = list(models)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate so no model always goes first
        for n in order:
            dt = step(models[n], x, device)
            if r >= warmup:
                times[n].append(dt)
    return times


def paired_ratio(times: dict, a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b) in the same round: robust to load drifting over the run."""
    return statistics.median(ta / tb for ta, tb in zip(times[a], times[b]))


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = dict(model=args.model, img_size=args.img_size, num_classes=1000)
    models = make_models(base, device)
    x = torch.randn(args.batch, 3, args.img_size, args.img_size, device=device)
    desc = f"{device.type} ({'bf16 autocast' if device.type == 'cuda' else f'fp32, {torch.get_num_threads()} threads'})"
    print(f"{args.model} @ {args.img_size}px, batch {args.batch}, {desc}; "
          f"{args.warmup} warm-up + {args.rounds} timed rounds, interleaved")
    t0 = time.perf_counter()
    times = measure(models, x, device, args.rounds, args.warmup)
    costs = {n: model_cost({**base, **(k or {})}) for n, k in VARIANTS.items()}
    print(f"{'model':<9} {'params':>8} {'GMACs':>7} {'ms/step':>9} {'time ratio':>22} {'MAC ratio':>10}")
    for n in models:
        ref = "timm" if n == "linear" else "linear"
        ratio = "" if n == "timm" else f"{paired_ratio(times, n, ref):.3f}x vs {ref}"
        macs = "" if n in ("timm", "linear") else f"{costs[n]['gmacs'] / costs['linear']['gmacs']:.3f}x"
        print(f"{n:<9} {costs[n]['params_m']:>7.2f}M {costs[n]['gmacs']:>7.3f} "
              f"{1e3 * statistics.median(times[n]):>9.1f} {ratio:>22} {macs:>10}")
    print(f"(measured in {time.perf_counter() - t0:.0f} s; targets: linear vs timm <= 1.02x, "
          f"fsne-c8 vs linear <= 1.12x on CPU)")


if __name__ == "__main__":
    main()
