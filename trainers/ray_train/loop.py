"""The Ray Train adapter around trainers.training.engine: ``run_trainer(config, RunSettings(...))`` and the
per-worker ``train_worker``. Every Ray import of trainers is here.

run_trainer takes a filled trial config (spaces.keys.fill), checks the batch plan and the dataset on the
driver, then fits a TorchTrainer whose workers run train_worker: one DDP rank each; every rank calls
ray.train.report once per epoch, rank 0 attaching a checkpoint with state.pt. A run resumed from a
checkpoint first reports every epoch of that checkpoint's history again (_replaying). With num_workers=0
(Train's local mode) train_worker runs in the calling process instead: no controller, no worker actors;
trainers.training.checkpoints then keeps the checkpoints, in the folders a Train run would use.

The plain path without Ray: trainers.training.cli (``python -m qkvsearch.trainers.training.cli``; the earlier
``python -m qkvsearch.trainers.loop`` runs it too, through this module).
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qkvsearch.spaces.batches import batch_plan
from qkvsearch.spaces.keys import require_filled
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.trainers.training.checkpoints import (
    LocalRun,
    checkpoint_dir_name,
    epoch_checkpoint,  # noqa: F401  (public: search.campaign reads it here)
)
from qkvsearch.trainers.training.cli import load_cli_config, main  # noqa: F401  (python -m qkvsearch.trainers.loop)
from qkvsearch.trainers.training.errors import DivergenceError, SimulatedFailure  # noqa: F401  (public re-export)
from qkvsearch.trainers.training.faults import read_faults

__all__ = ["DivergenceError", "RunSettings", "epoch_checkpoint", "find_divergence", "main", "run_trainer",
           "train_worker"]


# ---------------------------------------------------------------------------------------------
# Ray Train adapter


def train_worker(loop_config: dict) -> list[dict] | None:
    """Per-worker entry point of the TorchTrainer: one DDP rank of one trial.

    loop_config: {"config": filled trial config, "faults": trainers.training.faults rules (tests only),
    "threads": torch intra-op threads (the worker's CPUs), "local": a LocalRun in local mode, else None}.
    Returns (rank 0) the metrics of every completed epoch, including those before a resume: the
    Result's return_value. (Result.metrics_dataframe only lists the epochs whose checkpoints are kept.)
    """
    import ray.train.torch
    import torch

    from qkvsearch.trainers.training import engine

    torch.set_num_threads(loop_config["threads"])
    device = ray.train.torch.get_device()
    cfg, faults, local = loop_config["config"], loop_config["faults"], loop_config["local"]
    init = loop_config.get("init")  # a fine-tuning's pretrained checkpoint, or a subnet's inherited weights
    init_head = bool(loop_config.get("init_head"))
    make_run = _supernet_run(loop_config.get("supernet"))
    prepared = loop_config.get("prepared")  # where the campaign prepared the dataset (trainers.data.pipelines)
    if local is not None:  # world size 1; ray.train's context, report and checkpoint calls raise in a Tune trial
        return engine.fit(cfg, engine.Dist(0, 1, device), restore=_replaying(local.restore, local.report),
                          report=local.report, faults=faults, init=init, init_head=init_head, make_run=make_run,
                          prepared=prepared)
    import ray.train

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    dist = engine.Dist(rank, ctx.get_world_size(), device)
    report = _RayReporter(rank)
    wrap = None if make_run else ray.train.torch.prepare_model  # DDP if > 1 (a supernet averages its own)
    history = engine.fit(cfg, dist, wrap_model=wrap, restore=_replaying(_ray_restore, report), report=report,
                         faults=faults, init=init, init_head=init_head, make_run=make_run, prepared=prepared)
    return history if rank == 0 else None


def _supernet_run(plan: dict | None):
    """engine.fit's make_run for a supernet's plan (None: a trial's own Run)."""
    if plan is None:
        return None
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.supernet.training import SupernetRun

    return functools.partial(SupernetRun, plan=SupernetPlan.from_dict(plan))


def _replaying(restore, report):
    """engine.fit's restore that also reports again, in order, every epoch of the restored run but its last
    (fit reports that one again itself), without a checkpoint.

    The search may have received none of them: a Train run goes on for a moment after its campaign's driver
    is killed, checkpointing epochs whose reports reach no one, and reports wait in queues between Train and
    Tune when a driver stops. Resuming from such a checkpoint must not leave a gap in the trial's epochs;
    receivers keep one row per epoch. Every rank reports alike (Train's reports are collective)."""

    def restore_and_replay():
        state = restore()
        for metrics in (state or {}).get("history", [])[:-1]:
            report(metrics, None)
        return state

    return restore_and_replay


def _ray_restore():
    """The state of this Train run's latest checkpoint, or None on a fresh start."""
    import ray.train

    from qkvsearch.trainers.training.engine import load_state

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        return load_state(d)


class _RayReporter:
    """report(metrics, state_fn): every rank reports; rank 0 attaches <tmp>/state.pt when asked."""

    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, metrics: dict, state_fn) -> None:
        import ray.train

        from qkvsearch.trainers.training.engine import save_state

        if state_fn is None or self.rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory(prefix="qs_ckpt_") as d:
            save_state(state_fn(), d)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d),
                             checkpoint_dir_name=checkpoint_dir_name(metrics[EPOCH]))


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How one training run runs (everything but the trial's config).

    num_workers: DDP workers; 0 is Train's local mode: the training runs in the calling process (world
    size 1, on the CPUs and GPUs this process holds: a Tune trial's resources), errors raise as they are,
    Train callbacks do not run, and each epoch goes to on_report(metrics, checkpoint_path | None) instead.
    name, storage_path: the run's folder <storage_path>/<name> (a path or a URI); a run whose folder holds a
    checkpoint resumes from it. faults: trainers.training.faults rules (None: $QKVSEARCH_FAULTS here). max_failures:
    how often Train restarts a failed worker group from the run's latest checkpoint. init_from: a checkpoint
    (folder or weights file) a fresh run starts from with a new head (fine-tuning), or with its own head too
    when init_head (a subnet trained on from the weights it inherits). supernet: a supernet's
    plan (trainers.supernet.plan.SupernetPlan.as_dict): the run trains that supernet, the config being
    its teacher's with the supernet's recipe. prepared: where the campaign prepared the dataset for the device
    input path (trainers.data.pipelines; None: prepared in the run's process when it needs one).
    """

    num_workers: int
    name: str
    storage_path: str
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    placement_strategy: str = "PACK"
    callbacks: Sequence = ()
    on_report: Callable | None = None
    num_to_keep: int | None = 2
    faults: Sequence | None = None
    max_failures: int = 0
    init_from: str | None = None
    init_head: bool = False
    supernet: dict | None = None
    prepared: dict | str | None = None

    def __post_init__(self):
        n = self.num_workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"num_workers: expected an int >= 0 (0: in this process), given {n!r}")


def run_trainer(config: dict, settings: RunSettings):
    """Check the batch plan and the dataset (no worker starts on bad input), then fit a TorchTrainer.

    config: a filled trial config; settings: the run's RunSettings. Returns the
    ray.train.Result. Worker errors raise ray.train.TrainingFailedError from fit(); find_divergence(err)
    tells divergence. In local mode (num_workers=0) Result.return_value holds every epoch's metrics as
    usual; Result.metrics and .checkpoint are None, the checkpoints are in the same folders.
    """
    from qkvsearch.trainers.data.datasets import check_dataset

    run = settings
    cfg = require_filled(config)
    batch_plan(cfg, max(1, run.num_workers))
    check_dataset(cfg, max(1, run.num_workers))  # the ranks that will read it (0: this process alone)

    import ray.train

    storage = os.path.abspath(run.storage_path) if "://" not in run.storage_path else run.storage_path
    local = LocalRun(f"{storage.rstrip('/')}/{run.name}", run.num_to_keep, run.on_report) if not run.num_workers \
        else None
    resources = {"CPU": run.cpus_per_worker}
    if run.gpus_per_worker:
        resources["GPU"] = run.gpus_per_worker
    ddp = _ddp_config_class() if run.num_workers else None
    trainer = _trainer_class()(
        train_worker,
        torch_config=ddp("nccl" if run.gpus_per_worker else "gloo") if ddp else None,
        train_loop_config={"config": cfg, "faults": read_faults() if run.faults is None else list(run.faults),
                           "threads": max(1, int(run.cpus_per_worker)), "local": local, "init": run.init_from,
                           "init_head": run.init_head, "supernet": run.supernet, "prepared": run.prepared},
        scaling_config=ray.train.ScalingConfig(
            num_workers=run.num_workers, use_gpu=run.gpus_per_worker > 0, resources_per_worker=resources,
            placement_strategy=run.placement_strategy),
        run_config=ray.train.RunConfig(
            name=run.name, storage_path=storage, callbacks=list(run.callbacks),
            failure_config=ray.train.FailureConfig(max_failures=run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=run.num_to_keep)))
    return trainer.fit()


@functools.cache
def _trainer_class():
    """TorchTrainer, less the Ray Data callback when a run has no Ray Datasets (ours never has: each
    worker reads its own shard). That callback starts a DatasetManager actor for every run regardless: one
    more process importing Ray Data on the path to the first step."""
    from qkvsearch import ray_private

    return ray_private.torch_trainer_without_datasets_callback()


@functools.cache
def _ddp_config_class():
    """A TorchConfig that Train's controller unpickles without importing torch, or None (then TorchConfig)
    where this Ray lacks the helpers it uses. TorchConfig's module imports torch, and the controller
    imports it for nothing: ~1.5 s of CPU at the start of every run, before any worker is made. Here the
    controller only picks the rendezvous address; each worker joins the process group (and leaves it)
    through Ray's own torch helpers, as TorchConfig's backend has it do."""
    from ray.train.torch import config as torch_config  # this process (the trial's) has torch anyway

    from qkvsearch import ray_private

    if not ray_private.has_torch_process_group_helpers():
        return None
    import ray
    from ray.train.backend import Backend, BackendConfig

    # The classes below travel to the controller by value: their methods name no torch module (a name
    # there would be imported where they are unpickled); torch's helpers are imported where they run.
    timeout_s = torch_config.TorchConfig().timeout_s

    class DDPBackend(Backend):
        share_cuda_visible_devices = True  # as TorchConfig's backend: NCCL sees every GPU of the node

        def on_start(self, worker_group, backend_config):
            from qkvsearch import ray_private

            addr, port = worker_group.execute_single(0, ray_private.address_and_port)
            world = len(worker_group)
            ray.get([worker_group.execute_single_async(rank, _join_process_group, addr, port, backend_config.backend,
                                                       rank, world, backend_config.timeout_s)
                     for rank in range(world)])

        def on_shutdown(self, worker_group, backend_config):
            ray.get(worker_group.execute_async(_leave_process_group, len(worker_group) > 1),
                    timeout=backend_config.timeout_s)

    class DDPConfig(BackendConfig):
        def __init__(self, backend: str):
            self.backend, self.init_method, self.timeout_s = backend, "env", timeout_s

        @property
        def backend_cls(self):
            return DDPBackend

        @property
        def train_func_context(self):  # read where the trainer is made, run in each worker
            from ray.train.torch.config import TorchConfigContextManager

            return TorchConfigContextManager

        @property
        def framework(self):  # read by Train's state tracking only
            from ray.train.torch.config import TorchConfig

            return TorchConfig().framework

        def to_dict(self) -> dict:
            return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}

    return DDPConfig


def _join_process_group(addr: str, port: int, backend: str, rank: int, world: int, timeout_s: float) -> None:
    """In a Train worker: join the run's torch process group at addr:port (env:// rendezvous)."""
    from qkvsearch import ray_private

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    ray_private.join_torch_process_group(backend, rank, world, timeout_s)


def _leave_process_group(destroy: bool) -> None:
    from qkvsearch import ray_private

    ray_private.leave_torch_process_group(destroy)


def find_divergence(error: BaseException) -> DivergenceError | None:
    """The DivergenceError behind a failed fit() (ray.train.WorkerGroupError), if any."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, DivergenceError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
        todo += list(getattr(e, "worker_failures", {}).values())
    return None


if __name__ == "__main__":
    sys.exit(main())
