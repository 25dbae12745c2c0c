"""Training the supernet: trainers.engine's Run with the supernet as its module and the sandwich rule as its
step (BigNAS, AutoFormer), each rank of a DDP group taking its own shard of every batch.

Each optimizer update trains, on the same batch:
- the teacher: the largest candidate overall by counted MACs, on the labels;
- the largest and the smallest candidate by MACs of this update's branch (a branch: the values of the
  categorical keys drawn for the whole model, e.g. the embedding type; branches taken in turn, update after
  update, so every branch is trained as often; keys drawn per block split no branch, since 4^12 branches of one
  candidate each would leave no sandwich: their blocks' tensors are trained by the random subnets and the
  largest and smallest of each branch), and ``random_subnets`` candidates drawn at random;
  each on the teacher's soft labels (in-place distillation, KL to its detached output) or, with
  ``distill: false``, on the labels.
Every rank draws the same subnets (a generator seeded by the seed and the update), so every rank's gradients
reach the same tensors: they are averaged across ranks by hand (DDP assumes one forward per step), and a tensor
no subnet of the update used has no gradient and gets no optimizer update. No compile: every subnet is a graph
of its own.

The plan (``SupernetPlan``, plain data built by the campaign): the candidates' resolved configurations, their
MACs and their branches.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.trainers import data as qdata
from qkvsearch.trainers import engine
from qkvsearch.trainers.errors import DivergenceError


@dataclass(frozen=True)
class SupernetPlan:
    """What the supernet is trained over. configs: resolved configurations (trial configs); gmacs and branches:
    one per config; random_subnets: random candidates per update besides the sandwich; distill: students
    learn the teacher's soft labels (else the labels)."""

    configs: tuple[dict, ...]
    gmacs: tuple[float, ...]
    branches: tuple[str, ...]
    random_subnets: int = 2
    distill: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> SupernetPlan:
        return cls(tuple(d["configs"]), tuple(d["gmacs"]), tuple(d["branches"]), int(d["random_subnets"]),
                   bool(d["distill"]))

    def as_dict(self) -> dict:
        return {"configs": list(self.configs), "gmacs": list(self.gmacs), "branches": list(self.branches),
                "random_subnets": self.random_subnets, "distill": self.distill}

    @property
    def teacher(self) -> int:
        return int(np.argmax(self.gmacs))

    def sandwich(self) -> dict[str, tuple[int, int]]:
        """branch -> (its largest, its smallest candidate), branches in a fixed order."""
        out = {}
        for b in sorted(set(self.branches)):
            idx = [i for i, x in enumerate(self.branches) if x == b]
            out[b] = (max(idx, key=lambda i: self.gmacs[i]), min(idx, key=lambda i: self.gmacs[i]))
        return out

    def students(self, update: int, seed: int) -> list[int]:
        """The candidates update ``update`` trains besides the teacher (the same on every rank)."""
        branches = self.sandwich()
        largest, smallest = branches[sorted(branches)[update % len(branches)]]
        rng = np.random.default_rng([seed, update])
        drawn = rng.choice(len(self.configs), size=self.random_subnets, replace=True).tolist()
        return list(dict.fromkeys(i for i in (largest, smallest, *drawn) if i != self.teacher))


class SupernetRun(engine.Run):
    """engine.Run over the supernet of ``plan`` (module docstring); cfg: the teacher's filled config with the
    supernet's training recipe (data, epochs, optimizer, batch)."""

    def __init__(self, cfg: dict, dist: engine.Dist | None = None, wrap_model=None, faults=(), *,
                 plan: SupernetPlan):
        self.plan = plan
        super().__init__({**cfg, "compile": False}, dist, None, faults)  # no DDP wrapper: gradients by hand

    def build_model(self) -> torch.nn.Module:
        from qkvsearch.trainers.supernet.weights import Supernet

        return Supernet(list(self.plan.configs), seed=self.cfg["seed"])

    def run_epoch(self) -> dict:
        t0 = time.perf_counter()
        engine.seed_epoch(self.cfg["seed"], self.dist.rank, self.epoch)
        train = self._train_epoch()
        t1 = time.perf_counter()
        plan, batch = self.plan, max(2 * self.bpw, 128)
        largest, smallest = plan.teacher, int(np.argmin(plan.gmacs))
        top, low = (engine.evaluate(_Subnet(self.raw, plan.configs[i]), self.val_src, self.dist, batch_size=batch,
                                    autocast=self.autocast) for i in (largest, smallest))
        t2 = time.perf_counter()
        self.epoch += 1
        metrics = {EPOCH: float(self.epoch), "step": float(self.updates), "train_loss": train["loss"],
                   **top, "top1_smallest": low["top1"], "val_loss_smallest": low["val_loss"], "lr": self.lr(),
                   "images_per_s": train["images"] / (t1 - t0), "epoch_s": t2 - t0, "train_s": t1 - t0,
                   "eval_s": t2 - t1, "epoch_step_ms": 1e3 * (t1 - t0) / self.updates_per_epoch,
                   "qs_world_size": float(self.dist.world_size), "qs_accum_steps": float(self.accum),
                   "qs_first_step_at": float(self.first_step_at or 0.0),
                   "qs_setup_s": float((self.first_step_at or self.created_at) - self.created_at)}
        self.history.append(metrics)
        return metrics

    def _train_epoch(self) -> dict:
        cfg, dist, plan = self.cfg, self.dist, self.plan
        self.raw.train()
        order = qdata.train_shard(len(self.train_src), dist.world_size, dist.rank, cfg["seed"], self.epoch)
        batches = self.train_src.batches(order, self.bpw, dist.device, drop_last=True)
        losses = []
        for _ in range(self.updates_per_epoch):
            micro = [next(batches) for _ in range(self.accum)]
            if self.first_step_at is None:
                self.first_step_at = time.time()
            self.optimizer.zero_grad(set_to_none=True)
            students = plan.students(self.updates, cfg["seed"])
            loss = 0.0
            for x, y in micro:
                if self.mixup is not None:
                    x, y = self.mixup(x, y)
                with self.autocast():
                    logits = self.raw(x, plan.configs[plan.teacher])
                    teacher_loss = self.criterion(logits, y)
                (teacher_loss / self.accum).backward()
                soft = logits.detach().float().softmax(-1)
                loss += float(teacher_loss.detach())
                for i in students:
                    with self.autocast():
                        out = self.raw(x, plan.configs[i])
                        part = (F.kl_div(out.float().log_softmax(-1), soft, reduction="batchmean") if plan.distill
                                else self.criterion(out, y))
                    (part / self.accum).backward()
            loss /= self.accum
            if not math.isfinite(loss):
                raise DivergenceError(self.epoch + 1, self.updates % self.updates_per_epoch + 1, loss)
            self._average_gradients()
            if cfg["clip_grad"] is not None:
                torch.nn.utils.clip_grad_norm_([p for p in self.raw.parameters() if p.grad is not None],
                                               cfg["clip_grad"])
            self.optimizer.step()
            self.updates += 1
            if self.scheduler is not None:
                self.scheduler.step_update(num_updates=self.updates)
            losses.append(loss)
        mean = torch.tensor([float(np.mean(losses))], dtype=torch.float64, device=dist.device)
        return {"loss": float(dist.all_reduce_sum(mean) / dist.world_size),
                "images": float(self.updates_per_epoch * cfg["batch_size"])}

    def _average_gradients(self) -> None:
        """Each tensor's gradient averaged over the ranks (every rank trained the same subnets)."""
        if self.dist.world_size == 1:
            return
        for p in self.raw.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= self.dist.world_size


class _Subnet(torch.nn.Module):
    """One subnet of a supernet as a plain module (for engine.evaluate)."""

    def __init__(self, supernet, cfg: dict):
        super().__init__()
        self.supernet, self.cfg = supernet, cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.supernet(x, self.cfg)
