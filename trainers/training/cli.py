"""The plain path, no Ray imported: one trial's training in this process or under torchrun.

    python -m qkvsearch.trainers.training.cli --config examples/trial.yaml [--set key=value ...] [--checkpoint-dir DIR]

runs the engine (trainers.training.engine) in-process (world size 1) or under `torchrun --nproc_per_node=N` (gloo
on CPU, nccl on CUDA) and prints one JSON line of metrics per epoch from rank 0. (The earlier ``python -m
qkvsearch.trainers.loop`` runs it too.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.training.errors import DivergenceError
from qkvsearch.trainers.training.faults import read_faults

__all__ = ["load_cli_config", "main"]


def _parse_value(text: str, key: str):
    """A --set value as YAML, by the campaign files' rules (spaces.reading.parse_yaml: 1e-3 is a float)."""
    from qkvsearch.spaces.reading import parse_yaml

    return parse_yaml(text, f"--set {key}")


def load_cli_config(path: str | None, overrides: list[str]) -> dict:
    """YAML mapping + key=value overrides -> resolved config. ValueError on bad input."""
    from qkvsearch.spaces.reading import parse_yaml

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

    from qkvsearch.trainers.training.engine import Dist

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
    from qkvsearch.trainers.training.engine import save_state

    def report(metrics, state_fn):
        if dist.rank != 0:
            return
        if state_fn is not None and checkpoint_dir:
            save_state(state_fn(), checkpoint_dir)
        print(json.dumps(metrics), flush=True)

    return report


def _plain_restore(checkpoint_dir):
    from qkvsearch.trainers.training.engine import STATE_FILE, load_state

    if checkpoint_dir and os.path.isfile(os.path.join(checkpoint_dir, STATE_FILE)):
        return lambda: load_state(checkpoint_dir)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qkvsearch.trainers.training.cli",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML file with a flat trial config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (YAML value syntax); repeatable")
    parser.add_argument("--checkpoint-dir", help="write state.pt here; resume from it when present")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    try:
        cfg = load_cli_config(args.config, args.overrides)
        from qkvsearch.trainers.data.datasets import check_dataset

        check_dataset(cfg)
    except (ValueError, OSError) as e:
        parser.error(str(e))  # exits 2
    import torch

    from qkvsearch.trainers.training.engine import fit

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
