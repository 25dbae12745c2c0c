"""Parity of the device input path with timm's host path: the augmentation's statistics and a small task's top-1.

1. Statistics (--draws N): timm's own random draws against the device path's (trainers.data.device_augment), N of
   each: random resized crop (area share and log aspect, on images of 4 sizes, one needing timm's fallback), flip
   rate, RandAugment rand-m9-mstd0.5-inc1 (how often each op is applied, and each op's argument: timm's transform
   run with its op functions wrapped to note their calls), random erasing (share of images erased and erased
   area, timm's RandomErasing on the batch against timm's per image). Two-sample Kolmogorov-Smirnov and
   chi-square tests; the p-values say whether the two could be draws of one distribution.
2. Training (--seeds 0,1,2): the digits task (sklearn's 8x8 digits at 16 px, the tests' XCiT-nano cut to 2
   blocks) trained with the recipe (rand-m9-mstd0.5-inc1, random erasing 0.25, label smoothing 0.1) under
   data.pipeline host and device on this CPU, one process, each seed; top-1 of the last epoch, per seed, and the
   mean and standard deviation per path.

    python benchmarks/bench_input_parity.py [--draws 20000] [--seeds 0,1,2] [--epochs 15] [--no-train]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import numpy as np
import torch
from PIL import Image
from scipy import stats

from qkvsearch.trainers.data import device_augment as da

RA = "rand-m9-mstd0.5-inc1"
SIZES = [(300, 400), (400, 300), (500, 160), (333, 333)]   # (h, w); 500 x 160: timm's fallback crop sometimes


def crop_stats(n: int) -> list[str]:
    from timm.data.transforms import RandomResizedCropAndInterpolation as RRC

    random.seed(0)
    timm = []
    for k in range(n):
        h, w = SIZES[k % len(SIZES)]
        i, j, ch, cw = RRC.get_params(Image.new("RGB", (w, h)), da.CROP_SCALE, da.CROP_RATIO)
        timm.append((cw * ch / (w * h), math.log(cw / ch)))
    timm = np.asarray(timm)
    hw = torch.tensor([SIZES[k % len(SIZES)] for k in range(n)])
    d = da.draw(da.Recipe(224, True), hw, torch.Generator().manual_seed(0))
    b = d.boxes
    cw, ch = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    mine = torch.stack([cw * ch / (hw[:, 0] * hw[:, 1]), torch.log(cw / ch)], 1).numpy()
    lines = ["| statistic | timm | device path | test, p-value |", "|---|---|---|---|"]
    for col, what in enumerate(("crop area share", "crop log aspect")):
        t = stats.ks_2samp(timm[:, col], mine[:, col])
        lines.append(f"| {what}: mean (sd) | {timm[:, col].mean():.4f} ({timm[:, col].std():.4f}) | "
                     f"{mine[:, col].mean():.4f} ({mine[:, col].std():.4f}) | "
                     f"KS D {t.statistic:.4f}, p {t.pvalue:.2f} |")
    torch.manual_seed(0)
    timm_flips = np.mean([torch.rand(1).item() < 0.5 for _ in range(n)])   # torchvision's RandomHorizontalFlip
    flips = d.flips.double().mean().item()
    z = (flips - timm_flips) / math.sqrt(0.5 / n)
    lines.append(f"| flip rate | {timm_flips:.4f} | {flips:.4f} | z {z:.2f}, p {2 * stats.norm.sf(abs(z)):.2f} |")
    return lines


def randaugment_stats(n: int) -> list[str]:
    from timm.data.auto_augment import rand_augment_transform

    ra = rand_augment_transform(RA, {"translate_const": 100, "img_mean": da.FILL, "interpolation": Image.BILINEAR})
    timm = []
    for op in ra.ops:
        def noted(img, *args, _name=op.name, **kw):
            timm.append((_name, float(args[0]) if args else 0.0))
            return img
        op.aug_fn = noted
    random.seed(0)
    np.random.seed(0)
    img = Image.new("RGB", (8, 8))
    for _ in range(n):
        ra(img)
    spec = da.RandAugmentSpec.parse(RA)
    ops, mags, signs = da.rand_ops(spec, n, torch.Generator().manual_seed(0))
    mine = []
    for layer in range(spec.layers):
        for k, name in enumerate(spec.ops):
            on = ops[layer] == k
            mine += [(name, float(a)) for a in da.level_args(name, mags[layer][on], signs[layer][on])]
    table = np.array([[sum(1 for c in calls if c[0] == name) for name in spec.ops] for calls in (timm, mine)])
    chi = stats.chi2_contingency(table)
    lines = [f"\nRandAugment {RA}, {n} images each: ops applied {len(timm)} (timm) and {len(mine)} (device path) of "
             f"{2 * n} layers; op frequencies chi-square {chi.statistic:.1f} on {len(spec.ops) - 1} df, p "
             f"{chi.pvalue:.2f}",
             "| op | applied, timm | applied, device | argument mean (sd), timm | argument mean (sd), device | KS p |",
             "|---|---|---|---|---|---|"]
    for k, name in enumerate(spec.ops):
        a = np.asarray([v for c, v in timm if c == name])
        b = np.asarray([v for c, v in mine if c == name])
        p = f"{stats.ks_2samp(a, b).pvalue:.2f}" if len(set(a.tolist())) > 1 else "- (no argument)"
        lines.append(f"| {name} | {table[0, k]} | {table[1, k]} | {a.mean():.3f} ({a.std():.3f}) | "
                     f"{b.mean():.3f} ({b.std():.3f}) | {p} |")
    return lines


def erasing_stats(n: int) -> list[str]:
    from timm.data.random_erasing import RandomErasing

    random.seed(0)
    torch.manual_seed(0)
    grey = torch.full((n, 3, 32, 32), 128.0)
    plain = da.DeviceAugment(da.Recipe(32, True)).finish(grey.clone())
    batch = da.DeviceAugment(da.Recipe(32, True, erasing=0.25)).finish(grey.clone())
    per_image = RandomErasing(0.25, mode="pixel", device="cpu")
    one = torch.stack([per_image(p.clone()) for p in plain])
    out = []
    for x in (one, batch):
        changed = (x != plain).flatten(1)
        erased = changed.any(1)
        out.append((erased.double().mean().item(), changed.double().mean(1)[erased].numpy()))
    t = stats.ks_2samp(out[0][1], out[1][1])
    return [f"| random erasing 0.25: share of images erased | {out[0][0]:.4f} | {out[1][0]:.4f} | - |",
            f"| random erasing: erased area share, mean (sd) | {out[0][1].mean():.4f} ({out[0][1].std():.4f}) | "
            f"{out[1][1].mean():.4f} ({out[1][1].std():.4f}) | KS D {t.statistic:.4f}, p {t.pvalue:.2f} |"]


def train_top1(pipeline: str, seed: int, epochs: int) -> tuple[float, float]:
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.training import engine

    cfg = fill({"model": "xcit_nano_12_p8_224", "depth": 2, "img_size": 16, "dataset": "digits", "epochs": epochs,
                "batch_size": 64, "lr": 2e-3, "warmup_epochs": 1, "seed": seed, "label_smoothing": 0.1,
                "randaugment": RA, "random_erasing": 0.25, "data_pipeline": pipeline})
    t = time.perf_counter()
    history = engine.fit(cfg, engine.Dist())
    return history[-1]["top1"], time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=20000)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--no-train", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    for line in crop_stats(args.draws) + erasing_stats(min(args.draws, 4000)) + randaugment_stats(args.draws):
        print(line, flush=True)
    if args.no_train:
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"\ndigits, {args.epochs} epochs, top-1 (%) of the last epoch per seed")
    print("| path | " + " | ".join(f"seed {s}" for s in seeds) + " | mean (sd) | minutes |\n|---|"
          + "---|" * (len(seeds) + 2))
    for pipeline in ("host", "device"):
        runs = [train_top1(pipeline, s, args.epochs) for s in seeds]
        top = [r[0] for r in runs]
        print(f"| {pipeline} | " + " | ".join(f"{v:.2f}" for v in top) + f" | {statistics.mean(top):.2f} "
              f"({statistics.stdev(top):.2f}) | {sum(r[1] for r in runs) / 60:.1f} |", flush=True)


if __name__ == "__main__":
    main()
