"""Forward+backward time of the q/k/v embedding variants, measured side by side in one run.

Prints, per model: median step time, the median of per-round ratios to its reference (timm's own
model for ``linear``; our ``linear`` for the others) and, for the variants, the ratio of MACs
(trainers.model.cost). Runs on CPU in float32, or on CUDA under bf16 autocast when a GPU is present.
All models are timed in every round, in a rotating order (interleaved A/B), after warm-up steps.

    python benchmarks/bench_model.py            # XCiT-N12 (size S), 224 px, batch 8
    python benchmarks/bench_model.py --quick    # fewer rounds, smaller batch: a smoke test
    python benchmarks/bench_model.py --architecture   # attention and key choices at 65 and 1025 tokens

``--architecture``: a ViT of the Vision X-formers size (d 128, depth 4, 4 heads, MLP 256) at 32 px with
patch 4 (65 tokens) and patch 1 (1025 tokens): each attention, position, stem and key choice, and the
MLP-Mixer of the same width and depth, against softmax attention (timm's SDPA) with learned positions,
timm's patch embedding and the shared key; all timed side by side in one run per token count.
"""
from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

from qkvsearch.trainers import build_model
from qkvsearch.trainers.model.cost import model_cost

VARIANTS = {  # name -> model keys on top of the base config
    "timm": None,
    "linear": dict(embedding="linear"),
    "sne": dict(embedding="sne"),
    "psne": dict(embedding="psne"),
    "fsne-c8": dict(embedding="fsne", code_size=8, code_sharing="shared"),
}


ARCH_BASE = dict(model="vit_tiny_patch16_224", img_size=32, num_classes=10, embed_dim=128, depth=4, num_heads=4,
                 mlp_ratio=2.0)
ARCH_VARIANTS = {  # name -> architecture keys; compared with "softmax"
    "softmax": dict(attention="softmax"),
    "performer": dict(attention="performer", attn_features=64),
    "linformer": dict(attention="linformer", attn_proj_len=64),
    "linformer_shared_kv": dict(attention="linformer_shared_kv", attn_proj_len=64),
    "nystrom": dict(attention="nystrom", attn_landmarks=32),
    "fnet": dict(attention="fnet"),
    "rope": dict(pos_embed="rope"),
    "rope1d": dict(pos_embed="rope1d"),
    "conv": dict(patch_embed="conv"),
    "conv_plain": dict(patch_embed="conv_plain"),
    "mlp_mixer": dict(model="mixer_s16_224", num_heads=None, mlp_ratio=1.0),   # token-mixing: one unit a patch
    "manifold": dict(key="manifold", key_charts=8),
    "manifold-kua": dict(key="manifold", key_charts=8, key_aggregation="kua"),
}
ARCH_PATCHES = {65: 4, 1025: 1}   # tokens -> patch size at 32 px


def arch_config(name: str, patch: int) -> dict:
    """The model keys of one variant at one patch size (the MLP-Mixer's token-mixing width: the patch count,
    as the Vision X-formers paper sized it)."""
    cfg = {**ARCH_BASE, "patch_size": patch, **ARCH_VARIANTS[name]}
    if cfg["model"].startswith("mixer_"):
        cfg["token_mlp_ratio"] = (ARCH_BASE["img_size"] // patch) ** 2 / ARCH_BASE["embed_dim"]
    return cfg


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="xcit_nano_12_p16_224")
    p.add_argument("--img-size", type=int, default=224, help="pixels per side")
    p.add_argument("--batch", type=int, default=None, help="images per step (default 8; 4 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="timed steps per model (default 12; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads (default 1: on a shared machine a descheduled thread stalls every "
                        "parallel region, which makes 2-thread timings far noisier)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                   help="models to time (linear is always added: the others are compared with it)")
    p.add_argument("--quick", action="store_true", help="smoke-test size: batch 4, 3 rounds")
    p.add_argument("--architecture", action="store_true",
                   help="time the attention, position, stem and key choices instead of the embeddings")
    args = p.parse_args()
    args.batch = args.batch or (4 if args.quick else 8)
    args.rounds = args.rounds or (3 if args.quick else 12)
    args.variants = [v for v in VARIANTS if v in args.variants or v == "linear"]
    return args


def make_models(base: dict, names: list[str], device: torch.device) -> dict[str, torch.nn.Module]:
    models = {}
    for name in names:
        keys = VARIANTS[name]
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


def best_ratio(times: dict, a: str, b: str) -> float:
    """min time(a) / min time(b): contention only ever adds time, so the minima are the least disturbed."""
    return min(times[a]) / min(times[b])


def architecture(args, device: torch.device) -> None:
    """Each attention / key choice over softmax at 65 and 1025 tokens, next to its MAC ratio."""
    print(f"{'tokens':>6} {'choice':<19} {'params':>8} {'GMACs':>7} {'ms/step':>9} {'time ratio':>10} "
          f"{'best ratio':>10} {'MAC ratio':>10}")
    for tokens, patch in ARCH_PATCHES.items():
        models = {}
        for name in ARCH_VARIANTS:
            torch.manual_seed(0)
            models[name] = build_model(arch_config(name, patch)).to(device).train()
        x = torch.randn(args.batch, 3, ARCH_BASE["img_size"], ARCH_BASE["img_size"], device=device)
        times = measure(models, x, device, args.rounds, args.warmup)
        costs = {n: model_cost(arch_config(n, patch)) for n in models}
        for n in models:
            print(f"{tokens:>6} {n:<19} {costs[n]['params_m']:>7.3f}M {costs[n]['gmacs']:>7.3f} "
                  f"{1e3 * statistics.median(times[n]):>9.1f} {paired_ratio(times, n, 'softmax'):>9.3f}x "
                  f"{best_ratio(times, n, 'softmax'):>9.3f}x {costs[n]['gmacs'] / costs['softmax']['gmacs']:>9.3f}x")


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.architecture:
        desc = (f"{device.type} "
                f"({'bf16 autocast' if device.type == 'cuda' else f'fp32, {torch.get_num_threads()} threads'})")
        print(f"ViT d128 depth 4 heads 4 MLP 256 @ 32px, batch {args.batch}, {desc}; {args.warmup} warm-up + "
              f"{args.rounds} timed rounds, interleaved")
        t0 = time.perf_counter()
        architecture(args, device)
        print(f"(measured in {time.perf_counter() - t0:.0f} s; ratios over softmax attention with the shared key)")
        return
    base = dict(model=args.model, img_size=args.img_size, num_classes=1000)
    models = make_models(base, args.variants, device)
    x = torch.randn(args.batch, 3, args.img_size, args.img_size, device=device)
    desc = f"{device.type} ({'bf16 autocast' if device.type == 'cuda' else f'fp32, {torch.get_num_threads()} threads'})"
    print(f"{args.model} @ {args.img_size}px, batch {args.batch}, {desc}; "
          f"{args.warmup} warm-up + {args.rounds} timed rounds, interleaved")
    t0 = time.perf_counter()
    times = measure(models, x, device, args.rounds, args.warmup)
    costs = {n: model_cost({**base, **(VARIANTS[n] or {})}) for n in models}
    print(f"{'model':<9} {'params':>8} {'GMACs':>7} {'ms/step':>9} {'best ms':>8} {'vs':>7} "
          f"{'time ratio':>10} {'best ratio':>10} {'MAC ratio':>10}")
    for n in models:
        ref = "timm" if n == "linear" else "linear"
        ratios = f"{'':>7} {'':>10} {'':>10}" if ref not in models or n == "timm" else (
            f"{ref:>7} {paired_ratio(times, n, ref):>9.3f}x {best_ratio(times, n, ref):>9.3f}x")
        macs = "" if n in ("timm", "linear") else f"{costs[n]['gmacs'] / costs['linear']['gmacs']:.3f}x"
        print(f"{n:<9} {costs[n]['params_m']:>7.2f}M {costs[n]['gmacs']:>7.3f} "
              f"{1e3 * statistics.median(times[n]):>9.1f} {1e3 * min(times[n]):>8.1f} {ratios} {macs:>10}")
    print(f"(measured in {time.perf_counter() - t0:.0f} s; time ratio = median of per-round ratios; "
          "targets: linear vs timm <= 1.02x, "
          f"fsne-c8 vs linear <= 1.12x on CPU)")


if __name__ == "__main__":
    main()
