"""The per-rank training engine, free of Ray: one Run object, train_one_epoch, evaluate (checkpoint files:
trainers.training.checkpoints, re-exported here).

Used by both adapters: the Ray Train worker (trainers.ray_train.loop.train_worker) and the plain path
(trainers.training.cli: one process, or torchrun + torch.distributed). Loaders: trainers.training.feeding.

Rules that make a run reproducible and resumable:
- every rank builds the model after torch.manual_seed(seed): the same initial weights everywhere;
- at the start of epoch e (0-based) every rank reseeds torch / numpy / random from (seed, rank, e),
  and the data order comes from (seed, e): an epoch replays identically whether or not the run was
  interrupted before it, so a checkpoint needs no RNG state;
- the lr schedule steps per optimizer update (timm step_update(num_updates)); after a resume it is set
  from the restored update count, so the lr sequence is the same as in an uninterrupted run;
- one optimizer update = accum micro-batches of batch_per_worker images on each of world_size ranks
  (accum * batch_per_worker * world_size == batch_size); each micro-batch loss is divided by accum and
  DDP averages over ranks, so the gradient is the mean over the whole global batch. Epochs hold a
  whole number of updates (the remainder of the shuffled training set is dropped, different each epoch).
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from qkvsearch.spaces.batches import batch_plan, eval_batch
from qkvsearch.spaces.keys import model_keys, require_filled
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.spaces.upgrade import upgraded
from qkvsearch.trainers.data import datasets as qdata
from qkvsearch.trainers.training import feeding
from qkvsearch.trainers.training.checkpoints import STATE_FILE, STATE_FORMAT, load_state, save_state  # noqa: F401  (re-exported)
from qkvsearch.trainers.training.errors import CheckpointError, DivergenceError, SimulatedFailure  # noqa: F401  (re-exported)
from qkvsearch.trainers.training.faults import faults_for

log = logging.getLogger(__name__)


@dataclass
class Dist:
    """Where this rank runs. world_size > 1 needs an initialised torch.distributed process group."""
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(t)
        return t

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Rank 0's buffers (BatchNorm running stats) to every rank. DDP syncs them before each
        training forward, so after the epoch's last forward they differ by one local update."""
        if self.world_size > 1:
            for b in module.buffers():
                torch.distributed.broadcast(b, src=0)

    def spread(self, value: float) -> float:
        """max - min of a float over the ranks (0.0 when they agree exactly)."""
        if self.world_size == 1:
            return 0.0
        t = torch.tensor([value, -value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t[0] + t[1])


def seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Reseed torch, numpy and random from (seed, rank, epoch): augmentation / drop-path per rank."""
    s = np.random.SeedSequence([seed, rank, epoch]).generate_state(2)
    torch.manual_seed(int(s[0]) << 32 | int(s[1]))
    np.random.seed(s)
    random.seed(int(s[0]))


def param_checksum(model: torch.nn.Module) -> float:
    """float64 sum of all parameters and buffers: equal on every rank when the replicas are identical."""
    with torch.no_grad():
        return float(sum(t.detach().double().sum() for t in (*model.parameters(), *model.buffers())))


def autocast_context(cfg: dict, device: torch.device):
    """bf16 autocast on CUDA (amp auto or bf16); nothing on CPU."""
    amp = cfg["amp"]
    if amp == "bf16" and device.type != "cuda":
        log.warning("amp: bf16 is used on CUDA only; training in float32 on %s", device.type)
    if device.type == "cuda" and amp in ("auto", "bf16"):
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


# torch.compile pays for itself after this many optimizer updates. Measured on one H100 (XCiT-N12,
# 224 px, bf16, batch 256; benchmarks/bench_gpu.py): compiled steps 1.36-1.49x the eager loop's
# throughput (~23 ms less per step), the first compiled epoch ~108 s with Inductor's cache cold and
# ~23 s with it warm: break-even near 4,700 updates cold.
COMPILE_MIN_UPDATES = 5000


def compile_enabled(cfg: dict, device: torch.device, updates: int) -> bool:
    """torch.compile the training model? compile true; or auto, on CUDA, for a run of at least
    COMPILE_MIN_UPDATES updates (on CPU, and for short runs, compiling costs more than it saves)."""
    if cfg["compile"] != "auto":
        return cfg["compile"]
    return device.type == "cuda" and updates >= COMPILE_MIN_UPDATES


def accumulate_gradients(model, micro_batches, criterion, *, autocast=contextlib.nullcontext,
                         mixup=None, loss_hook=None) -> torch.Tensor:
    """Forward/backward over micro-batches [(x, y), ...] of equal size; grads = mean over all images.

    DDP's all-reduce runs only on the last micro-batch (model.no_sync() before it).
    Returns the mean loss, detached, shape ().
    """
    n = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for i, (x, y) in enumerate(micro_batches):
        if mixup is not None:
            x, y = mixup(x, y)
        last = i == n - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast():
                loss = criterion(model(x), y)
            if loss_hook is not None:
                loss = loss_hook(loss)
            (loss / n).backward()
        total += loss.detach().float()
    return total / n


class Run:
    """One rank's training state: model, optimizer, schedule, data, counters and history.

    cfg: a filled trial config; faults: rules of trainers.training.faults (tests of failure handling only);
    prepared: where its campaign prepared the dataset, for the device input path (trainers.data.pipelines).
    What an optimizer update does is the run's own (``update``, ``reduce_gradients``, ``LOSSES``): a trial
    trains its model, a supernet its teacher and students (trainers.supernet.training); everything around the
    update (micro-batches, the divergence check, clipping, the schedule, evaluation, metrics) is this class's.
    """

    LOSSES = ("loss",)   # the losses one update reports, checked for divergence; the first is train_loss

    def __init__(self, cfg: dict, dist: Dist | None = None, wrap_model=None, faults=(), *, prepared=None):
        self.created_at = time.time()
        self.cfg = cfg = require_filled(cfg)
        self.faults = faults_for(cfg, list(faults))
        self.dist = dist = dist or Dist()
        self.bpw, self.accum = batch_plan(cfg, dist.world_size)
        _set_determinism(cfg["deterministic"])
        qdata.check_dataset(cfg)
        self.train_src, self.val_src = qdata.load_data(cfg, dist.device, prepared)  # the input path: pipelines
        self.updates_per_epoch = self._updates_per_epoch()
        torch.manual_seed(cfg["seed"])  # same initial weights on every rank
        self.raw = self.build_model().to(dist.device)
        self.model = wrap_model(self.raw) if wrap_model else self.raw
        if compile_enabled(cfg, dist.device, self.updates_per_epoch * cfg["epochs"]):
            self.model = torch.compile(self.model)  # after DDP: its optimizer splits graphs at buckets
        self.optimizer, self.scheduler = self._optimizer_and_schedule()
        self.criterion = qdata.train_criterion(cfg)
        self.mixup = qdata.build_mixup(cfg)
        self.autocast = autocast_context(cfg, dist.device)
        self.epoch = 0          # completed epochs
        self.updates = 0        # completed optimizer updates, all epochs
        self.history = []       # rank-0-style metrics of every completed epoch
        self.first_step_at = None  # time.time() of this process's first training step
        self.loader_processes = feeding.size_loaders(self)  # loader_workers auto: sized now; else None

    def build_model(self) -> torch.nn.Module:
        """The module this run trains (a subclass trains another: trainers.supernet.training)."""
        from qkvsearch.trainers.model.models import build_model

        return build_model(self.cfg)

    def timed_module(self) -> torch.nn.Module:
        return self.raw   # a module whose forward(x) a training step runs (feeding.train_rate times it)

    def update(self, micro_batches, loss_hook=None) -> torch.Tensor:
        """One optimizer update's forwards and backwards over ``micro_batches``; -> (len(LOSSES),) its losses,
        detached, on the device."""
        loss = accumulate_gradients(self.model, micro_batches, self.criterion, autocast=self.autocast,
                                    mixup=self.mixup, loss_hook=loss_hook)
        return loss.reshape(1)

    def reduce_gradients(self) -> None:
        """The gradients averaged over the ranks before the update applies (DDP did it in the backward)."""

    def sync_buffers(self) -> None:
        """Rank 0's buffers to every rank before evaluation (Dist.broadcast_buffers)."""
        self.dist.broadcast_buffers(self.raw)

    def evaluate_epoch(self) -> dict:
        """The epoch's validation metrics (top1, top5, val_loss, val_images)."""
        return evaluate(self.raw, self.val_src, self.dist, batch_size=eval_batch(self.bpw), autocast=self.autocast)

    def served_top1(self, metrics: dict) -> dict:
        """{"top1_q": the trained model's top-1 under its quantization policy} (its top-1 when all in full
        precision), for the last epoch."""
        from qkvsearch.trainers.model.quantize import quantized_copy

        served = quantized_copy(self.raw, self.cfg, self.dist.device)  # the model itself when all fp
        return {"top1_q": metrics["top1"] if served is self.raw else evaluate(
            served, self.val_src, self.dist, batch_size=eval_batch(self.bpw), autocast=self.autocast)["top1"]}

    def _updates_per_epoch(self):
        per_update = self.bpw * self.accum * self.dist.world_size  # == batch_size
        full = len(self.train_src) // per_update
        if full == 0:
            raise ValueError(f"batch_size: expected at most {len(self.train_src)} (training images of "
                             f"{self.cfg['dataset']!r}), given {self.cfg['batch_size']}")
        cap = self.cfg["max_steps_per_epoch"]
        return min(full, cap) if cap else full

    def _optimizer_and_schedule(self):
        from timm.optim import create_optimizer_v2
        from timm.scheduler import create_scheduler_v2

        c = self.cfg
        opt = create_optimizer_v2(self.raw, opt=c["opt"], lr=c["lr"], weight_decay=c["weight_decay"])
        if c["sched"] == "none":
            return opt, None
        sched, _ = create_scheduler_v2(
            opt, sched=c["sched"], num_epochs=c["epochs"], warmup_epochs=c["warmup_epochs"],
            min_lr=c["min_lr"], warmup_lr=c["warmup_lr"], step_on_epochs=False,
            updates_per_epoch=self.updates_per_epoch)
        return opt, sched

    # -- checkpoint state ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Tensors and plain types only (loadable with torch.load(weights_only=True))."""
        return {
            "format": STATE_FORMAT, "epoch": self.epoch, "updates": self.updates,
            "model": self.raw.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "config": dict(self.cfg), "history": list(self.history),
            "seed_rule": "epoch e reseeds from numpy SeedSequence([seed, rank, e]); order from (seed, e)",
        }

    def load_state_dict(self, state: dict) -> None:
        _check_same_model(state["config"], self.cfg)
        self.raw.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.updates, self.history = state["epoch"], state["updates"], list(state["history"])
        self._set_lr()

    def _set_lr(self):
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=self.updates)

    def train(self, report=None) -> None:
        """Epochs from self.epoch to cfg["epochs"]; report(metrics, state_fn | None) after each."""
        every, last, fail_at = self.cfg["checkpoint_every"], self.cfg["epochs"], self.faults["fail_after_epoch"]
        while self.epoch < last:
            metrics = self.run_epoch()
            save = self.epoch % every == 0 or self.epoch == last
            if report:
                report(metrics, self.state_dict if save else None)
            if fail_at == self.epoch and self.epoch < last:
                raise SimulatedFailure(f"injected fault fail_after_epoch={fail_at}: stopping after epoch {self.epoch}")

    def lr(self) -> float:
        return max(g["lr"] for g in self.optimizer.param_groups)

    # -- one epoch --------------------------------------------------------------------------------

    def run_epoch(self) -> dict:
        """Train and evaluate one epoch; returns the flat metrics (finite floats) and appends them."""
        t0 = time.perf_counter()
        if self.dist.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.dist.device)
        seed_epoch(self.cfg["seed"], self.dist.rank, self.epoch)
        train = train_one_epoch(self)
        self.sync_buffers()  # evaluate and save one replica, the same on every rank
        t1 = time.perf_counter()
        val = self.evaluate_epoch()
        t2 = time.perf_counter()
        self.epoch += 1
        metrics = {
            EPOCH: float(self.epoch), "step": float(self.updates),
            "train_loss": train["loss"], **train["more"], **val, "lr": self.lr(),
            "images_per_s": train["images"] / (t1 - t0), "epoch_s": t2 - t0,
            "train_s": t1 - t0, "eval_s": t2 - t1,
            "epoch_step_ms": 1e3 * (t1 - t0) / self.updates_per_epoch,  # one update, data loading included
            **feeding.epoch_metrics(train["waited_s"], t1 - t0, self.loader_processes),
            **epoch_peak_memory(self.dist.device),
            "qs_param_checksum": (checksum := param_checksum(self.raw)),  # this rank's replica
            "qs_param_spread": self.dist.spread(checksum),  # max - min over ranks: 0.0 = identical
            "qs_world_size": float(self.dist.world_size), "qs_accum_steps": float(self.accum),
            "qs_first_step_at": float(self.first_step_at or 0.0),  # unix time, this process
            "qs_setup_s": float((self.first_step_at or self.created_at) - self.created_at),  # data, model...
        }
        if self.epoch == self.cfg["epochs"]:  # top1_q: the trained model under its quantization policy
            metrics.update(self.served_top1(metrics))
        self.history.append(metrics)
        return metrics


def epoch_peak_memory(device: torch.device) -> dict:
    """{"epoch_peak_mem_gb": peak CUDA memory allocated since the epoch began} on CUDA; {} on CPU, where
    torch keeps no allocator statistics (trainers.deploy.measure gives a CPU figure before training)."""
    if device.type != "cuda":
        return {}
    return {"epoch_peak_mem_gb": torch.cuda.max_memory_allocated(device) / 1e9}


# Optimizer updates between host reads of the loss. Reading it (the NaN check, the epoch's mean) waits
# for the device: on CUDA a read per update keeps the GPU idle while the host queues the next step.
CHECK_EVERY = {"cuda": 25}
CHECK_EVERY_DEFAULT = 1  # CPU: the read is free, and a NaN is caught before any update applies it


def train_one_epoch(run: Run) -> dict:
    """run.updates_per_epoch optimizer updates over this rank's shard; -> {"loss", "images", "more": the other
    losses' means by name, "train_loss_<name>"} (global).

    Each update's losses (run.LOSSES) stay on the device in `losses`; every CHECK_EVERY updates (and at the
    end) the losses since the last check are averaged over ranks in one all-reduce and checked for NaN/inf on
    the host, before that update applies: the first non-finite one raises DivergenceError with its step.
    """
    cfg, dist, model = run.cfg, run.dist, run.model
    model.train()
    order = qdata.train_part(run.train_src, dist.world_size, dist.rank, cfg["seed"], run.epoch)
    batches = feeding.Waited(run.train_src.batches(order, run.bpw, dist.device, drop_last=True))
    n = run.updates_per_epoch
    every = CHECK_EVERY.get(dist.device.type, CHECK_EVERY_DEFAULT)
    losses = torch.zeros(n, len(run.LOSSES), dtype=torch.float64, device=dist.device)  # (n, losses) of each update
    checked = 0
    for step in range(1, n + 1):
        micro = [next(batches) for _ in range(run.accum)]
        if run.first_step_at is None:
            run.first_step_at = time.time()
        run.optimizer.zero_grad(set_to_none=True)
        losses[step - 1] = run.update(micro, _nan_hook(run.faults, run.updates + 1))
        run.reduce_gradients()
        if step % every == 0 or step == n:
            _check_losses(run, losses, checked, step)
            checked = step
        if cfg["clip_grad"] is not None:
            torch.nn.utils.clip_grad_norm_(run.raw.parameters(), cfg["clip_grad"])
        run.optimizer.step()
        run.updates += 1
        if run.scheduler is not None:
            run.scheduler.step_update(num_updates=run.updates)
    images = n * cfg["batch_size"]
    means = losses.mean(dim=0).tolist()
    return {"loss": means[0], "images": float(images), "waited_s": batches.seconds,
            "more": {f"train_loss_{name}": m for name, m in zip(run.LOSSES[1:], means[1:])}}


def _check_losses(run: Run, losses: torch.Tensor, start: int, stop: int) -> None:
    """losses[start:stop] (updates, losses) -> their mean over ranks (in place; the same on every rank), then
    one host read: DivergenceError at the first update one of whose mean losses is not finite."""
    window = run.dist.all_reduce_sum(losses[start:stop].clone()) / run.dist.world_size
    losses[start:stop] = window
    bad = ~torch.isfinite(window)
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise DivergenceError(run.epoch + 1, start + i + 1, float(window[i, j]),
                              "" if len(run.LOSSES) == 1 else run.LOSSES[j])


def _nan_hook(faults, global_update):
    """Injected fault nan_at_update: the loss of that global update (1-based) becomes NaN."""
    if faults["nan_at_update"] == global_update:
        return lambda loss: loss * float("nan")
    return None


@torch.no_grad()
def evaluate(model, source, dist: Dist, *, batch_size: int, autocast=contextlib.nullcontext) -> dict:
    """top1 / top5 (percent) and mean CE loss over the WHOLE val set: each rank takes its shard,
    sums are all-reduced. Uses the unwrapped model: no collectives inside, shards may differ in size."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=dist.device)  # loss, correct1, correct5, count
    idx = qdata.eval_part(source, dist.world_size, dist.rank)
    for x, y in source.batches(idx, batch_size, dist.device, drop_last=False):
        with autocast():
            logits = model(x)
        logits = logits.float()  # (B, classes)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices  # (B, 5)
        sums[0] += F.cross_entropy(logits, y, reduction="sum")
        sums[1] += (top[:, 0] == y).sum()
        sums[2] += (top == y[:, None]).any(dim=1).sum()
        sums[3] += len(y)
    dist.all_reduce_sum(sums)
    model.train(was_training)
    n = max(float(sums[3]), 1.0)
    return {"val_loss": float(sums[0]) / n, "top1": 100.0 * float(sums[1]) / n,
            "top5": 100.0 * float(sums[2]) / n, "val_images": float(sums[3])}


def _check_same_model(saved: dict, cfg: dict):
    saved = upgraded(saved)   # a checkpoint written before some keys existed: what it meant by their absence
    diff = {k: (saved.get(k), cfg.get(k)) for k in {*model_keys(saved), *model_keys(cfg)} if saved.get(k) != cfg.get(k)}
    if diff:
        raise ValueError("checkpoint: expected the same model keys as the config, given checkpoint vs config "
                         + ", ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in sorted(diff.items())))


def _set_determinism(on: bool):
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def fit(cfg: dict, dist: Dist, *, wrap_model=None, restore=None, report=None, faults=(), init=None,
        init_head=False, make_run=None, prepared=None) -> list[dict]:
    """Train a filled config to cfg["epochs"], resuming from restore() -> state | None; returns every
    epoch's metrics.

    report(metrics, state_fn | None) runs after every epoch; state_fn builds the checkpoint state and is
    given every checkpoint_every epochs and at the last one. A resumed run first re-reports its
    checkpoint's epoch; one whose checkpoint had already finished does only that, without building the
    model or loading data. init: a checkpoint whose weights a fresh run starts from, with a new head
    (trainers.training.checkpoints.load_pretrained: a fine-tuning), with its head too when ``init_head``; a resumed run
    restores its own state instead.
    make_run(cfg, dist, wrap_model, faults, prepared=...): the Run to train (default Run; a supernet's:
    trainers.supernet). prepared: where the campaign prepared the dataset (Run).
    """
    cfg = require_filled(cfg)
    state = restore() if restore else None
    if state is not None and state["epoch"] >= cfg["epochs"] and state["history"]:
        _check_same_model(state["config"], cfg)
        if report:
            report(state["history"][-1], None)
        return list(state["history"])
    run = (make_run or Run)(cfg, dist, wrap_model, faults, prepared=prepared)
    if state is None and init:
        from qkvsearch.trainers.training.checkpoints import load_pretrained

        load_pretrained(run.raw, init, keep_head=init_head)  # the same file on every rank: replicas stay identical
    if state is not None:
        run.load_state_dict(state)
        if report and state["history"]:
            # The checkpoint's epoch may never have reached the search (its driver was stopped between the
            # checkpoint and the report): report it again. Readers keep one row per epoch.
            report(state["history"][-1], None)
    run.train(report)
    return run.history

