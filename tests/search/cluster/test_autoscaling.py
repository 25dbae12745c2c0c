"""An autoscaling cluster: Ray's fake node provider (the one ray.cluster_utils.AutoscalingCluster drives) behind
Ray's v2 autoscaler, on this machine. Its head holds no CPU; its one worker type holds 2 CPUs, one node at
most. A campaign whose trial one such node holds waits for it and completes; one that no node could hold
is refused at launch and writes nothing.

The cluster is started the way AutoscalingCluster starts it (`ray start --head --autoscaling-config`), not
by AutoscalingCluster itself: its start() runs `ray stop --force`, which stops every Ray on the machine,
and its config template (fake_multi_node/example.yaml) is not in Ray's wheel. The provider is therefore
named as an external module, which needs no template."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from helpers.live_campaign import (
    QKVSEARCH,
    auth_token,
    free_port,
    get_json,
    own_token,
    ray_temp_folder,
    run_to_end,
    stop_head,
    tiny_spec,
    wait_for,
    write_spec,
)

from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow

BUCKET = "qkv-autoscaling"
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"  # the fake provider's own


def _autoscaling_config(gcs_port: int) -> dict:
    empty = {k: [] for k in ("initialization_commands", "setup_commands", "head_setup_commands",
                             "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands",
                             "cluster_synced_files", "rsync_exclude", "rsync_filter")}
    return {
        "cluster_name": "qkv-fake", "max_workers": 1, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "external",
                     "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
                     "gcs_address": f"127.0.0.1:{gcs_port}", "head_node_id": FAKE_HEAD_NODE_ID,
                     "launch_multiple": True, "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu2": {"resources": {"CPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 1},
        },
        "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {},
        "file_mounts_sync_continuously": False, **empty,
    }


class FakeAutoscalingCluster:
    """`ray start --head --block` with the fake provider and the v2 autoscaler, in a temp folder of its own;
    stopped (and every process of that folder with it) on exit."""

    def __init__(self, tmp: Path):
        self.ray_tmp = ray_temp_folder()
        self.port, self.dash = free_port(), free_port()
        config = tmp / "autoscaling.json"
        config.write_text(json.dumps(_autoscaling_config(self.port)))
        env = {**os.environ, "RAY_TMPDIR": self.ray_tmp,
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_FAKE_CLUSTER": "1",
               "RAY_enable_autoscaler_v2": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
               "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}
        self.env = own_token(env, tmp)  # `ray start` creates none: the head, its nodes and drivers share this one
        self.env.pop("RAY_ADDRESS", None)
        ray_bin = str(Path(sys.executable).parent / "ray")
        self.head = subprocess.Popen(
            [ray_bin, "start", "--head", "--block", f"--autoscaling-config={config}", "--num-cpus=0",
             f"--port={self.port}", f"--temp-dir={self.ray_tmp}", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={self.dash}", f"--dashboard-agent-listen-port={free_port()}",
             f"--ray-client-server-port={free_port()}"],  # ports of its own: the suite's Ray may hold the defaults
            env=self.env, stdout=open(tmp / "head.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.dashboard = f"http://127.0.0.1:{self.dash}"
        wait_for(self._answers, 120, "the head's dashboard")

    def _answers(self) -> bool:
        if self.head.poll() is not None:
            raise AssertionError(f"ray start exited {self.head.returncode}")
        try:
            get_json(f"{self.dashboard}/api/v0/nodes", auth_token(self.env), timeout=5)
            return True
        except OSError:
            return False

    def client_env(self) -> dict:
        """The environment of a process that works on this cluster (a driver given its address)."""
        env = {k: v for k, v in self.env.items() if k not in (
            "RAY_FAKE_CLUSTER", "RAY_enable_autoscaler_v2", "AUTOSCALER_UPDATE_INTERVAL_S",
            "RAY_CLOUD_INSTANCE_ID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")}
        return {**env, "RAY_ADDRESS": f"127.0.0.1:{self.port}", "PYTHONUNBUFFERED": "1"}

    def nodes(self) -> list[dict]:
        return get_json(f"{self.dashboard}/api/v0/nodes?detail=1", auth_token(self.env))["data"]["result"]["result"]

    def stop(self) -> None:
        stop_head(self.head, self.ray_tmp)


@pytest.fixture
def autoscaling_cluster(s3, tmp_path):  # after s3: the cluster's nodes inherit its endpoint and credentials
    cluster = FakeAutoscalingCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


def _launch(cluster: FakeAutoscalingCluster, spec: dict, tmp: Path) -> subprocess.CompletedProcess:
    spec_file = write_spec(tmp / f"{spec['name']}.yaml", spec)
    return run_to_end([*QKVSEARCH, "launch", str(spec_file)], env=cluster.client_env(), cwd=tmp)


def test_a_trial_waits_for_the_node_the_autoscaler_adds_and_one_no_node_holds_is_refused(
        autoscaling_cluster, s3, tmp_path):
    s3.create_dir(BUCKET)
    storage = f"s3://{BUCKET}/campaigns"
    assert not any(n["resources_total"].get("CPU") for n in autoscaling_cluster.nodes())  # the head holds none

    too_big = tiny_spec(storage, "too-big", workers=2, epochs=1, variants=[{"embedding": "linear"}])
    too_big["resources"]["cpus_per_worker"] = 2  # 4 CPUs: the autoscaler may add one 2-CPU node
    refused = _launch(autoscaling_cluster, too_big, tmp_path)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "no node type it may add can make room" in refused.stderr and "4 CPUs" in refused.stderr
    assert s3.get_file_info(pafs.FileSelector(f"{BUCKET}/campaigns", allow_not_found=True, recursive=True)) == []

    fits = tiny_spec(storage, "waits", workers=2, epochs=2, variants=[{"embedding": "linear"}])
    started = time.time()
    done = _launch(autoscaling_cluster, fits, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    waiting = [line for line in done.stdout.splitlines() if line.startswith("waiting for the autoscaler: ")]
    assert len(waiting) == 1 and "2 workers x (1 CPU, 0 GPU)" in waiting[0] and "0 CPUs" in waiting[0]
    records, problems = read_trial_records(f"{storage}/waits")
    assert not problems and [r["status"] for r in records] == ["completed"]
    assert [int(e["epoch"]) for e in records[0]["epochs"]] == [1, 2]
    added = [n for n in autoscaling_cluster.nodes() if n["resources_total"].get("CPU") == 2]
    assert added and all(n["start_time_ms"] / 1000 > started for n in added)  # added for the campaign


def test_the_monitor_of_a_cluster_started_by_hand_is_no_autoscaler(ray_local):
    """Every head runs Ray's v1 monitor; without an autoscaling config it adds nothing."""
    from qkvsearch.search.cluster.capacity import autoscaler

    assert wait_for(lambda: _status_written(), 30, "the monitor's first status")
    assert autoscaler() is None


def _status_written() -> bool:
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    return bool(_internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS))
