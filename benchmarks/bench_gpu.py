"""The GPU training path, measured side by side in one run (needs CUDA; prints what it measured).

1. Throughput: images/s of trainers.training.engine (bf16 autocast; torch.compile on and off) vs a plain eager
   timm loop (the same model, batch, AdamW, cross-entropy, bf16 autocast, inputs already on the GPU,
   no host read per step) on XCiT-N12 (xcit_nano_12_p16_224) and XCiT-S12 (xcit_small_12_p16_224) at 224 px
   (--models), one model after the other. Interleaved repeats after warm-up (compilation excluded and timed
   apart), medians. Target: compiled engine / plain >= 1.3.
2. Embeddings: F-SNE-C8 (paper width) vs linear, engine step time and peak memory, next to their MAC ratio.
3. End to end: a 1-GPU Ray Train trial (TorchTrainer, NCCL process group, bf16, compiled) on the
   synthetic dataset: wall time, fit() -> first step, images/s reported, final metrics finite.
4. One-shot (no Ray: the supernet trial's and the scoring task's code in this process): the supernet's
   update (the sandwich rule: the teacher, its branch's largest and smallest, 2 random subnets) against the
   largest subnet's stand-alone update (the same model, batch and bf16, eager as the supernet is, and
   compiled); then subnets scored per minute with inherited weights (BatchNorm recalibrated on 2 batches)
   on a 10,000-image validation split at 224 px, as Once-for-All ranks on 10,000 held-out images.

    python benchmarks/bench_gpu.py [--batch 256] [--steps 30] [--repeats 5] [--parts 1,2,3,4] [--score 40]
        [--models xcit_nano_12_p16_224,xcit_small_12_p16_224]
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

import torch

from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.keys import fill

MODEL = "xcit_nano_12_p16_224"
THROUGHPUT_MODELS = ("xcit_nano_12_p16_224", "xcit_small_12_p16_224")  # part 1: XCiT-N12, XCiT-S12 (d 128, 384)
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
    from qkvsearch.trainers.data import datasets as qdata
    from qkvsearch.trainers.training.engine import Dist, Run

    cfg = fill(dict(BASE, batch_size=batch, **over))
    run = Run(cfg, Dist(0, 1, DEVICE))
    run.train_src = qdata.TensorSource(*device_images(steps * batch, cfg["img_size"], cfg["num_classes"]),
                                       cfg["img_size"], cfg["in_chans"])
    run.updates_per_epoch = steps
    return run


def time_engine(run) -> float:
    """Seconds for one engine epoch (run.updates_per_epoch updates), GPU work included."""
    from qkvsearch.trainers.training import engine

    torch.cuda.synchronize()
    t = time.perf_counter()
    engine.train_one_epoch(run)
    torch.cuda.synchronize()
    return time.perf_counter() - t


class PlainLoop:
    """The textbook eager loop: timm model, AdamW, CE under bf16 autocast, normalised inputs on the GPU."""

    def __init__(self, batch: int, steps: int, model: str = MODEL):
        import timm

        torch.manual_seed(0)
        self.model = timm.create_model(model, num_classes=CLASSES).to(DEVICE)
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


def bench_throughput(batch: int, steps: int, repeats: int, model: str = MODEL):
    torch._dynamo.reset()  # a model measured before leaves no compiled graphs behind
    torch.cuda.empty_cache()
    compile_s = first_compiled_epoch(batch, steps, model)  # Inductor's on-disk cache cold (or as left before)
    torch._dynamo.reset()  # forget the compiled graphs in this process; Inductor's disk cache stays
    warm_s = first_compiled_epoch(batch, steps, model)  # what a later trial of the same model pays
    compiled = engine_run(batch, steps, compile=True, model=model)
    time_engine(compiled)
    runs = {"engine, compiled": compiled, "engine, eager": engine_run(batch, steps, compile=False, model=model)}
    plain = PlainLoop(batch, steps, model)
    time_engine(runs["engine, eager"]), plain.epoch()  # warm-up: cuBLAS/cuDNN plans, allocator
    rates = {k: [] for k in (*runs, "plain eager timm")}
    for r in range(repeats):
        order = list(rates) if r % 2 == 0 else list(reversed(rates))
        for name in order:
            seconds = plain.epoch() if name == "plain eager timm" else time_engine(runs[name])
            rates[name].append(steps * batch / seconds)
    base = statistics.median(rates["plain eager timm"])
    print(f"1. throughput: {model} at 224 px, bf16, batch {batch}, {steps} updates x {repeats} repeats, "
          f"{torch.cuda.get_device_name()}")
    for name, v in rates.items():
        print(f"   {name:18s} median {statistics.median(v):8.0f} images/s  ratio to plain "
              f"{statistics.median(v) / base:.3f}   {[round(x) for x in v]}")
    print(f"   first compiled epoch (Run built, compiled, {steps} steps): {compile_s:.1f} s; again with "
          f"Inductor's cache warm: {warm_s:.1f} s; target compiled / plain >= 1.3")


def first_compiled_epoch(batch: int, steps: int, model: str = MODEL) -> float:
    """Seconds from building a compiled Run to the end of its first epoch (compilation included)."""
    t0 = time.perf_counter()
    time_engine(engine_run(batch, steps, compile=True, model=model))
    return time.perf_counter() - t0


def bench_embeddings(batch: int, steps: int, repeats: int):
    from qkvsearch.trainers.model.cost import model_cost

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

    from qkvsearch.trainers.ray_train.loop import run_trainer

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


ONESHOT_SPACE = {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]},  # 105 configurations
                 "hidden_width": {"choice": [0.25, 0.5, 0.75, 1.0]}, "code_size": {"choice": [4, 8, 16]},
                 "depth": {"choice": [4, 6, 8, 10, 12]}}
VAL_IMAGES = 10_000


def bench_oneshot(batch: int, steps: int, repeats: int, score: int):
    import numpy as np

    from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
    from qkvsearch.trainers.data import datasets as qdata
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.supernet.scoring import SubnetScorer
    from qkvsearch.trainers.supernet.training import SupernetRun
    from qkvsearch.trainers.training import engine

    spec = load_campaign({
        "name": "gpu-oneshot", "model": {"name": MODEL, "img_size": BASE["img_size"], "num_classes": CLASSES},
        "data": {"dataset": "synthetic"}, "space": ONESHOT_SPACE,
        "train": {"epochs": 1, "batch_size": batch, "lr": BASE["lr"], "warmup_epochs": 0, "amp": "bf16"},
        "supernet": {"train": {"epochs": 1}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "random", "num_trials": score}, "storage": tempfile.gettempdir()})
    trials = candidates(spec)
    plan_dict = supernet_plan(spec)
    plan = SupernetPlan.from_dict(plan_dict)
    top = fill({**base_config(spec), **plan.teacher, **dict(spec.supernet.recipe), "batch_size": batch})
    train = qdata.TensorSource(*device_images(steps * batch, top["img_size"], CLASSES), top["img_size"],
                               top["in_chans"])

    def on_device(run):
        run.train_src, run.updates_per_epoch = train, steps
        return run

    def timed(epoch) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        epoch()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / steps

    supernet = on_device(SupernetRun(top, engine.Dist(0, 1, DEVICE), plan=plan))
    alone = {mode: on_device(engine.Run({**top, "compile": mode}, engine.Dist(0, 1, DEVICE)))
             for mode in (False, True)}
    epochs = {"supernet": functools.partial(engine.train_one_epoch, supernet),
              "alone, eager": functools.partial(engine.train_one_epoch, alone[False]),
              "alone, compiled": functools.partial(engine.train_one_epoch, alone[True])}
    for epoch in epochs.values():
        epoch()  # warm-up: compilation, cuBLAS/cuDNN plans, the supernet's skeletons
    step = {k: [] for k in epochs}
    for r in range(repeats):
        for name in (list(epochs) if r % 2 == 0 else list(reversed(epochs))):
            step[name].append(timed(epochs[name]))
    ms = {k: 1e3 * statistics.median(v) for k, v in step.items()}
    per_update = 1 + float(np.mean([len(plan.students(u, top["seed"])) for u in range(steps)]))
    print(f"4. one-shot: {MODEL} at 224 px, bf16, batch {batch}; space of {len(trials)} configurations, "
          f"{len(plan.sandwich)} branches; teacher {top['embedding']} depth {top['depth']}; "
          f"{torch.cuda.get_device_name()}")
    print(f"   update: supernet {ms['supernet']:.1f} ms ({per_update:.2f} subnets per update), largest subnet "
          f"alone {ms['alone, eager']:.1f} ms eager, {ms['alone, compiled']:.1f} ms compiled; supernet / alone "
          f"eager {ms['supernet'] / ms['alone, eager']:.2f}x, per subnet trained "
          f"{ms['supernet'] / per_update / ms['alone, eager']:.2f}x; medians of {repeats} x {steps} updates")
    del alone, epochs

    scorer = SubnetScorer(plan, {"model": supernet.raw.state_dict()}, top, bn_batches=2, device=DEVICE)
    scorer.train_src = train
    scorer.val_src = qdata.TensorSource(*device_images(VAL_IMAGES, top["img_size"], CLASSES), top["img_size"],
                                        top["in_chans"])
    drawn = np.random.default_rng(0).choice(len(trials), size=min(score + 2, len(trials)), replace=False)
    for i in drawn[:2]:
        scorer.score(trials[i]["config"])  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    top1 = [scorer.score(trials[i]["config"])["top1"] for i in drawn[2:]]
    seconds = time.perf_counter() - t
    print(f"   scoring: {len(top1)} subnets in {seconds:.1f} s = {60 * len(top1) / seconds:.0f} subnets/min "
          f"({len(top1) * VAL_IMAGES / seconds:.0f} validation images/s, BatchNorm on 2 batches of "
          f"{scorer.bpw}); peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    del scorer
    bench_scoring_actor(spec, plan_dict, supernet.raw.state_dict(), top,
                        [trials[i]["config"] for i in drawn[2:]])


def bench_scoring_actor(spec, plan: dict, state: dict, top: dict, configs: list[dict]):
    """Scoring as a one-shot campaign does it: a scorer actor of the campaign's pool (search.campaign.oneshot.
    scorers) on a local Ray holding the GPU, the device its own choice, on the synthetic dataset's validation
    split (trainers.data.datasets.SYNTHETIC_SIZES: fewer images than above, so images/s is the comparable figure)."""
    import ray

    from qkvsearch.search.campaign.oneshot.scorers import ScorerPool
    from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray
    from qkvsearch.trainers.data.datasets import SYNTHETIC_SIZES
    from qkvsearch.trainers.training.engine import STATE_FORMAT, save_state

    folder = tempfile.mkdtemp(prefix="bench-gpu-supernet-")
    save_state({"format": STATE_FORMAT, "model": state, "epoch": 1, "history": [], "config": top}, folder)
    gpu_spec = load_campaign({**spec.to_dict(), "resources": {"workers_per_trial": 1, "cpus_per_worker": 4,
                                                             "gpus_per_worker": 1}})
    start_local_ray(trial_slots=1, num_gpus=1)
    try:
        with ScorerPool(gpu_spec, plan, folder, top, 1) as pool:
            (actor,) = pool.get()
            ray.get(actor.score.remote(configs[:2]))   # warm-up
            t = time.perf_counter()
            out = ray.get(actor.score.remote(configs))
            seconds = time.perf_counter() - t
        failed = sum(1 for r in out if "error" in r)
        print(f"   scoring through the campaign's actor ({pool_device(pool)}): {len(configs)} subnets in "
              f"{seconds:.1f} s = {60 * len(configs) / seconds:.0f} subnets/min, "
              f"{len(configs) * SYNTHETIC_SIZES[1] / seconds:.0f} validation images/s, {failed} failed")
    finally:
        stop_local_ray()


def pool_device(pool) -> str:
    return ", ".join(w["device"] for w in pool.where) or "none"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parts", default="1,2,3,4", help="which parts to run, e.g. 1,3")
    p.add_argument("--score", type=int, default=40, help="subnets scored in part 4")
    p.add_argument("--models", default=",".join(THROUGHPUT_MODELS), help="timm models of part 1, in turn")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py: expected a CUDA device, found none")
    parts = set(args.parts.split(","))
    if "1" in parts:
        for model in args.models.split(","):
            bench_throughput(args.batch, args.steps, args.repeats, model)
    if "2" in parts:
        bench_embeddings(args.batch, args.steps, args.repeats)
    if "3" in parts:
        bench_ray_trial(args.batch)
    if "4" in parts:
        bench_oneshot(args.batch, args.steps, args.repeats, args.score)


if __name__ == "__main__":
    main()
