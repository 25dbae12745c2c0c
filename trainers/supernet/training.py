"""Training the supernet: trainers.training.engine's Run with the supernet as its module and the sandwich rule as its
update (BigNAS, AutoFormer), each rank of a DDP group taking its own shard of every batch.

Each optimizer update trains, on the same micro-batches (the plan: trainers.supernet.plan.SupernetPlan):
- the teacher: the largest configuration of the space by counted MACs, on the labels;
- the largest and the smallest configuration by MACs of this update's branch (a branch: the values of the
  categorical keys drawn for the whole model, e.g. the embedding type; branches taken in turn, update after
  update, so every branch is trained as often; keys drawn per block split no branch, since 4^12 branches of one
  configuration each would leave no sandwich: their blocks' tensors are trained by the random subnets and the
  largest and smallest of each branch), and ``random_subnets`` configurations drawn from the whole space;
  each on the teacher's soft labels (in-place distillation, KL to its detached output) or, with
  ``distill: false``, on the labels.
Every rank draws the same subnets (a generator seeded by the seed and the update), so every rank's gradients
reach the same tensors: DDP assumes one forward per update, so they are averaged across ranks here, in buckets
as DDP's reducer does (``BUCKET_BYTES``); a tensor no subnet of the update used has no gradient and gets no
optimizer update. Everything else is a trial's: micro-batches, the divergence check of every update's losses
(the teacher's and its students' mean: ``LOSSES``) in one all-reduce per window, the injected faults, clipping,
the schedule, weight decay on what a stand-alone model decays (weights.Supernet.no_weight_decay), the metrics
and the cross-rank parameter checksum. No compile: every subnet is a graph of its own.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.supernet.weights import NotServed
from qkvsearch.trainers.training import engine

log = logging.getLogger(__name__)
BUCKET_BYTES = 25 * 2 ** 20   # gradients all-reduced at once, as DDP's default bucket_cap_mb


class SupernetRun(engine.Run):
    """engine.Run over the supernet of ``plan`` (module docstring); cfg: the teacher's filled config with the
    supernet's training recipe (data, epochs, optimizer, batch)."""

    LOSSES = ("teacher", "students")

    def __init__(self, cfg: dict, dist: engine.Dist | None = None, wrap_model=None, faults=(), *,
                 plan: SupernetPlan, prepared=None):
        self.plan = plan
        self.refused: set[str] = set()   # students the supernet cannot hold, skipped (logged once each)
        # no DDP wrapper: gradients by hand
        super().__init__({**cfg, "compile": False}, dist, None, faults, prepared=prepared)

    def build_model(self) -> torch.nn.Module:
        return self.plan.supernet(seed=self.cfg["seed"])

    def timed_module(self) -> torch.nn.Module:
        return _Subnet(self.raw, self.plan.teacher)   # every update starts with the teacher's forward

    def update(self, micro_batches, loss_hook=None) -> torch.Tensor:
        plan, accum = self.plan, len(micro_batches)
        students = plan.students(self.updates, self.cfg["seed"])
        sums = torch.zeros(2, device=self.dist.device)   # teacher, students
        trained = 0
        for x, y in micro_batches:
            if self.mixup is not None:
                x, y = self.mixup(x, y)
            with self.autocast():
                logits = self.raw(x, plan.teacher)
                loss = self.criterion(logits, y)
            if loss_hook is not None:
                loss = loss_hook(loss)
            (loss / accum).backward()
            sums[0] += loss.detach().float()
            soft = logits.detach().float().softmax(-1)
            trained = 0
            for cfg in students:
                part = self._student_loss(x, y, cfg, soft)
                if part is None:
                    continue
                if loss_hook is not None:
                    part = loss_hook(part)
                (part / accum).backward()
                sums[1] += part.detach().float()
                trained += 1
        return sums / torch.tensor([accum, max(1, accum * trained)], device=sums.device)

    def _student_loss(self, x, y, cfg: dict, soft: torch.Tensor) -> torch.Tensor | None:
        try:
            with self.autocast():
                out = self.raw(x, cfg)
                return (F.kl_div(out.float().log_softmax(-1), soft, reduction="batchmean") if self.plan.distill
                        else self.criterion(out, y))
        except NotServed as err:  # the same on every rank: every rank skips it
            if str(err) not in self.refused:
                self.refused.add(str(err))
                log.warning("a drawn subnet is skipped: %s", err)
            return None

    def reduce_gradients(self) -> None:
        """Each gradient averaged over the ranks, in buckets of BUCKET_BYTES (every rank trained the same
        subnets, so every rank holds the same gradients, in the same order)."""
        if self.dist.world_size == 1:
            return
        grads = [p.grad for p in self.raw.parameters() if p.grad is not None]
        for bucket in _buckets(grads, BUCKET_BYTES):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            torch.distributed.all_reduce(flat)
            flat /= self.dist.world_size
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def sync_buffers(self) -> None:
        """The evaluated subnets' buffers (their BatchNorm statistics live in their module trees) from rank 0."""
        for cfg in (self.plan.teacher, self.plan.smallest):
            self.dist.broadcast_buffers(self.raw.skeleton(cfg))

    def evaluate_epoch(self) -> dict:
        """The teacher's validation metrics, and the smallest configuration's top-1 and loss beside them."""
        batch = engine.eval_batch(self.bpw)
        top, low = (engine.evaluate(_Subnet(self.raw, cfg), self.val_src, self.dist, batch_size=batch,
                                    autocast=self.autocast) for cfg in (self.plan.teacher, self.plan.smallest))
        return {**top, "top1_smallest": low["top1"], "val_loss_smallest": low["val_loss"]}

    def served_top1(self, metrics: dict) -> dict:
        return {}   # subnets are scored under their policies after extraction (trainers.supernet.scoring)


def _buckets(grads: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Gradients in order, cut into runs of one dtype and at most ``limit`` bytes (a larger one alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not out or size + nbytes > limit or out[-1][0].dtype != g.dtype:
            out.append([])
            size = 0
        out[-1].append(g)
        size += nbytes
    return out


class _Subnet(torch.nn.Module):
    """One subnet of a supernet as a plain module (for engine.evaluate)."""

    def __init__(self, supernet, cfg: dict):
        super().__init__()
        self.supernet, self.cfg = supernet, cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.supernet(x, self.cfg)
