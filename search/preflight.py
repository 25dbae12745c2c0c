"""Checks a launch makes before Ray starts: the storage folder can be made, one trial fits the machine.

Both only look; neither creates a folder or starts anything.
"""
from __future__ import annotations

import glob
import os
import re
import stat
import sys
from collections.abc import Mapping

from qkvsearch.spaces.errors import BadInput, show

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class ResourceError(BadInput):
    """The campaign asks for more per trial than the machine (or the cluster) has."""


def check_storage(storage: str) -> None:
    """Raise BadInput unless the local storage folder exists and is writable, or can be created.

    Walks up from the folder to its first existing ancestor, which must be a writable directory.
    URIs (s3://, gs://, file://, ...) are left to the filesystem that serves them.
    """
    if _URI.match(storage):
        return
    path = os.path.abspath(storage)
    here = path
    while True:
        try:
            info = os.stat(here)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(here):
                _refuse(storage, f"{here} is a symbolic link to nowhere")
            parent = os.path.dirname(here)
            if parent == here:  # the filesystem root itself is missing: nothing sensible to check
                return
            here = parent
        except OSError as err:  # e.g. no permission to look inside a parent folder
            _refuse(storage, f"{here} cannot be inspected ({err.strerror or err})")
    if not stat.S_ISDIR(info.st_mode):
        what = "is a file" if stat.S_ISREG(info.st_mode) else "is not a folder"
        _refuse(storage, f"{here} {what}")
    if not os.access(here, os.W_OK | os.X_OK):
        _refuse(storage, f"{here} is not writable by this user")


def _refuse(storage: str, why: str):
    raise BadInput(f"storage: expected a folder that exists or can be created, given {show(storage)} ({why})")


def check_local_resources(resources) -> None:
    """Raise ResourceError when one trial cannot fit this machine; a no-op when RAY_ADDRESS names a cluster.

    resources: a ResourcesSpec or its dict (workers_per_trial, cpus_per_worker, gpus_per_worker).
    """
    if os.environ.get("RAY_ADDRESS"):
        return
    workers = _get(resources, "workers_per_trial", 1)
    cpus = _get(resources, "cpus_per_worker", 1.0)
    gpus = _get(resources, "gpus_per_worker", 0.0)
    need_cpu, need_gpu = workers * cpus, workers * gpus
    have_cpu, have_gpu = os.cpu_count() or 1, cuda_device_count()
    short = []
    if need_cpu > have_cpu:
        short.append(f"workers_per_trial {workers} x cpus_per_worker {cpus:g} = {need_cpu:g} CPUs, "
                     f"but this machine has {have_cpu}")
    if need_gpu > have_gpu:
        short.append(f"workers_per_trial {workers} x gpus_per_worker {gpus:g} = {need_gpu:g} GPUs, "
                     f"but this machine has {have_gpu}")
    if short:
        raise ResourceError("resources: expected one trial to fit this machine, given " + "; ".join(short)
                            + " (lower the resources, or set RAY_ADDRESS to run on a cluster)")


def cuda_device_count() -> int:
    """CUDA devices visible here, without importing torch when it is not imported already."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda.device_count()
    count = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def _get(resources, key: str, default):
    value = resources.get(key) if isinstance(resources, Mapping) else getattr(resources, key, None)
    return default if value is None else value
