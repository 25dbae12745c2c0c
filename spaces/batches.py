"""How a trial's global batch is split over its workers and accumulation steps (the train keys batch_size,
batch_per_worker, mixup and cutmix together), and the batch it is evaluated at."""
from __future__ import annotations

from collections.abc import Mapping

from qkvsearch.spaces.keys import config_error


def batch_plan(cfg: Mapping, world_size: int) -> tuple[int, int]:
    """(batch_per_worker, accumulation steps) with world_size * batch_per_worker * steps == batch_size.

    cfg: batch_size, batch_per_worker (None: batch_size // world_size), mixup, cutmix.
    """
    batch, bpw = cfg["batch_size"], cfg["batch_per_worker"]
    if bpw is None:
        if batch % world_size:
            raise config_error("batch_size", f"a multiple of the workers per trial ({world_size})", batch)
        bpw = batch // world_size
    if batch % (world_size * bpw):
        raise config_error("batch_size", f"a multiple of workers x batch_per_worker ({world_size} x {bpw})", batch)
    if (cfg["mixup"] > 0 or cfg["cutmix"] > 0) and bpw % 2:
        raise config_error("batch_per_worker",
                           "an even number when mixup or cutmix is on (timm Mixup pairs images)", bpw)
    return bpw, batch // (world_size * bpw)


def eval_batch(batch_per_worker: int) -> int:
    """Images per evaluation batch: no gradients are kept, so twice the training batch, and at least 128."""
    return max(2 * batch_per_worker, 128)
