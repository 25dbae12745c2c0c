"""Measured hardware cost of one configuration on this process's device, before any training.

``measure(cfg, ...)`` builds the model afresh (its weights do not matter), quantized under the config's policy for
inference (trainers.model.quantize) and in its own precision for the training step, and returns::

    {"latency_ms": median ms of an eval forward of latency_batch images, "latency_p90_ms": its p90,
     "throughput": images/s of eval forwards of ``batch`` images (median),
     "train_step_ms": median ms of forward + backward + optimizer step at ``train_batch`` images,
     "peak_mem_gb": peak memory of that training step (GB = 1e9 bytes),
     "size_mb": bytes of the weights as stored (trainers.model.quantize.weights_bytes) / 1e6,
     "compile_s": seconds spent compiling (0 when not compiled), "env": environment (``environment``),
     "stats": per timed metric {"n", "outliers", "ci_rel", "warmup"}}

How, as the field measures (airbench, timm's benchmark script, PyTorch's CUDA timing notes):
- inference in ``eval()`` under ``torch.inference_mode``; the trial's precision (bf16 autocast on CUDA when
  amp is auto or bf16: trainers.training.engine.autocast_context) and compile setting, compile time timed apart;
- warm-up in rounds of WARMUP_ROUND calls until two successive round medians agree within SETTLED
  (autotuning, recompiles and allocator growth done), at most WARMUP_MAX calls or ``max_s`` seconds;
- on CUDA a pair of events around each call and one synchronisation per round; on CPU ``perf_counter``;
- rounds are added until the 95 % distribution-free confidence interval of the median (order statistics,
  scipy.stats.binom) is within ±``rel_ci`` of it, or MAX_CALLS calls, or ``max_s`` seconds (MAX_S by default)
  from the start of the warm-up: a call slower than max_s / MIN_CALLS gets fewer timed calls, never fewer
  than FLOOR_CALLS (its stats say how many);
- outliers are trimmed by value (Tukey's fences, 1.5 IQR beyond the quartiles), not by position.
- another process computing on the GPU (nvidia-smi) is flagged in the environment (``gpu_shared``) and
  logged, not refused: a campaign's trial holds its GPU through Ray, so what shares it is outside Ray.
torch.utils.benchmark.Timer times blocks (a mean per block, a sync per block) and stops on IQR / median,
not on the median's confidence: hence this loop.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over one training step after the timed ones (the
optimizer's state exists); on CPU, where torch keeps no allocator statistics, the bytes of the tensors
alive at the step's peak (weights, gradients, optimizer state and what autograd saved for backward), which
leaves out transient buffers.

``cached_measure`` keys a measurement by (model identity, device, precision, batches, compile, versions) in a
folder or URI (qkvsearch.storage): a configuration is measured once per device and software.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import subprocess
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import binom

from qkvsearch.spaces.keys import QUANT_KEYS, identity, model_keys
from qkvsearch.spaces.metrics import MEASURED_METRICS
from qkvsearch.storage import read_json, write_json
from qkvsearch.trainers.training.engine import autocast_context

log = logging.getLogger(__name__)
WARMUP_ROUND, WARMUP_MAX, SETTLED = 5, 60, 0.05
MIN_CALLS, MAX_CALLS, MAX_S = 20, 400, 10.0   # per timed metric
FLOOR_CALLS = 5                                # timed calls past max_s: a median of fewer says little
REL_CI = 0.01                                  # stop when the median's 95 % CI is within ±1 %
FORMAT = 1                                     # of a cached measurement; a new format measures again


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    n: int              # calls kept
    outliers: int       # calls trimmed by value
    ci_rel: float       # half-width of the median's 95 % CI / median
    warmup: int         # warm-up calls

    def stats(self) -> dict:
        return {"n": self.n, "outliers": self.outliers, "ci_rel": self.ci_rel, "warmup": self.warmup}


def _round(fn, device: torch.device, calls: int) -> list[float]:
    """ms of each of ``calls`` calls of fn: CUDA events around each, one synchronisation at the end."""
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in pairs]
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def trim(samples) -> np.ndarray:
    """Samples inside Tukey's fences (1.5 IQR beyond the quartiles), in their order."""
    x = np.asarray(samples, dtype=np.float64)
    q1, q3 = np.percentile(x, [25, 75])
    fence = 1.5 * (q3 - q1)
    return x[(x >= q1 - fence) & (x <= q3 + fence)]


def median_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): the median and its distribution-free CI (ranks from Binomial(n, 1/2))."""
    s = np.sort(x)
    n = len(s)
    lo, hi = binom.interval(level, n, 0.5)
    return float(np.median(s)), float(s[max(int(lo) - 1, 0)]), float(s[min(int(hi), n - 1)])


def _warm_up(fn, device, deadline: float) -> tuple[int, float]:
    """Calls until two successive round medians agree within SETTLED, WARMUP_MAX calls, or the deadline
    (perf_counter) -> (calls made, the last round's median ms)."""
    last, done = None, 0
    while True:
        now = float(np.median(_round(fn, device, WARMUP_ROUND)))
        done += WARMUP_ROUND
        settled = last is not None and abs(now - last) <= SETTLED * max(last, 1e-9)
        if settled or done >= WARMUP_MAX or time.perf_counter() >= deadline:
            return done, now
        last = now


def time_calls(fn, device: torch.device, rel_ci: float = REL_CI, max_calls: int = MAX_CALLS,
               max_s: float = MAX_S) -> Timing:
    """Warm fn up, then time it in growing rounds until the median is known within ±rel_ci (or a cap:
    max_calls timed calls, or max_s seconds for the warm-up and the timing together, FLOOR_CALLS past it)."""
    deadline = time.perf_counter() + max_s
    warm, call_ms = _warm_up(fn, device, deadline)
    fits = int(max_s * 1e3 / max(call_ms, 1e-6))  # calls max_s holds: under MIN_CALLS only for a slow call
    samples: list[float] = []
    calls = max(FLOOR_CALLS, min(MIN_CALLS, fits))
    while True:
        samples += _round(fn, device, calls)
        kept = trim(samples)
        median, lo, hi = median_ci(kept)
        ci = (hi - lo) / 2 / max(median, 1e-12)
        if ci <= rel_ci or len(samples) >= max_calls or time.perf_counter() >= deadline:
            break
        calls = min(len(samples), max_calls - len(samples))  # double the sample
    return Timing(median, float(np.percentile(kept, 90)), len(kept), len(samples) - len(kept), ci, warm)


def environment(device: torch.device, precision: str, compiled: bool, batches: dict) -> dict:
    """What a figure was measured on and how: it goes beside every figure and keys the cache."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
    return {"device": name, "device_type": device.type, "torch": torch.__version__,
            "cuda": torch.version.cuda if device.type == "cuda" else None, "driver": _driver(device),
            "threads": torch.get_num_threads(), "precision": precision, "compile": compiled, **batches}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_smi(*query: str) -> list[str] | None:
    """Lines of ``nvidia-smi --query-... --format=csv,noheader`` (it comes with the driver); None when it
    is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def _driver(device: torch.device) -> str | None:
    """The NVIDIA driver's version, None on CPU or where nvidia-smi cannot tell."""
    lines = _nvidia_smi("--query-gpu=driver_version") if device.type == "cuda" else None
    return lines[0] if lines else None


def gpu_shared(device: torch.device) -> bool | None:
    """Whether another process computes on this GPU (nvidia-smi; None: cannot tell). Called once this
    process holds a CUDA context on it; in a container, whose process ids nvidia-smi does not show, one of
    the listed processes is taken to be this one. A measurement made then is flagged in its environment
    and logged: its figures may be slow."""
    if device.type != "cuda":
        return None
    rows = _nvidia_smi("--query-compute-apps=pid,gpu_uuid")
    if rows is None:
        return None
    uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}"  # nvidia-smi sees GPUs CUDA hides
    pids = {int(r.split(",")[0]) for r in rows if r.split(",")[-1].strip() == uuid}
    others = pids - {os.getpid()}
    return len(others) > (0 if os.getpid() in pids else 1)


def _tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared parameters count once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _cpu_step_bytes(model, optimizer, step) -> int:
    """Tensor bytes at a training step's peak on CPU, where torch keeps no allocator statistics: weights,
    gradients and optimizer state, plus every tensor autograd saved for the backward pass."""
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    state = [*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
             *(v for st in optimizer.state.values() for v in st.values())]
    return _tensor_bytes(state) + _tensor_bytes(saved)


def _inference(model, x, autocast):
    def call():
        with torch.inference_mode(), autocast():
            model(x)
    return call


def _train_step(model, optimizer, x, y, autocast):
    """One optimizer update on one micro-batch: what a trial's worker does per update without accumulation."""
    def call():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return call


def _first_call_s(fn, device) -> float:
    """Seconds of fn's first call (with torch.compile: compiling), synchronised."""
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _inputs(cfg: dict, batch: int, device) -> torch.Tensor:
    size = cfg["img_size"]
    return torch.randn(batch, cfg["in_chans"], size, size, device=device)  # (B, C, H, W)


def plan(cfg: dict, device=None, *, batch: int = 64, latency_batch: int = 1, train_batch: int = 32,
         compile: bool | None = None) -> tuple[torch.device, dict]:
    """(device, environment) of a measurement of a filled config; compile None: the trial's own setting
    (true; or auto on CUDA). Cheap: it also keys the cache before anything is built."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    compiled = (cfg["compile"] is True or (cfg["compile"] == "auto" and device.type == "cuda")) if compile is None \
        else bool(compile)
    precision = "fp32" if autocast_context(cfg, device) is contextlib.nullcontext else "bf16"
    batches = {"batch": batch, "latency_batch": latency_batch, "train_batch": train_batch}
    return device, environment(device, precision, compiled, batches)


def measure(cfg: dict, device=None, *, metrics=MEASURED_METRICS, rel_ci: float = REL_CI, max_s: float = MAX_S,
            **how) -> dict:
    """Measure a filled trial config (module docstring). metrics: which of spaces.metrics.MEASURED to measure
    (latency_ms also gives latency_p90_ms; peak_mem_gb comes with train_step_ms); how: ``plan``'s batch,
    latency_batch, train_batch, compile."""
    from qkvsearch.trainers.model.models import build_model
    from qkvsearch.trainers.model.quantize import quantized_copy, weights_bytes

    device, env = plan(cfg, device, **how)
    autocast, compiled = autocast_context(cfg, device), env["compile"]
    torch.manual_seed(0)
    raw = build_model(cfg).to(device)
    env["gpu_shared"] = gpu_shared(device)
    if env["gpu_shared"]:
        log.warning("another process uses %s: measured figures may be slow", env["device"])
    model = torch.compile(raw) if compiled else raw
    out: dict = {"compile_s": 0.0, "env": env, "stats": {}}
    raw.eval()
    # Inference runs the model as deployed, under its quantization policy (trainers.model.quantize; its speed does not
    # depend on the weights' values); training, in the model's own precision, is measured on ``raw``.
    served = quantized_copy(raw, cfg, device)
    if "size_mb" in metrics:
        out["size_mb"] = weights_bytes(served) / 1e6
    deployed = model if served is raw else torch.compile(served) if compiled else served
    for metric, b in (("latency_ms", env["latency_batch"]), ("throughput", env["batch"])):
        if metric in metrics:
            call = _inference(deployed, _inputs(cfg, b, device), autocast)
            out["compile_s"] += _first_call_s(call, device) if compiled else 0.0
            t = time_calls(call, device, rel_ci, max_s=max_s)
            out[metric] = t.median_ms if metric == "latency_ms" else b / (t.median_ms / 1e3)
            if metric == "latency_ms":
                out["latency_p90_ms"] = t.p90_ms
            out["stats"][metric] = t.stats()
    if "train_step_ms" in metrics or "peak_mem_gb" in metrics:
        out.update(_measure_train(cfg, raw, model, device, autocast, (rel_ci, max_s), out))
    return out


def _measure_train(cfg, raw, model, device, autocast, limits, out) -> dict:
    """train_step_ms and peak_mem_gb (module docstring); adds compile time and stats to ``out``."""
    from timm.optim import create_optimizer_v2

    (rel_ci, max_s), train_batch, compiled = limits, out["env"]["train_batch"], out["env"]["compile"]
    raw.train()
    optimizer = create_optimizer_v2(raw, opt=cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    x = _inputs(cfg, train_batch, device)
    y = torch.randint(0, cfg["num_classes"], (train_batch,), device=device)
    call = _train_step(model, optimizer, x, y, autocast)
    out["compile_s"] += _first_call_s(call, device) if compiled else 0.0
    t = time_calls(call, device, rel_ci, max_s=max_s)  # first: the optimizer's state exists after a step
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        call()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = _cpu_step_bytes(raw, optimizer, call)
    out["stats"]["train_step_ms"] = t.stats()
    return {"train_step_ms": t.median_ms, "peak_mem_gb": peak / 1e9}


def cache_key(cfg: dict, env: dict, metrics) -> str:
    """What decides a measurement: the model (spaces.keys.identity of its keys, solved width and quantization
    policy), the optimizer (the training step), the metrics, and the environment (device, precision, batches, compile,
    threads, versions)."""
    model = model_keys(cfg, *QUANT_KEYS, "width", "opt")
    env = {k: v for k, v in env.items() if k != "gpu_shared"}
    text = json.dumps({"model": identity(model, policy=True), "env": env, "metrics": sorted(metrics),
                       "format": FORMAT},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_measure(cfg: dict, cache: str, device=None, *, metrics=MEASURED_METRICS, max_s: float = MAX_S,
                   **how) -> tuple[dict, bool]:
    """(measurement, whether it came from ``cache``): ``<cache>/<cache_key>.json`` (a folder or URI) when a
    measurement of the same model on the same device and software is there, else measured and written."""
    _, env = plan(cfg, device, **how)
    path = f"{cache.rstrip('/')}/{cache_key(cfg, env, metrics)}.json"
    try:
        return read_json(path), True
    except FileNotFoundError:
        pass
    found = measure(cfg, device, metrics=metrics, max_s=max_s, **how)
    write_json(path, found)
    return found, False
