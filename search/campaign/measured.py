"""Measured cost in a campaign (spaces.keys.MEASURED): each configuration is measured on the kind of device
its trial's workers use, before that trial trains, once per (model, device, precision, batches, compile,
versions) thanks to a cache in the campaign's storage (trainers.measure.cached_measure).

Where: a trial of one worker trains in its own process, which holds that worker's CPUs and GPU
(driver.trial_resources), so it measures there, on what it will train on. A trial of several workers only
drives a TorchTrainer and holds nothing; it measures in a Ray task holding one worker's CPUs and GPUs.
Either way the measurement holds the device its figures describe (a GPU, or the worker's CPUs) while it
runs; training of other trials runs only on other devices. A configuration whose measurement breaks a
constraint ends its trial "infeasible" before anything trains (driver.run_trial), which the searcher learns
as it learns any infeasible trial.
"""
from __future__ import annotations

from dataclasses import dataclass

from qkvsearch.spaces.keys import MEASURED_METRICS, MODEL_GROUPS, batch_plan, finite, identity, names

CACHE_DIR = "qs_measurements"   # in the campaign folder, unless measure.cache names another place


@dataclass(frozen=True)
class MeasureSettings:
    """What a campaign measures and how (spaces.schema.MeasureSpec resolved; picklable)."""

    metrics: tuple[str, ...] = ()      # () : nothing is measured
    batch: int = 64
    latency_batch: int = 1
    cache: str = ""                    # folder or URI of the cache
    max_s: float = 10.0                # seconds of timing per metric at most


def measure_settings(spec, exp: str) -> MeasureSettings:
    from qkvsearch.spaces.measure import measured_metrics

    m = spec.measure
    return MeasureSettings(measured_metrics(spec), m.batch, m.latency_batch, m.cache or f"{exp}/{CACHE_DIR}",
                           m.max_s)


def _measure_here(cfg: dict, how: MeasureSettings, train_batch: int) -> tuple[dict, bool]:
    from qkvsearch.trainers.measure import cached_measure

    return cached_measure(cfg, how.cache, metrics=how.metrics, batch=how.batch, latency_batch=how.latency_batch,
                          train_batch=train_batch, max_s=how.max_s)


def measure_trial(cfg: dict, how: MeasureSettings, workers: int, cpus_per_worker: float,
                  gpus_per_worker: float) -> tuple[dict, dict]:
    """(measured metrics for the trial's cost, the measurement's record) of a filled config, measured
    where the trial trains (module docstring); the training step at the trial's per-worker batch."""
    train_batch = batch_plan(cfg, workers)[0]
    if workers == 1:
        found, hit = _measure_here(cfg, how, train_batch)
    else:
        import ray

        task = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(_measure_here)
        found, hit = ray.get(task.remote(cfg, how, train_batch))
    metrics = {m: float(found[m]) for m in how.metrics if finite(found.get(m)) is not None}
    record = {"env": found.get("env"), "latency_p90_ms": found.get("latency_p90_ms"),
              "compile_s": found.get("compile_s"), "stats": found.get("stats"), "cached": hit}
    return metrics, record


# What decides a trial's measured figures besides the device: its model, optimizer and batches.
MEASURED_BY = (*names(*MODEL_GROUPS), "width", "opt", "batch_size", "batch_per_worker")


def measured_key(config: dict) -> str:
    """Trials with one key share their measured figures (the campaign's device and settings are fixed)."""
    return identity({k: config.get(k) for k in MEASURED_BY})


def measured_of(result: dict | None) -> dict:
    """The measured metrics a trial's result carries (finite numbers)."""
    return {m: finite(result[m]) for m in MEASURED_METRICS if finite((result or {}).get(m)) is not None}
