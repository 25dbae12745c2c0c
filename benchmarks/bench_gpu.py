"""The GPU training path, measured side by side in one run (needs CUDA; prints what it measured).

1. Throughput: images/s of trainers.engine (bf16 autocast; torch.compile on and off) vs a plain eager
   timm loop (the same model, batch, AdamW, cross-entropy, bf16 autocast, inputs already on the GPU,
   no host read per step) on XCiT-N12 (xcit_nano_12_p16_224) at 224 px. Interleaved repeats after
   warm-up (compilation excluded and timed apart), medians. Target: compiled engine / plain >= 1.3.
2. Embeddings: F-SNE-C8 (paper width) vs linear, engine step time and peak memory, next to their MAC ratio.
3. End to end: a 1-GPU Ray Train trial (TorchTrainer, NCCL process group, bf16, compiled) on the
   synthetic dataset: wall time, fit() -> first step, images/s reported, final metrics finite.

    python benchmarks/bench_gpu.py [--batch 256] [--steps 30] [--repeats 5] [--parts 1,2,3]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

import torch

from qkvsearch.spaces.keys import fill

MODEL = "xcit_nano_12_p16_224"
BASE = {"model": MODEL, "img_size": 224, "dataset": "synthetic", "epochs": 1,
        "lr": 1e-3, "warmup_epochs": 0, "amp": "bf16"}
DEVICE = torch.device("cuda")
CLASSES = 10  # the synthetic dataset's


def device_images(n: int, img_size: int, classes: int):
    """(n, 3, img_size, img_size) uint8 images and (n,) labels, random, on the GPU."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randint(0, 256, (n, 3, img_size, img_size), generator=g, device=DEVICE, dtype=torch.uint8)
    return x, torch.randint(0, classes, (n,), generator=g, device=DEVICE)


def engine_run(batch: int, steps: int, **over):
    """An engine Run on the GPU whose training split is steps * batch device images at 224 px."""
    from qkvsearch.trainers import data as qdata
    from qkvsearch.trainers.engine import Dist, Run

    cfg = fill(dict(BASE, batch_size=batch, **over))
    run = Run(cfg, Dist(0, 1, DEVICE))
    run.train_src = qdata.TensorSource(*device_images(steps * batch, cfg["img_size"], cfg["num_classes"]),
                                       cfg["img_size"], cfg["in_chans"])
    run.updates_per_epoch = steps
    return run


def time_engine(run) -> float:
    """Seconds for one engine epoch (run.updates_per_epoch updates), GPU work included."""
    from qkvsearch.trainers import engine

    torch.cuda.synchronize()
    t = time.perf_counter()
    engine.train_one_epoch(run)
    torch.cuda.synchronize()
    return time.perf_counter() - t


class PlainLoop:
    """The textbook eager loop: timm model, AdamW, CE under bf16 autocast, normalised inputs on the GPU."""

    def __init__(self, batch: int, steps: int):
        import timm

        torch.manual_seed(0)
        self.model = timm.create_model(MODEL, num_classes=CLASSES).to(DEVICE)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=BASE["lr"], weight_decay=0.05)
        x, self.y = device_images(steps * batch, BASE["img_size"], CLASSES)
        self.x = ((x.float() / 255 - 0.45) / 0.225).view(steps, batch, *x.shape[1:])
        self.y = self.y.view(steps, batch)

    def epoch(self) -> float:
        self.model.train()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for x, y in zip(self.x, self.y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t


def bench_throughput(batch: int, steps: int, repeats: int):
    compile_s = first_compiled_epoch(batch, steps)  # Inductor's on-disk cache cold (or as left before)
    torch._dynamo.reset()  # forget the compiled graphs in this process; Inductor's disk cache stays
    warm_s = first_compiled_epoch(batch, steps)  # what a later trial of the same model pays
    compiled = engine_run(batch, steps, compile=True)
    time_engine(compiled)
    runs = {"engine, compiled": compiled, "engine, eager": engine_run(batch, steps, compile=False)}
    plain = PlainLoop(batch, steps)
    time_engine(runs["engine, eager"]), plain.epoch()  # warm-up: cuBLAS/cuDNN plans, allocator
    rates = {k: [] for k in (*runs, "plain eager timm")}
    for r in range(repeats):
        order = list(rates) if r % 2 == 0 else list(reversed(rates))
        for name in order:
            seconds = plain.epoch() if name == "plain eager timm" else time_engine(runs[name])
            rates[name].append(steps * batch / seconds)
    base = statistics.median(rates["plain eager timm"])
    print(f"1. throughput: {MODEL} at 224 px, bf16, batch {batch}, {steps} updates x {repeats} repeats, "
          f"{torch.cuda.get_device_name()}")
    for name, v in rates.items():
        print(f"   {name:18s} median {statistics.median(v):8.0f} images/s  ratio to plain "
              f"{statistics.median(v) / base:.3f}   {[round(x) for x in v]}")
    print(f"   first compiled epoch (Run built, compiled, {steps} steps): {compile_s:.1f} s; again with "
          f"Inductor's cache warm: {warm_s:.1f} s; target compiled / plain >= 1.3")


def first_compiled_epoch(batch: int, steps: int) -> float:
    """Seconds from building a compiled Run to the end of its first epoch (compilation included)."""
    t0 = time.perf_counter()
    time_engine(engine_run(batch, steps, compile=True))
    return time.perf_counter() - t0


def bench_embeddings(batch: int, steps: int, repeats: int):
    from qkvsearch.trainers.cost import model_cost

    print(f"2. embeddings: engine step time and peak memory, batch {batch}")
    rows = {}
    for name, over in (("linear", {"embedding": "linear"}),
                       ("F-SNE-C8", {"embedding": "fsne", "code_size": 8})):
        for mode in (True, False):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            run = engine_run(batch, steps, compile=mode, **over)
            time_engine(run)  # warm-up / compile
            step = statistics.median(time_engine(run) for _ in range(repeats)) / steps
            rows[name, mode] = (step, torch.cuda.max_memory_allocated() / 2**30)
            del run
        macs = model_cost(fill(dict(BASE, **over)))["gmacs"]
        rows[name] = macs
        print(f"   {name:9s} {macs:6.3f} GMACs/image   step compiled {1e3 * rows[name, True][0]:7.1f} ms "
              f"(peak {rows[name, True][1]:5.2f} GiB)   eager {1e3 * rows[name, False][0]:7.1f} ms "
              f"(peak {rows[name, False][1]:5.2f} GiB)")
    for mode, word in ((True, "compiled"), (False, "eager")):
        print(f"   F-SNE-C8 / linear, {word}: step time {rows['F-SNE-C8', mode][0] / rows['linear', mode][0]:.3f}, "
              f"MACs {rows['F-SNE-C8'] / rows['linear']:.3f}, peak memory "
              f"{rows['F-SNE-C8', mode][1] / rows['linear', mode][1]:.3f}")


def bench_ray_trial(batch: int):
    import ray

    from qkvsearch.trainers.loop import run_trainer

    cfg = fill(dict(BASE, batch_size=batch, epochs=2, max_steps_per_epoch=20, amp="auto", compile=True,
                    embedding="fsne", code_size=8))
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            t0 = time.time()
            result = run_trainer(cfg, num_workers=1, cpus_per_worker=4, gpus_per_worker=1, name="gpu-trial",
                                 storage_path=storage)
            wall = time.time() - t0
    finally:
        ray.shutdown()
    m = result.metrics
    finite = all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    print(f"3. Ray Train trial, 1 GPU, bf16, compiled, F-SNE-C8, {cfg['epochs']} epochs x 20 updates of "
          f"{batch}: fit() {wall:.1f} s, fit() -> first step {m['qs_first_step_at'] - t0:.1f} s, "
          f"last epoch {m['images_per_s']:.0f} images/s, train_loss {m['train_loss']:.3f}, "
          f"top1 {m['top1']:.2f}%, metrics finite: {finite}, checkpoint: {result.checkpoint is not None}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parts", default="1,2,3", help="which parts to run, e.g. 1,3")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py: expected a CUDA device, found none")
    parts = set(args.parts.split(","))
    if "1" in parts:
        bench_throughput(args.batch, args.steps, args.repeats)
    if "2" in parts:
        bench_embeddings(args.batch, args.steps, args.repeats)
    if "3" in parts:
        bench_ray_trial(args.batch)


if __name__ == "__main__":
    main()
