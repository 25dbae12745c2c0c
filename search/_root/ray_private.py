"""Every use of Ray's private API in qkvsearch, in one place: Ray moves these between releases.

Each function names what it reaches into and why no public API serves. Callers treat a failure here as
"not known" where they can (an older or newer Ray): the campaign must run either way. Nothing is
imported from Ray until a function is called, so this module is as light as the package root and both
``qkvsearch.search`` and ``qkvsearch.trainers`` may import it.
"""
from __future__ import annotations


# ------------------------------------------------------------------------------------------- this driver
def dashboard_url() -> str | None:
    """The connected Ray's dashboard address. ``ray.init`` returns it, but a driver that joined an
    already-initialised Ray has no public accessor for it."""
    import ray

    try:
        return ray._private.worker.global_worker.node.address_info.get("webui_url")
    except AttributeError:
        return None


def head_session_dir() -> str | None:
    """The Ray session folder when this process's node is the head; None otherwise. The session folder
    (where Ray's Grafana provisioning reads dashboards) has no public accessor."""
    import ray

    try:
        node = ray._private.worker._global_node
        return node.get_session_dir_path() if node is not None and node.head else None
    except AttributeError:
        return None


def node_startup_timed_out(exc: BaseException) -> bool:
    """Whether ``ray.init`` failed because its new node's raylet did not register with the GCS in time: Ray
    waits a fixed 30 s for it (``ray._private.node.Node``, no setting), which a loaded machine can exceed. Told
    by the text of the plain ``Exception`` Ray raises (no class of its own)."""
    return type(exc) is Exception and "timed out during startup" in str(exc)


# ------------------------------------------------------------------------------------------- Tune
def drop_result_statistics(trial) -> None:
    """Drop an ended trial's running statistics of its results: for every numeric key of its last result Tune
    keeps a dict of seven statistics and two deques of recent values (``_TrainingRunMetadata.metric_analysis``,
    ``metric_n_steps``), in the driver until the run ends, and writes them at every experiment-state save. No
    setting turns them off; qkvsearch reads them nowhere (its records hold every result)."""
    try:
        meta = trial.run_metadata
        meta.metric_analysis = {}   # each assignment also drops the metadata's cached JSON
        meta.metric_n_steps = {}
    except AttributeError:
        pass


def restored_run_config(tuner):
    """The RunConfig a restored ``Tuner`` unpickled, so a resumed driver can replace its callbacks: Tune
    has no public way to pass new callbacks to ``Tuner.restore``."""
    return tuner._local_tuner.get_run_config()


def restored_searcher(tuner):
    """The search algorithm a restored ``Tuner`` unpickled from ``tuner.pkl``."""
    return tuner._local_tuner._tune_config.search_alg


def replace_restored_searcher(tuner, searcher) -> None:
    """Give a restored ``Tuner`` the searcher a resumed driver built from its campaign's spec, in place of the
    one it unpickled: ``Tuner.restore`` takes no searcher, and Tune restores the searcher's saved state into
    whichever it holds when ``fit`` starts."""
    tuner._local_tuner._tune_config.search_alg = searcher


def count_callbacks_by_name() -> None:
    """Have Tune's usage tag count a run's callbacks without importing every tracker integration.

    Each `tune.run` tags the callbacks it was given (`ray.air._internal.usage.tag_callbacks`). Its count
    imports the MLflow, W&B, Comet and Aim integrations, and with them mlflow and wandb where they are
    installed, in every driver (its cost: benchmarks/README.md), for a count that matches those classes by
    name only. The replacement counts by the same names, so the tag it records is the same. Without that
    function (an older or newer Ray), Tune's own count stays."""
    try:
        from ray.air._internal import usage
    except ImportError:
        return
    if not callable(getattr(usage, "_count_callbacks", None)) or getattr(usage._count_callbacks, "by_name", False):
        return
    integrations = ("WandbLoggerCallback", "MLflowLoggerCallback", "CometLoggerCallback", "AimLoggerCallback")

    def count(callbacks):
        import collections

        from ray.tune import Callback
        from ray.tune.logger import LoggerCallback
        from ray.tune.utils.callback import DEFAULT_CALLBACK_CLASSES

        names = {*integrations, *(cls.__name__ for cls in DEFAULT_CALLBACK_CLASSES)}
        counts = collections.defaultdict(int)
        for callback in [c for c in callbacks or [] if isinstance(c, Callback)]:
            name = type(callback).__name__
            kind = name if name in names else \
                "CustomLoggerCallback" if isinstance(callback, LoggerCallback) else "CustomCallback"
            counts[kind] += 1
        return counts

    count.by_name = True
    usage._count_callbacks = count


def save_experiment_now(tune_controller) -> None:
    """Have Tune save its experiment state (and copy it to storage) now. Schedulers get a wrapper that
    exposes no save; the controller behind it has ``checkpoint(force, wait)``. No controller (a scheduler
    driven by hand, as the simulator does): nothing."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    save = getattr(controller, "checkpoint", None)
    if save is not None:
        save(force=True, wait=True)


# ------------------------------------------------------------------------------------------- cluster
def cluster_config():
    """The autoscaler config the cluster reported to its GCS (node groups with resources and max counts),
    or None: the config has no public accessor."""
    from ray._private.state import state

    return state.get_cluster_config()


def v1_autoscaler_node_types() -> tuple[dict, object]:
    """The v1 autoscaler's node -> node type mapping from its debug status in the GCS's KV store ({} when
    none), and Ray's function naming the read-only type of a node started by hand. v1 publishes its status
    nowhere else."""
    import json

    from ray._private import ray_constants
    from ray.autoscaler._private.util import format_readonly_node_type
    from ray.experimental.internal_kv import _internal_kv_get

    status = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    types = json.loads(status)["autoscaler_report"]["node_type_mapping"] if status else {}
    return types, format_readonly_node_type


def cluster_status():
    """The GCS's cluster status (the v2 autoscaler's state and its verdicts on resource requests): the
    public ``ray status`` prints it but returns nothing to read."""
    import ray
    from ray._raylet import GcsClient
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

    address = ray.get_runtime_context().gcs_address
    return GetClusterStatusReply.FromString(GcsClient(address=address).get_cluster_status())


def add_job_metadata(submission_id: str, metadata: dict[str, str]) -> bool:
    """Merge ``metadata`` into a submitted job's record, which the dashboard's Jobs page lists -> whether
    the record was found. A running job's metadata cannot be changed through the public job API."""
    import json

    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray.dashboard.modules.job.common import JobInfoStorageClient
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id).encode()
    raw = _internal_kv_get(key, namespace=KV_NAMESPACE_JOB)
    if raw is None:
        return False
    info = json.loads(raw)
    info["metadata"] = {**(info.get("metadata") or {}), **metadata}
    _internal_kv_put(key, json.dumps(info).encode(), overwrite=True, namespace=KV_NAMESPACE_JOB)
    return True


# ------------------------------------------------------------------------------------------- Train
def torch_trainer_without_datasets_callback():
    """TorchTrainer less Train V2's Ray Data callback when a run has no Ray Datasets: the callback starts
    a dataset-manager process for every run regardless, and TorchTrainer has no public switch to leave it
    out (the override below is of a private method)."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            if self.datasets:
                return callbacks
            return [c for c in callbacks if not isinstance(c, DatasetsCallback)]

    return Trainer


def has_torch_process_group_helpers() -> bool:
    """Whether this Ray has the helpers TorchConfig's backend uses to join and leave the process group
    (they let a worker join without Train's controller importing torch; TorchConfig has no public form)."""
    from ray.train.torch import config

    return all(hasattr(config, name) for name in (
        "_set_torch_distributed_env_vars", "_setup_torch_process_group", "_shutdown_torch",
        "TorchConfigContextManager", "TorchConfig"))


def address_and_port() -> tuple[str, int]:
    """This node's address and a free port: Train's own rendezvous choice, run on rank 0's worker."""
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def join_torch_process_group(backend: str, rank: int, world: int, timeout_s: float) -> None:
    """In a Train worker whose MASTER_ADDR/MASTER_PORT are set: join the run's process group (env://) as
    TorchConfig's backend does."""
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group

    _set_torch_distributed_env_vars()
    _setup_torch_process_group(backend, rank, world, "env://", timeout_s)


def leave_torch_process_group(destroy: bool) -> None:
    """In a Train worker: leave the process group as TorchConfig's backend does."""
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)


# ------------------------------------------------------------------------------------------- tasks
def all_gpus_visible() -> dict:
    """A task's runtime_env under which Ray leaves CUDA_VISIBLE_DEVICES alone, so a task that holds no GPU
    (a measurement made while nothing trains) still sees the node's GPUs. The switch is an experimental
    environment variable of Ray's accelerator manager, not a task option."""
    return {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
