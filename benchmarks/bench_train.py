"""Training-loop overheads, measured side by side in one process (timings on a shared CPU are noisy).

1. Throughput: images/s of trainers.training.engine.train_one_epoch (one worker, no Ray) vs a plain PyTorch loop
   (same model, data, batch, AdamW, cross-entropy) - interleaved repeats, warm-up excluded, medians.
   Target: engine / plain >= 0.95.
2. Start-up: seconds from TorchTrainer.fit() (trainers.ray_train.loop.run_trainer) to the first training step,
   as recorded by the worker (metric qs_first_step_at, time.time()), for 1 and 2 workers; with 2, the
   run's backend config as qkvsearch makes it (Train's controller never imports torch) and Ray's own
   TorchConfig (it does), interleaved; and the floor under them: a whole fit() of a training function
   that reports once and does nothing else (Ray Train's own start and stop).

    python benchmarks/bench_train.py [--quick] [--repeats N] [--steps N] [--no-ray]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # reports arrive 0.2 s late, not 2 s

import torch

from qkvsearch.spaces.keys import fill

CFG = {"model": "xcit_nano_12_p8_224", "embedding": "fsne", "hidden_width": 64, "img_size": 16,
       "dataset": "digits", "batch_size": 64, "epochs": 1, "lr": 1e-3, "val_fraction": 0.2}


def engine_epoch(run, steps):
    """Seconds for `steps` optimizer updates of the engine (the code a Ray worker runs)."""
    from qkvsearch.trainers.training import engine

    run.updates_per_epoch = steps
    engine.seed_epoch(run.cfg["seed"], 0, run.epoch)
    t = time.perf_counter()
    engine.train_one_epoch(run)
    return time.perf_counter() - t


def plain_setup(cfg):
    """A plain loop's pieces: model, AdamW, and the training images prepared once as float tensors."""
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers import build_model
    from qkvsearch.trainers.data.datasets import load_data, prepare_images

    cfg = fill(cfg)
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    train, _ = load_data(cfg)
    x = prepare_images(train.images, cfg["img_size"], cfg["in_chans"])  # (N, 3, H, W), normalised
    return model, opt, x, train.labels


def plain_epoch(model, opt, x, y, batch, steps, epoch):
    """Seconds for `steps` updates of the textbook loop: shuffle, forward, CE, backward, step."""
    model.train()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
    t = time.perf_counter()
    for i in range(steps):
        idx = perm[i * batch:(i + 1) * batch]
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # a loop that logs its loss; the engine reads it once per update as well
    return time.perf_counter() - t


def bench_throughput(repeats, steps):
    from qkvsearch.trainers.training.engine import Run

    cfg = fill(dict(CFG, max_steps_per_epoch=steps))
    run = Run(cfg)
    plain = plain_setup(cfg)
    batch = cfg["batch_size"]
    engine_epoch(run, 1), plain_epoch(*plain, batch, 1, 0)  # warm-up
    eng, pln = [], []
    for r in range(repeats):  # interleaved, alternating which goes first
        for which in (("engine", "plain") if r % 2 == 0 else ("plain", "engine")):
            if which == "engine":
                eng.append(steps * batch / engine_epoch(run, steps))
            else:
                pln.append(steps * batch / plain_epoch(*plain, batch, steps, r))
    ratios = [e / p for e, p in zip(eng, pln)]
    print(f"throughput ({cfg['model']} {cfg['embedding']} img {cfg['img_size']}, batch {batch}, "
          f"{torch.get_num_threads()} threads, {steps} steps x {repeats} repeats)")
    print(f"  engine  median {statistics.median(eng):8.1f} images/s   {[round(v) for v in eng]}")
    print(f"  plain   median {statistics.median(pln):8.1f} images/s   {[round(v) for v in pln]}")
    print(f"  ratio engine/plain: median {statistics.median(ratios):.3f}  "
          f"(per repeat {[round(v, 3) for v in ratios]}; target >= 0.95)")


def bench_startup(workers, repeats):
    from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray
    from qkvsearch.trainers.training import loop

    start_local_ray(trial_slots=1, num_cpus=2)
    cfg = fill(dict(CFG, max_steps_per_epoch=2, val_fraction=0.05))
    ours = loop._ddp_config_class
    variants = {1: ["ours"], 2: ["ours", "TorchConfig"]}
    with tempfile.TemporaryDirectory() as storage:
        for n in workers:
            seen = {v: ([], [], []) for v in variants.get(n, ["ours"])}
            for r in range(repeats):  # interleaved
                for variant, (waits, setups, totals) in seen.items():
                    loop._ddp_config_class = ours if variant == "ours" else (lambda: None)
                    try:
                        t0 = time.time()
                        result = loop.run_trainer(cfg, num_workers=n, name=f"startup{n}_{variant}_{r}",
                                                  storage_path=storage)
                        totals.append(time.time() - t0)
                    finally:
                        loop._ddp_config_class = ours
                    last = result.return_value[-1]
                    waits.append(last["qs_first_step_at"] - t0)
                    setups.append(last["qs_setup_s"])
            for variant, (waits, setups, totals) in seen.items():
                label = "" if len(seen) == 1 else f" ({'torch-free controller' if variant == 'ours' else variant})"
                print(f"start-up, {n} worker(s){label}: fit() -> first training step median "
                      f"{statistics.median(waits):.2f} s {[round(w, 2) for w in waits]}; of which the engine's own "
                      f"setup (data, model, optimizer) {statistics.median(setups):.2f} s; whole fit() "
                      f"{statistics.median(totals):.2f} s")
            if len(seen) == 2:
                a, b = (statistics.median(seen[v][0]) for v in seen)
                print(f"  ratio fit() -> first step, torch-free controller / TorchConfig: {a / b:.3f}")
            floor = [_empty_fit(n, storage, f"empty{n}_{r}") for r in range(repeats)]
            print(f"  floor, {n} worker(s): a whole fit() of a training function that does nothing "
                  f"{statistics.median(floor):.2f} s {[round(f, 2) for f in floor]}")
    stop_local_ray()


def _empty_fit(workers: int, storage: str, name: str) -> float:
    import ray.train

    from qkvsearch.trainers.training import loop

    ddp = loop._ddp_config_class()
    trainer = loop._trainer_class()(
        _report_once, torch_config=ddp("gloo") if ddp else None,
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        run_config=ray.train.RunConfig(name=name, storage_path=storage))
    t0 = time.time()
    trainer.fit()
    return time.time() - t0


def _report_once(config):
    import ray.train

    ray.train.report({"done": 1.0})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and steps (smoke test)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch threads in this process (Ray workers: 1)")
    p.add_argument("--no-ray", action="store_true", help="skip the start-up measurement")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    repeats, steps = (3, 4) if args.quick else (args.repeats, args.steps)
    bench_throughput(repeats, steps)
    if not args.no_ray:
        bench_startup((1, 2), 1 if args.quick else 3)


if __name__ == "__main__":
    main()
