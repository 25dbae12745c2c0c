"""Adapters around trainers.engine: a Ray Train worker (train_worker, run_trainer) and a plain CLI.

Ray path: run_trainer(config, ...) takes a filled trial config (spaces.keys.fill), checks the batch plan
and the dataset on the driver, then fits a TorchTrainer whose workers run train_worker: one DDP rank
each; every rank calls ray.train.report once per epoch, rank 0 attaching a checkpoint with state.pt. A run
resumed from a checkpoint first reports every epoch of that checkpoint's history again (_replaying).
With num_workers=0 (Train's local mode) train_worker runs in the calling process instead: no controller,
no worker actors; this module then keeps the checkpoints itself, in the folders a Train run would use.

Plain path (no Ray imported):
    python -m qkvsearch.trainers.loop --config examples/trial.yaml [--set key=value ...] [--checkpoint-dir DIR]
runs the same engine in-process (world size 1) or under `torchrun --nproc_per_node=N` (gloo on CPU,
nccl on CUDA) and prints one JSON line of metrics per epoch from rank 0.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile

from qkvsearch.spaces.keys import EPOCH, batch_plan, fill, require_filled
from qkvsearch.trainers.errors import DivergenceError, SimulatedFailure  # noqa: F401  (public re-export)
from qkvsearch.trainers.faults import read_faults

__all__ = ["DivergenceError", "find_divergence", "main", "run_trainer", "train_worker"]


# ---------------------------------------------------------------------------------------------
# Ray Train adapter


def train_worker(loop_config: dict) -> list[dict] | None:
    """Per-worker entry point of the TorchTrainer: one DDP rank of one trial.

    loop_config: {"config": filled trial config, "faults": trainers.faults rules (tests only),
    "threads": torch intra-op threads (the worker's CPUs), "local": a _LocalRun in local mode, else None}.
    Returns (rank 0) the metrics of every completed epoch, including those before a resume: the
    Result's return_value. (Result.metrics_dataframe only lists the epochs whose checkpoints are kept.)
    """
    import ray.train.torch
    import torch

    from qkvsearch.trainers import engine

    torch.set_num_threads(loop_config["threads"])
    device = ray.train.torch.get_device()
    cfg, faults, local = loop_config["config"], loop_config["faults"], loop_config["local"]
    init = loop_config.get("init")  # a fine-tuning's pretrained checkpoint
    if local is not None:  # world size 1; ray.train's context, report and checkpoint calls raise in a Tune trial
        return engine.fit(cfg, engine.Dist(0, 1, device), restore=_replaying(local.restore, local.report),
                          report=local.report, faults=faults, init=init)
    import ray.train

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    dist = engine.Dist(rank, ctx.get_world_size(), device)
    report = _RayReporter(rank)
    history = engine.fit(cfg, dist, wrap_model=ray.train.torch.prepare_model,  # DDP if > 1
                         restore=_replaying(_ray_restore, report), report=report, faults=faults, init=init)
    return history if rank == 0 else None


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

    from qkvsearch.trainers.engine import load_state

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

        from qkvsearch.trainers.engine import save_state

        if state_fn is None or self.rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory(prefix="qs_ckpt_") as d:
            save_state(state_fn(), d)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d),
                             checkpoint_dir_name=_checkpoint_dir_name(metrics[EPOCH]))


def _checkpoint_dir_name(epoch: float) -> str:
    return f"checkpoint_epoch_{int(epoch):04d}"


def _checkpoint_dir(run_dir: str, epoch: float) -> str:
    """Where a run (run_dir: <storage>/<run name>, a path or a URI) keeps its checkpoint of `epoch`."""
    return f"{run_dir.rstrip('/')}/{_checkpoint_dir_name(epoch)}"


_CHECKPOINT_DIR = re.compile(r"^checkpoint_epoch_(\d+)$")


def epoch_checkpoint(run_dir: str, epoch: float) -> str | None:
    """This run's checkpoint folder of `epoch` where it holds a state file, else None (run_dir:
    <storage>/<run name>, a path or a URI). A resumed run reports its restored epoch again without a
    checkpoint, though the checkpoint it resumed from is that epoch's."""
    from qkvsearch.storage import exists
    from qkvsearch.trainers.engine import STATE_FILE

    path = _checkpoint_dir(run_dir, epoch)
    return path if exists(f"{path}/{STATE_FILE}") else None


class _LocalRun:
    """Checkpoints and reports of a run in Train's local mode. There ray.train.report keeps the last metrics
    in memory only (no checkpoint persisted, no callback run, get_checkpoint() None at start), and inside a
    Tune trial ray.train.report, get_context and get_checkpoint raise (use ray.tune's): so none is called.

    Checkpoints go to <run_dir>/checkpoint_epoch_NNNN/state.pt, the folders a TorchTrainer run writes, the
    newest num_to_keep kept; restore() reads the newest. on_report(metrics, checkpoint_path | None) gets
    every epoch (Tune's report, inside a trial).
    """

    def __init__(self, run_dir: str, num_to_keep: int | None, on_report=None):
        self.run_dir, self.num_to_keep, self.on_report = run_dir.rstrip("/"), num_to_keep, on_report

    def _checkpoints(self) -> list[tuple[int, str]]:
        """(epoch, path inside the filesystem) of every checkpoint folder holding a state file, oldest first."""
        import pyarrow.fs as pafs

        from qkvsearch.storage import open_location
        from qkvsearch.trainers.engine import STATE_FILE

        fs, root = open_location(self.run_dir)
        found = []
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            m = _CHECKPOINT_DIR.match(info.base_name)
            if m and info.type == pafs.FileType.Directory and \
                    fs.get_file_info(f"{info.path}/{STATE_FILE}").type == pafs.FileType.File:
                found.append((int(m.group(1)), info.path))
        return sorted(found)

    def restore(self) -> dict | None:
        from qkvsearch.trainers.engine import load_state

        found = self._checkpoints()
        if not found:
            return None
        return load_state(f"{self.run_dir}/{found[-1][1].rsplit('/', 1)[-1]}")

    def report(self, metrics: dict, state_fn) -> None:
        from qkvsearch.trainers.engine import save_state

        path = None
        if state_fn is not None:
            path = _checkpoint_dir(self.run_dir, metrics[EPOCH])
            save_state(state_fn(), path)
            self._prune()
        if self.on_report is not None:
            self.on_report(metrics, path)

    def _prune(self) -> None:
        if not self.num_to_keep:
            return
        from qkvsearch.storage import open_location

        fs, _ = open_location(self.run_dir)
        for _, old in self._checkpoints()[:-self.num_to_keep]:
            fs.delete_dir(old)


def run_trainer(config: dict, *, num_workers: int, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                name: str, storage_path: str, callbacks=(), on_report=None, placement_strategy: str = "PACK",
                num_to_keep: int | None = 2, faults: list | None = None, max_failures: int = 0,
                init_from: str | None = None):
    """Check the batch plan and the dataset (no worker starts on bad input), then fit a TorchTrainer.

    config: a filled trial config. Returns the ray.train.Result. A run whose <storage_path>/<name> holds a
    checkpoint resumes from it. Worker errors raise ray.train.TrainingFailedError from fit();
    find_divergence(err) tells divergence. faults: trainers.faults rules (default: $QKVSEARCH_FAULTS here).
    max_failures: how often Train restarts a failed worker group from the run's latest checkpoint.
    init_from: a checkpoint (folder or weights file) a fresh run starts from with a new head (fine-tuning).

    num_workers=0 is Train's local mode: the training runs in this process (world size 1, on the CPUs and
    GPUs this process holds: a Tune trial's resources), errors raise as they are, Train callbacks do not
    run, and each epoch goes to on_report(metrics, checkpoint_path | None) instead. Result.return_value
    holds every epoch's metrics as usual; Result.metrics and .checkpoint are None, the checkpoints are in
    the same folders.
    """
    from qkvsearch.trainers.data import check_dataset

    cfg = require_filled(config)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers: expected an int >= 0 (0: in this process), given {num_workers!r}")
    batch_plan(cfg, max(1, num_workers))
    check_dataset(cfg)

    import ray.train

    storage = os.path.abspath(storage_path) if "://" not in storage_path else storage_path
    local = _LocalRun(f"{storage.rstrip('/')}/{name}", num_to_keep, on_report) if num_workers == 0 else None
    resources = {"CPU": cpus_per_worker}
    if gpus_per_worker:
        resources["GPU"] = gpus_per_worker
    ddp = _ddp_config_class() if num_workers else None
    trainer = _trainer_class()(
        train_worker,
        torch_config=ddp("nccl" if gpus_per_worker else "gloo") if ddp else None,
        train_loop_config={"config": cfg, "faults": read_faults() if faults is None else list(faults),
                           "threads": max(1, int(cpus_per_worker)), "local": local, "init": init_from},
        scaling_config=ray.train.ScalingConfig(
            num_workers=num_workers, use_gpu=gpus_per_worker > 0, resources_per_worker=resources,
            placement_strategy=placement_strategy),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage, callbacks=list(callbacks),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=num_to_keep)))
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


# ---------------------------------------------------------------------------------------------
# Plain adapter: python -m qkvsearch.trainers.loop / torchrun


def _parse_value(text: str, key: str):
    """A --set value as YAML, by the campaign files' rules (spaces.loader.parse_yaml: 1e-3 is a float)."""
    from qkvsearch.spaces.loader import parse_yaml

    return parse_yaml(text, f"--set {key}")


def load_cli_config(path: str | None, overrides: list[str]) -> dict:
    """YAML mapping + key=value overrides -> resolved config. ValueError on bad input."""
    from qkvsearch.spaces.loader import parse_yaml

    cfg = {}
    if path:
        with open(path) as f:
            cfg = parse_yaml(f.read(), path) or {}
        if not isinstance(cfg, dict):
            raise ValueError(f"--config: expected a YAML mapping of config keys in {path!r}, "
                             f"given a {type(cfg).__name__}")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set: expected key=value, given {item!r}")
        cfg[key.strip()] = _parse_value(text, key.strip())
    return fill(cfg)


def _init_torch_distributed():
    """-> engine.Dist from torchrun's env vars (RANK, WORLD_SIZE, LOCAL_RANK), else world size 1."""
    import torch

    from qkvsearch.trainers.engine import Dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world == 1:
        return Dist(0, 1, device)
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    return Dist(torch.distributed.get_rank(), world, device)


def _ddp_wrapper(dist):
    if dist.world_size == 1:
        return None
    from torch.nn.parallel import DistributedDataParallel

    return lambda m: DistributedDataParallel(m, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)


def _plain_reporter(dist, checkpoint_dir):
    from qkvsearch.trainers.engine import save_state

    def report(metrics, state_fn):
        if dist.rank != 0:
            return
        if state_fn is not None and checkpoint_dir:
            save_state(state_fn(), checkpoint_dir)
        print(json.dumps(metrics), flush=True)

    return report


def _plain_restore(checkpoint_dir):
    from qkvsearch.trainers.engine import STATE_FILE, load_state

    if checkpoint_dir and os.path.isfile(os.path.join(checkpoint_dir, STATE_FILE)):
        return lambda: load_state(checkpoint_dir)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qkvsearch.trainers.loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML file with a flat trial config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (YAML value syntax); repeatable")
    parser.add_argument("--checkpoint-dir", help="write state.pt here; resume from it when present")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    try:
        cfg = load_cli_config(args.config, args.overrides)
        from qkvsearch.trainers.data import check_dataset

        check_dataset(cfg)
    except (ValueError, OSError) as e:
        parser.error(str(e))  # exits 2
    import torch

    from qkvsearch.trainers.engine import fit

    if args.threads:
        torch.set_num_threads(args.threads)
    dist = _init_torch_distributed()
    try:
        fit(cfg, dist, wrap_model=_ddp_wrapper(dist), restore=_plain_restore(args.checkpoint_dir),
            report=_plain_reporter(dist, args.checkpoint_dir), faults=read_faults())
    except DivergenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.world_size > 1:
            import torch

            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
