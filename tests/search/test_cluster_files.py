"""The ready-to-use cluster files in examples/cluster/: the Ray cluster launcher config passes Ray's own
checks, the KubeRay RayJob has the structure KubeRay and Ray's autoscaler read, and every campaign they
launch loads and validates the way the CLI does it, `--set` overrides included.

Nothing here starts Ray or reaches the network. The dataset lives on the cluster's shared filesystem,
not on this machine, so the spec checks stop where `qkvsearch validate` does without it: storage and
every model are checked, the dataset only warned about (and a launch here refuses it).
"""
from __future__ import annotations

import copy
import os
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest
import ray
import yaml
from helpers import REPO

from qkvsearch.search import cli
from qkvsearch.spaces import BadInput

ROOT = REPO
CLUSTER = ROOT / "examples" / "cluster"
LAUNCHER = CLUSTER / "aws-a100.yaml"
RAYJOB = CLUSTER / "kuberay-rayjob.yaml"
DOCKERFILE = CLUSTER / "Dockerfile"
RAY_IMAGE = f"rayproject/ray:{ray.__version__}-"   # the image tag must carry the Ray the client runs


# ---------------------------------------------------------------- reading the files


def launcher() -> dict:
    return yaml.safe_load(LAUNCHER.read_text())


def manifests() -> dict[str, dict]:
    """The documents of the KubeRay file, by kind."""
    docs = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), f"one document per kind expected, given {kinds}"
    return {d["kind"]: d for d in docs}


def rayjob() -> dict:
    return manifests()["RayJob"]


def ray_containers() -> dict[str, dict]:
    """The Ray container (the first, as KubeRay reads it) of the head and of each worker group."""
    spec = rayjob()["spec"]["rayClusterSpec"]
    out = {"head": spec["headGroupSpec"]["template"]["spec"]["containers"][0]}
    for group in spec["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]["spec"]["containers"][0]
    return out


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line, comments dropped."""
    out = []
    for line in DOCKERFILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def image_workdir() -> PurePosixPath:
    workdirs = [args for word, args in dockerfile() if word == "WORKDIR"]
    assert workdirs, "the Dockerfile sets no WORKDIR"
    return PurePosixPath(workdirs[-1])


def image_copies() -> dict[str, str]:
    """Repository path -> path in the image's WORKDIR, for every COPY of the Dockerfile."""
    out = {}
    for word, args in dockerfile():
        if word == "COPY":
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            *sources, dest = parts
            for src in sources:
                out[src.rstrip("/")] = src.rstrip("/") if dest in ("./", ".") else dest.rstrip("/")
    return out


def launch_commands() -> list[tuple[str, list[str]]]:
    """(label, `qkvsearch` arguments with the spec as a repository file) of every campaign the cluster
    files launch: the RayJob's entrypoint, and the `qkvsearch launch` the launcher config documents
    (run by `ray job submit --working-dir .` from the repository root)."""
    out = []
    for line in LAUNCHER.read_text().splitlines():
        _, found, rest = line.partition("qkvsearch launch ")
        if found:
            argv = ["launch", *shlex.split(rest.rstrip("\\"))]
            argv[1] = str(ROOT / argv[1])
            out.append((LAUNCHER.name, argv))
    entry = shlex.split(rayjob()["spec"]["entrypoint"])
    assert entry[:2] == ["qkvsearch", "launch"], f"the RayJob's entrypoint runs {entry[:2]}"
    in_image = PurePosixPath(entry[2])
    assert in_image.is_relative_to(image_workdir()), f"{in_image} is not in the image's {image_workdir()}"
    entry[2] = str(ROOT / in_image.relative_to(image_workdir()))
    out.append((RAYJOB.name, entry[1:]))
    return out


LAUNCHES = launch_commands()


def parse(argv: list[str]):
    return cli._parser().parse_args(argv)


def launched_spec(argv: list[str]):
    """The spec exactly as `qkvsearch launch` would load it (search.cli._load: file + overrides)."""
    return cli._load(parse(argv))


# ---------------------------------------------------------------- the launcher config (`ray up`)


def test_launcher_config_passes_rays_own_checks():
    """What `ray up` does before it contacts the cloud: defaults merged in (prepare_config), then
    Ray's cluster-config schema (ray/autoscaler/ray-schema.json) and its cross-field checks."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(launcher()))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"


def test_launcher_has_a_cpu_head_and_a_fixed_number_of_8_gpu_nodes():
    cfg = launcher()
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("CPU") == 0 and not head["resources"].get("GPU")
    gpu_types = {name: t for name, t in types.items() if t["resources"].get("GPU")}
    assert len(gpu_types) == 1, f"one GPU worker type expected, given {sorted(gpu_types)}"
    (gpu,) = gpu_types.values()
    assert gpu["resources"]["GPU"] == 8 and gpu["node_config"]["InstanceType"] == "p4d.24xlarge"
    # max_concurrent_trials: auto counts the GPUs present at launch: the GPU nodes must not scale.
    assert gpu["min_workers"] == gpu["max_workers"] == cfg["max_workers"] >= 1


def test_launcher_runs_the_projects_ray_and_installs_the_working_tree_on_every_node():
    from ray.autoscaler._private.util import prepare_config

    cfg = launcher()
    assert cfg["docker"]["image"].startswith(RAY_IMAGE)
    mounted = {remote for remote, local in cfg["file_mounts"].items() if (ROOT / local).resolve() == ROOT}
    assert mounted, "no file_mount ships the repository root"
    assert ".gitignore" in cfg.get("rsync_filter", []), "the sync would ship .venv and results"
    prepared = prepare_config(copy.deepcopy(cfg))
    for role in ("head_setup_commands", "worker_setup_commands"):
        installs = [c for c in prepared[role] if re.search(r"\bpip install\b", c)
                    and any(shlex.split(c)[-1] == m for m in mounted)]
        assert installs, f"{role} does not pip install the mounted repository ({sorted(mounted)})"


def test_launcher_keeps_the_dashboard_on_the_heads_loopback_with_token_auth():
    from ray.autoscaler._private.util import prepare_config

    cfg = launcher()
    prepared = prepare_config(copy.deepcopy(cfg))
    starts = [c for c in prepared["head_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 1 and "--dashboard-host=127.0.0.1" in starts[0], starts
    every_start = prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"]
    assert not any("0.0.0.0" in c for c in every_start)
    # Token mode for every process in the containers (ray start, job drivers, `ray exec` shells) ...
    assert "--env=RAY_AUTH_MODE=token" in cfg["docker"]["run_options"]
    # ... with the token in Ray's default file on each node, copied from outside the repository.
    source = Path(os.path.expanduser(cfg["file_mounts"]["~/.ray/auth_token"])).resolve()
    assert not source.is_relative_to(ROOT), f"the token would be synced from the repository: {source}"


def test_launcher_mounts_the_dataset_where_the_spec_reads_it():
    cfg = launcher()
    volumes = [opt.split("=", 1)[1].split(":") for opt in cfg["docker"]["run_options"]
               if opt.startswith("--volume=")]
    for _, argv in LAUNCHES:
        data = PurePosixPath(launched_spec(argv).data.path)
        hosts = [host for host, inside, *_ in volumes if data.is_relative_to(inside)]
        assert hosts, f"data.path {data} is in no container volume ({volumes})"
        assert any(f" {hosts[0]}" in c and "mount" in c for c in cfg["initialization_commands"]), \
            f"no initialization command mounts {hosts[0]} on the host"


# ---------------------------------------------------------------- the KubeRay RayJob


def test_rayjob_is_a_rayjob_of_the_projects_ray_with_token_auth():
    job = rayjob()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["authOptions"]["mode"] == "token"
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP", "the dashboard would be reachable from outside"
    assert str(head["rayStartParams"]["num-cpus"]) == "0"


def test_rayjob_worker_group_asks_for_a_whole_8_gpu_node():
    groups = rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert len(groups) == 1
    (group,) = groups
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] >= 1   # auto concurrency
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) == 8
    assert int(resources["requests"]["nvidia.com/gpu"]) == 8   # Kubernetes wants requests = limits


def test_rayjob_cluster_is_what_rays_autoscaler_reads():
    """Ray's own reading of a RayCluster spec (KubeRay's autoscaler), which also runs validate_config."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cr = {"metadata": {"name": "qkvsearch-test", "namespace": "default"},
          "spec": rayjob()["spec"]["rayClusterSpec"]}
    types = _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]
    assert types.pop("headgroup")["resources"]["CPU"] == 0
    assert [t["resources"]["GPU"] for t in types.values()] == [8]


def test_rayjob_pods_share_the_image_built_here_the_dataset_and_the_bucket_role():
    docs = manifests()
    containers = ray_containers()
    images = {c["image"] for c in containers.values()}
    assert len(images) == 1, f"head and workers run different images: {images}"
    assert [args for word, args in dockerfile() if word == "FROM"][0].startswith(RAY_IMAGE)
    pods = [rayjob()["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    accounts = {p.get("serviceAccountName") for p in pods}
    assert len(accounts) == 1 and None not in accounts
    account = docs["ServiceAccount"]
    assert account["metadata"]["name"] in accounts
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    data = PurePosixPath(launched_spec(LAUNCHES[-1][1]).data.path)
    for name, container in containers.items():
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        assert any(data.is_relative_to(m) for m in mounts), f"{name} does not mount {data} ({mounts})"


def test_the_image_holds_what_pip_install_and_the_entrypoint_read():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copies = image_copies()
    needed = {"pyproject.toml", project["project"]["readme"], *project["tool"]["setuptools"]["package-dir"].values()}
    missing = [p for p in sorted(needed) if not any(p == c or p.startswith(f"{c}/") for c in copies)]
    assert not missing, f"the Dockerfile copies none of {missing}"
    spec = Path(LAUNCHES[-1][1][1]).relative_to(ROOT).as_posix()
    assert any(spec == c or spec.startswith(f"{c}/") for c in copies), f"{spec} is not in the image"
    assert all(copies[c] == c for c in copies), "a COPY moves a folder: the WORKDIR paths would not match"
    assert any(word == "RUN" and "pip install" in args for word, args in dockerfile())


# ---------------------------------------------------------------- the campaigns they launch


def test_both_cluster_files_launch_a_campaign():
    assert [label for label, _ in LAUNCHES] == [LAUNCHER.name, RAYJOB.name]


@pytest.mark.parametrize("argv", [a for _, a in LAUNCHES], ids=[label for label, _ in LAUNCHES])
def test_launched_spec_is_a_file_of_the_repository_and_loads_with_its_overrides(argv):
    path = Path(argv[1])
    assert path.is_file(), f"{path} does not exist in the repository"
    args = parse(argv)
    spec = launched_spec(argv)
    storage = [value for key, _, value in (o.partition("=") for o in args.overrides) if key == "storage"]
    if storage:
        assert spec.storage == storage[-1]   # applied as the CLI applies it: the last one wins
    assert spec.model.name.startswith("xcit_") and spec.data.dataset == "imagefolder"
    assert spec.resources.workers_per_trial == 8 and spec.resources.gpus_per_worker == 1
    # Every node writes the campaign (records from the head, checkpoints from the workers): a bucket.
    assert re.match(r"^(s3|gs)://[^/]+/", spec.storage), spec.storage


@pytest.mark.parametrize("argv", [a for _, a in LAUNCHES], ids=[label for label, _ in LAUNCHES])
def test_launched_spec_validates_as_the_cli_does_without_the_dataset(argv, capsys):
    """`qkvsearch validate SPEC --set ...`: storage and every model of the space are checked; a dataset
    path this machine lacks is only warned about (the spec names the cluster's shared filesystem)."""
    spec = launched_spec(argv)
    assert cli.main(["validate", *argv[1:]]) == cli.EXIT_OK
    out, err = capsys.readouterr()
    assert f"{argv[1]}: valid" in out
    if not os.path.exists(spec.data.path):
        assert f"data.path: {spec.data.path} does not exist on this machine" in err


def test_a_launch_where_the_dataset_is_missing_is_refused_so_the_head_must_mount_it():
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.data.datasets import check_dataset

    spec = launched_spec(LAUNCHES[-1][1])
    if os.path.exists(spec.data.path):
        pytest.skip(f"{spec.data.path} exists on this machine")
    with pytest.raises(BadInput, match="data_path"):
        check_dataset(fill(base_config(spec)))   # what `launch` runs where the RayJob's entrypoint runs


def node_sizes() -> dict[str, dict]:
    """GPU node resources as Ray sees them, in each cluster file."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cfg = launcher()
    out = {f"{LAUNCHER.name}:{n}": t["resources"] for n, t in cfg["available_node_types"].items()
           if t["resources"].get("GPU")}
    cr = {"metadata": {"name": "qkvsearch-test", "namespace": "default"},
          "spec": rayjob()["spec"]["rayClusterSpec"]}
    types = _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]
    out |= {f"{RAYJOB.name}:{n}": t["resources"] for n, t in types.items() if t["resources"].get("GPU")}
    return out


@pytest.mark.parametrize("argv", [a for _, a in LAUNCHES], ids=[label for label, _ in LAUNCHES])
def test_one_trial_fits_one_gpu_node_of_each_cluster(argv):
    """STRICT_PACK (and NVLink-only all-reduce) needs a trial's workers on one node: CPUs and GPUs."""
    res = launched_spec(argv).resources
    for node, size in node_sizes().items():
        assert res.workers_per_trial * res.gpus_per_worker <= size["GPU"], node
        assert res.workers_per_trial * res.cpus_per_worker <= size["CPU"], node


def test_no_token_is_written_in_the_cluster_files():
    for path in sorted(CLUSTER.iterdir()):
        text = path.read_text()
        assert not re.search(r"RAY_AUTH_TOKEN=(?![\s\"']*\$)\S", text), f"{path.name} sets a token"
        assert not re.search(r"\b[0-9a-fA-F]{32,}\b", text), f"{path.name} holds a long hex string"
        assert "kind: Secret" not in text, f"{path.name} defines a Secret"
