"""Scoring subnets with the weights they inherit from a trained supernet, in one process: the checkpoint is
loaded once, then each subnet has its BatchNorm statistics recalibrated on a few training batches (when it has
BatchNorm: XCiT's convolutional patch embedding and its blocks' local patch interaction do) and is evaluated on
the validation split, as trainers.training.engine evaluates a trial. A subnet is also scored under its quantization
policy: ``top1_q``, the extracted model quantized (trainers.model.quantize) and evaluated again (its top-1 when the
policy quantizes nothing), and ``size_mb``, its weights' bytes as stored under the policy."""
from __future__ import annotations

import torch

from qkvsearch.spaces.batches import batch_plan
from qkvsearch.spaces.keys import quant_policy
from qkvsearch.trainers.data import datasets as qdata
from qkvsearch.trainers.model.quantize import quantize_model, state_bytes, weights_bytes
from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.supernet.training import _Subnet
from qkvsearch.trainers.training import engine

BN_SEED = 0   # the training images BatchNorm is recalibrated on: the same for every subnet


class SubnetScorer:
    """plan: the supernet's (SupernetPlan); state: its checkpoint state (trainers.training.engine.load_state); cfg: the
    teacher's filled config (data, batch); bn_batches: training batches for BatchNorm; device: where it runs."""

    def __init__(self, plan: SupernetPlan, state: dict, cfg: dict, bn_batches: int = 2, device=None):
        self.device = torch.device(device or "cpu")
        self.cfg, self.bn_batches = cfg, bn_batches
        self.supernet = plan.supernet(init=False)
        self.supernet.load_state_dict(state["model"])
        self.supernet.to(self.device).eval()
        self.train_src, self.val_src = qdata.load_data(cfg)
        self.bpw = batch_plan(cfg, 1)[0]
        self.autocast = engine.autocast_context(cfg, self.device)  # bf16 on CUDA, as a trial evaluates

    def _bn_batches(self):
        """The first ``bn_batches`` training batches (x (B, C, H, W)) of the passes (seed BN_SEED) over the training
        split: past the first pass, the next ones'. DatasetError when the split holds no whole batch."""
        given, epoch = 0, 0
        while given < self.bn_batches:
            order = qdata.train_part(self.train_src, 1, 0, BN_SEED, epoch)
            before = given
            for x, _ in self.train_src.batches(order, self.bpw, self.device, drop_last=True):
                yield x
                given += 1
                if given == self.bn_batches:
                    return
            if given == before:
                raise qdata.DatasetError(f"supernet.bn_batches: expected a training split of at least one batch "
                                         f"({self.bpw} images) to recalibrate BatchNorm on, given "
                                         f"{len(self.train_src)} images")
            epoch += 1

    def _recalibrate(self, cfg: dict) -> None:
        """The subnet's BatchNorm statistics from the same batches under the same random state, whatever ran
        before (the train-mode pass draws from torch's generator): a subnet's score does not depend on which
        subnets were scored before it."""
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(BN_SEED)
            with self.autocast():
                self.supernet.recalibrate(cfg, self._bn_batches())

    @torch.no_grad()
    def score(self, cfg: dict) -> dict:
        """{"top1", "top5", "val_loss", "top1_q", "size_mb"} of the subnet ``cfg`` (a resolved configuration
        of the plan's space, with its quantization policy)."""
        self._recalibrate(cfg)
        batch = engine.eval_batch(self.bpw)
        out = engine.evaluate(_Subnet(self.supernet, cfg), self.val_src, engine.Dist(device=self.device),
                              batch_size=batch, autocast=self.autocast)
        weights = self.supernet.extract(cfg)
        if not quant_policy(cfg):
            return {**out, "top1_q": out["top1"], "size_mb": state_bytes(weights) / 1e6}
        from qkvsearch.trainers.model.models import build_model

        model = build_model(cfg)
        model.load_state_dict(weights)
        served = quantize_model(model.to(self.device).eval(), cfg, self.device)
        top1_q = engine.evaluate(served, self.val_src, engine.Dist(device=self.device), batch_size=batch,
                                 autocast=self.autocast)["top1"]
        return {**out, "top1_q": top1_q, "size_mb": weights_bytes(served) / 1e6}

    def extract(self, cfg: dict) -> dict:
        """The subnet's state dict, BatchNorm recalibrated (build_model(cfg).load_state_dict takes it)."""
        self._recalibrate(cfg)
        return self.supernet.extract(cfg)
