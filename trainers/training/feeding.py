"""Feeding a run's device: ``loader_workers: auto`` and the loader's wait share.

``auto`` is sized once per run, before its first batch, from what the training process measures:

- r: images/s one process decodes (the training source's ``decode_rate``: read, decode, training transform);
- g: images/s the device trains: a forward of one per-worker batch of random images through the module a step
  trains (``Run.timed_module``), in eval mode and without gradients, so that the run's weights, BatchNorm
  statistics and data order stay as they are; a training step counts as STEP_FORWARDS such forwards (the
  backward costs about two);
- C: the CPUs this process was given (torch's intra-op threads: the Ray Train worker's CPUs, set by
  trainers.ray_train.loop; a plain process's own).

With k loader processes an image costs 1/r + 1/g when k = 0 (the process decodes, then trains), else
max(1/(k r), s/g): decoding beside training, where on a CPU device the k processes take CPUs from training
(s = C / (C - k)) and on CUDA none (s = 1). k is the smallest count within NEAR_BEST of the best, at most C - 1
(one CPU runs the training process) and at most what the shards allow per rank (ShardSource.most_workers);
the ranks take their mean, rounded down, so that they read alike. A source read from memory needs none.

The wait share (``loader_wait``, an epoch metric): the part of the epoch's training time the step spent
waiting for its next batch.
"""
from __future__ import annotations

import logging
import math
import time

import torch

log = logging.getLogger(__name__)

STEP_FORWARDS = 3.0   # a training step's cost in forwards: the forward and a backward of about two
NEAR_BEST = 1.05      # fewer processes when they come within 5 % of the best time per image
RATE_FORWARDS = 2     # timed forwards of the device-rate probe, after one untimed


def chosen_workers(decode: float, train: float, cpus: int, *, cuda: bool, most: int | None = None) -> int:
    """Loader processes per rank (module docstring): decode, train: images/s of one decoding process and of the
    device; cpus: the process's CPUs; most: a cap of the data's own (None: none)."""
    limit = max(0, cpus - 1 if most is None else min(cpus - 1, most))

    def per_image(k: int) -> float:
        if k == 0:
            return 1 / decode + 1 / train
        return max(1 / (k * decode), (1.0 if cuda else cpus / (cpus - k)) / train)

    times = [per_image(k) for k in range(limit + 1)]
    return next(k for k, t in enumerate(times) if t <= min(times) * NEAR_BEST)


@torch.no_grad()
def train_rate(run) -> float:
    """Images/s the run's device trains, from timed forwards of one per-worker batch (module docstring)."""
    cfg, device = run.cfg, run.dist.device
    module = run.timed_module()
    x = torch.randn(run.bpw, cfg["in_chans"], cfg["img_size"], cfg["img_size"], device=device)
    was_training = module.training
    module.eval()
    try:
        with run.autocast():
            module(x)
            _sync(device)
            start = time.perf_counter()
            for _ in range(RATE_FORWARDS):
                module(x)
            _sync(device)
    finally:
        module.train(was_training)
    per_forward = (time.perf_counter() - start) / RATE_FORWARDS
    return run.bpw / max(STEP_FORWARDS * per_forward, 1e-9)


def size_loaders(run) -> int | None:
    """With ``loader_workers: auto``, set the run's sources' loader processes (module docstring) and return
    them; None for a config that sets a number."""
    if run.cfg["loader_workers"] != "auto":
        return None
    sources = [s for s in (run.train_src, run.val_src) if s.loader_workers is not None]   # sources.Source
    k = 0
    decode = run.train_src.decode_rate() if sources else None
    if decode is not None:
        most, train = run.train_src.most_workers(run.dist.world_size), train_rate(run)
        k = chosen_workers(decode, train, torch.get_num_threads(), cuda=run.dist.device.type == "cuda", most=most)
        log.info("loader_workers auto: %d (decoding %.0f images/s per process, the device training %.0f, %d CPUs)",
                 k, decode, train, torch.get_num_threads())
    if run.dist.world_size > 1:
        k = int(run.dist.all_reduce_sum(torch.tensor([float(k)], device=run.dist.device)).item()
                // run.dist.world_size)
    for source in sources:
        source.loader_workers = k
    return k


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Waited:
    """An iterator of batches that counts the seconds its consumer waited for each (``seconds``)."""

    def __init__(self, batches):
        self.batches, self.seconds = batches, 0.0

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self.batches)
        finally:
            self.seconds += time.perf_counter() - start


def epoch_metrics(waited_s: float, train_s: float, processes: int | None) -> dict:
    """{"loader_wait": the share of the training time spent waiting for batches, and with auto
    "loader_processes": the processes it chose}."""
    out = {"loader_wait": waited_s / train_s if train_s > 0 and math.isfinite(waited_s) else 0.0}
    return out if processes is None else {**out, "loader_processes": float(processes)}
