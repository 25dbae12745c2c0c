"""Checks `validate` and `launch` make before Ray starts (``check_spec``): the storage folder can be made,
every model of the space can be built, the dataset is where the spec says, one trial fits the machine. Once
`launch` or `resume` has connected to Ray, what needs the cluster: its storage is shared where its nodes are
several (``check_shared_storage``), each stage fits a node (``check_stage_resources``).

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

from qkvsearch.search.campaign.prepare import describe as describe_input_path  # noqa: F401  (validate's lines)
from qkvsearch.search.cluster.capacity import ResourceError
from qkvsearch.spaces.errors import BadInput, reason, show

log = logging.getLogger(__name__)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_spec(spec, *, launching: bool) -> list[tuple[dict, dict]]:
    """Everything knowable about a spec before training: storage (and the other places it writes: the
    measurement cache, the trackers' files), models, dataset, stages, the campaign a warm start reads.
    `validate` and `launch` both call it: a check either makes belongs here, or in the spec loader.

    Returns (resolved config, cost) of every model configuration (search.campaign.costs.check_models). A data
    folder this machine does not have fails a launch; `validate` (launching=False) only warns, since
    the spec may be meant for a cluster whose nodes hold the data. A folder that exists, and a bucket prefix
    (s3://, gs://: every node reads the same one), are checked whole, for as many ranks as a trial has.
    """
    from qkvsearch.search.campaign.costs import check_models
    from qkvsearch.search.campaign.tracking import check_trackers
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.data.datasets import check_dataset, data_here

    check_storage(spec.storage)
    if spec.measure.cache is not None:
        check_storage(spec.measure.cache, "measure.cache")
    check_trackers(spec)  # the trackers' packages (search.campaign.tracking)
    check_tracker_files(spec)
    models = check_models(spec)
    config = fill(base_config(spec))
    if data_here(config["data_path"], "data.path", launching):
        check_dataset(config, max(1, spec.resources.workers_per_trial))
    if spec.stages:  # the stages' datasets and OOD sets (search.campaign.stages)
        from qkvsearch.search.campaign.stages import check_stages

        check_stages(spec, [c for c, _ in models] or [config], launching)
    if spec.search.warm_start:
        check_warm_start(spec)
    if spec.supernet:
        check_oneshot(spec)
    return models


def check_oneshot(spec) -> None:
    """A one-shot campaign's space makes a supernet plan (its extremes, its tensors sized for every
    configuration), and a supernet it takes from another campaign (``supernet.from``) was trained on its data
    and holds its space, and the space's smallest subnet meets every counted constraint (the targets'
    included): BadInput naming the field otherwise, before Ray starts."""
    from qkvsearch.search.campaign.oneshot.plan import supernet_plan
    from qkvsearch.search.campaign.oneshot.targets import check_reachable
    from qkvsearch.spaces import base_config
    from qkvsearch.trainers.model.choices import family_of, timm_module

    model = base_config(spec)["model"]
    if not family_of(model).supernet:   # the supernet slices a ViT's, XCiT's or MLP-Mixer's blocks
        raise BadInput(f"supernet: expected a campaign on a ViT, DeiT, XCiT or MLP-Mixer (one-shot search slices "
                       f"their blocks' tensors), given one on {model}, a {timm_module(model)} model: search its "
                       f"space with a searcher instead (remove the supernet section)")
    plan = supernet_plan(spec) if spec.supernet.source is None else source_plan(spec)
    check_reachable(spec, plan)


def source_plan(spec) -> dict:
    """``supernet.from``: the plan of the supernet that campaign trained (phases.trained_plan), once it is known to
    be there, readable and trained; BadInput naming supernet.from and the folder as the spec gives it otherwise,
    whatever is missing or damaged in it."""
    import pyarrow.fs as pafs

    from qkvsearch.search.campaign.oneshot.phases import _trained, trained_plan
    from qkvsearch.search.campaign.oneshot.plan import PLAN_FILE, SUPERNET_DIR
    from qkvsearch.search.records.layout import CAMPAIGN_FILE, read_campaign
    from qkvsearch.storage import exists, open_location

    source = spec.supernet.source
    supernet_dir = f"{source}/{SUPERNET_DIR}"
    given = f"supernet.from: expected a one-shot campaign folder whose supernet has trained, given {show(source)}"
    try:
        fs, root = open_location(source)
        kind = fs.get_file_info(root).type
    except (OSError, ValueError) as exc:  # pyarrow: a URI it cannot open
        raise BadInput(f"{given}, which cannot be opened ({reason(exc)})") from None
    if kind != pafs.FileType.Directory:
        raise BadInput(f"{given}, which {'does not exist' if kind == pafs.FileType.NotFound else 'is no folder'}")
    for name in (CAMPAIGN_FILE, PLAN_FILE):
        if not exists(f"{supernet_dir}/{name}"):
            raise BadInput(f"{given}, which holds no {SUPERNET_DIR}/{name} (no supernet trained there: a campaign "
                           "of trials, or one that took its supernet from another)")
    try:
        read_campaign(supernet_dir)   # CampaignFileError naming the damaged file
        _trained(supernet_dir)
        return trained_plan(source, spec)
    except BadInput as err:
        text = str(err)
        raise BadInput(text if text.startswith("supernet.from:") else f"{given}: {text}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # its plan.json, unreadable or not a plan
        raise BadInput(f"{given}: {SUPERNET_DIR}/{PLAN_FILE} cannot be read as a supernet's plan "
                       f"({reason(exc)})") from None


def check_warm_start(spec) -> None:
    """search.warm_start names a readable campaign other than this one (a launch with --overwrite would
    delete what it is to learn from); BadInput naming search.warm_start otherwise."""
    from qkvsearch.search.records.layout import experiment_dir
    from qkvsearch.search.searchers.earlier import earlier_records

    source = spec.search.warm_start.rstrip("/")
    own = experiment_dir(spec)
    same = source == own if "://" in source else os.path.realpath(source) == os.path.realpath(own)
    if same:
        raise BadInput(f"search.warm_start: expected an earlier campaign's folder, given {show(source)}, which is "
                       f"this campaign's own folder ({own}); name the earlier campaign, or give this one another name")
    try:
        earlier_records(source)
    except BadInput as err:  # the campaign file's own message names the file; this names the field as well
        text = str(err)
        raise BadInput(text if text.startswith("search.warm_start:") else f"search.warm_start: {text}") from None


def check_tracker_files(spec) -> None:
    """The folder of each tracker file the spec names (spaces.tracking.tracker_location: a path, a SQLite
    file) exists or can be made; BadInput naming the tracker's setting otherwise."""
    from qkvsearch.search.records.layout import experiment_dir
    from qkvsearch.spaces.tracking import TRACKERS, is_url, tracker_location

    exp = experiment_dir(spec)
    for name, settings in spec.tracking.items():
        key = TRACKERS[name].location
        given = settings.get(key) if key else None
        if not given or _URI.match(exp):
            continue
        where = tracker_location(name, given, exp)
        path = where[len("sqlite:///"):] if where.startswith("sqlite:///") else None if is_url(where) else where
        if path is not None:
            check_storage(os.path.dirname(path) or ".", f"tracking.{name}.{key}")


def check_storage(storage: str, field: str = "storage") -> None:
    """Raise BadInput naming ``field`` unless the local folder ``storage`` exists and is writable, or can be
    created.

    Walks up from the folder to its first existing ancestor, which must be a writable directory.
    URIs (s3://, gs://, file://, ...) are left to the filesystem that serves them.
    """
    if _URI.match(storage):
        return

    def _refuse(why: str):
        raise BadInput(f"{field}: expected a folder that exists or can be created, given {show(storage)} ({why})")

    path = os.path.abspath(storage)
    here = path
    while True:
        try:
            info = os.stat(here)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(here):
                _refuse(f"{here} is a symbolic link to nowhere")
            parent = os.path.dirname(here)
            if parent == here:  # the filesystem root itself is missing: nothing sensible to check
                return
            here = parent
        except OSError as err:  # e.g. no permission to look inside a parent folder
            _refuse(f"{here} cannot be inspected ({err.strerror or err})")
    if not stat.S_ISDIR(info.st_mode):
        what = "is a file" if stat.S_ISREG(info.st_mode) else "is not a folder"
        _refuse(f"{here} {what}")
    if not os.access(here, os.W_OK | os.X_OK):
        _refuse(f"{here} is not writable by this user")


def check_local_resources(resources, where: str = "resources", what: str = "one trial") -> None:
    """Raise ResourceError naming ``where`` when ``what`` cannot fit this machine; a no-op when RAY_ADDRESS
    names a cluster.

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
        raise ResourceError(f"{where}: expected {what} to fit this machine, given " + "; ".join(short)
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


# ------------------------------------------------------------------------------------ once Ray is connected
def check_stage_resources(spec, cluster, ask=None) -> list[str]:
    """The workers of each phase with resources of its own — each stage's (search.campaign.stages.stage_resources;
    an OOD stage has one), the supernet's (``supernet.resources``) — against ``cluster``
    (search.cluster.capacity.Cluster), by the rule one trial is held to (plan_concurrency): ResourceError
    naming the phase's field when no node, present or one its autoscaler can add, could hold it, which Ray
    would otherwise leave waiting for ever. Returns one line per phase that waits for the autoscaler to add a
    node. ask: the autoscaler's verdict, as for plan_concurrency. The cluster is left as it was."""
    from dataclasses import replace
    from types import SimpleNamespace

    from qkvsearch.search.campaign.stages import stage_resources
    from qkvsearch.search.cluster.capacity import plan_concurrency

    res = spec.resources
    campaign = SimpleNamespace(workers=res.workers_per_trial, cpus_per_worker=res.cpus_per_worker,
                               gpus_per_worker=res.gpus_per_worker)  # as the campaign's trial settings hold them
    stages = [(f"stages.finetune[{i}]", stage, None) for i, stage in enumerate(spec.stages.finetune)]
    if spec.stages.ood is not None:
        stages.append(("stages.ood", spec.stages.ood, 1))
    if spec.supernet.resources and spec.supernet.source is None:  # a supernet trained here
        stages.append(("supernet", spec.supernet, None))

    def holds(workers, cpus, gpus, probe) -> bool:
        need = replace(res, workers_per_trial=workers, cpus_per_worker=cpus, gpus_per_worker=gpus,
                       max_concurrent_trials=1)
        try:
            plan_concurrency(need, probe, ask)
        except ResourceError:
            return False
        return True

    waiting = []
    for where, stage, fixed in stages:
        workers, cpus, gpus = stage_resources(stage, campaign)
        workers = fixed or workers
        probe = replace(cluster, waiting_for="")
        if holds(workers, cpus, gpus, probe):
            if probe.waiting_for:
                waiting.append(f"{where}: {probe.waiting_for}")
            continue
        key = "gpus_per_worker" if gpus and holds(workers, cpus, 0.0, replace(cluster)) else "cpus_per_worker"
        if key not in stage.resources and "workers_per_trial" in stage.resources:
            key = "workers_per_trial"
        raise ResourceError(f"{where}.resources.{key}: expected a phase the cluster can hold, given {workers} "
                            f"worker(s) x ({cpus:g} CPU, {gpus:g} GPU) = {workers * cpus:g} CPUs, "
                            f"{workers * gpus:g} GPUs, but the cluster has {cluster.cpus:g} CPUs, {cluster.gpus:g} "
                            f"GPUs{_growth(cluster)}; a phase no node can hold would wait for ever (lower its "
                            f"resources, or run on a cluster with such nodes)")
    return waiting


def _growth(cluster) -> str:
    """What the cluster's autoscaler can add, as a refusal says it (plan_concurrency refuses an autoscaling
    cluster whose node types are unknown only on the autoscaler's own verdict)."""
    if cluster.node_types:
        return " and its autoscaler can add only " + ", ".join(
            f"{t.name} ({t.cpus:g} CPU, {t.gpus:g} GPU)" for t in cluster.node_types)
    if cluster.autoscaler is not None:
        return ", and its autoscaler reports that no node type it may add can hold it"
    return " and no autoscaler"
