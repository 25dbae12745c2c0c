"""Checks `validate` and `launch` make before Ray starts: the storage folder can be made, every model of
the space can be built, the dataset is where the spec says, one trial fits the machine.

They only look: none creates a folder or starts anything.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import stat
import sys
from collections.abc import Mapping

from qkvsearch.search.cluster.capacity import ResourceError
from qkvsearch.spaces.errors import BadInput, show

log = logging.getLogger(__name__)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_spec(spec, *, launching: bool) -> list[tuple[dict, dict]]:
    """Everything knowable about a spec before training: storage, models, dataset.

    Returns (resolved config, cost) of every model configuration (search.campaign.costs.check_models). A data
    folder this machine does not have fails a launch; `validate` (launching=False) only warns, since
    the spec may be meant for a cluster whose nodes hold the data. A folder that exists is checked whole.
    """
    from qkvsearch.search.campaign.costs import check_models
    from qkvsearch.search.campaign.tracking import check_trackers
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.data import check_dataset

    check_storage(spec.storage)
    check_trackers(spec)  # the trackers' packages (search.campaign.tracking)
    models = check_models(spec)
    config = fill(base_config(spec))
    path = config["data_path"]
    if not launching and path is not None and not os.path.exists(path):
        log.warning(f"data.path: {path} does not exist on this machine; launch checks it where it runs")
    else:
        check_dataset(config)
    if spec.stages:  # the stages' datasets and OOD sets (search.campaign.stages)
        from qkvsearch.search.campaign.stages import check_stages

        check_stages(spec, models[0][0] if models else config, launching)
    return models


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


# Filesystem types (/proc/mounts) that every node of a cluster can mount at the same path.
SHARED_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "cifs", "smb3", "gpfs", "beegfs", "ceph", "glusterfs", "fuse.glusterfs", "fuse.cephfs",
    "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "fuse.sshfs", "wekafs", "panfs", "virtiofs", "9p",
})


def check_shared_storage(storage: str, node_hosts: set[str], can_grow: bool = False) -> None:
    """Raise ResourceError when a campaign whose nodes are on more than one machine (node_hosts: their
    addresses), or may be once an autoscaler adds nodes (can_grow), keeps its storage on this machine's own
    disk: trials elsewhere could not write there."""
    if _URI.match(storage) or (len(node_hosts) <= 1 and not can_grow):
        return
    fstype = filesystem_type(storage)
    if fstype in SHARED_FILESYSTEMS:
        return
    where = (f"the cluster's nodes are on {len(node_hosts)} machines" if len(node_hosts) > 1
             else "the cluster's autoscaler may add nodes on other machines")
    raise ResourceError(
        f"storage: {where}, but {show(storage)} is on this machine's own disk ({fstype or 'unknown filesystem'}); "
        f"expected a shared filesystem mounted at the same path on every node "
        f"({', '.join(sorted(SHARED_FILESYSTEMS)[:6])}...) or a bucket (--set storage=s3://BUCKET/PREFIX or gs://...)")


def filesystem_type(path: str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the filesystem holding ``path`` (its nearest existing folder), from the mount table."""
    path = os.path.realpath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    best, kind = "", None
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind
