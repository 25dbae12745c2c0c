"""Several nodes (ray.cluster_utils.Cluster: a head and a second node on this machine), storage in a bucket
(a real S3-protocol server): a 2-worker trial with placement_strategy SPREAD puts its workers on both
nodes; the second node is then removed while the trial runs, and the trial resumes on what remains."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pyarrow.fs as pafs
import pytest
from helpers.live_campaign import (
    free_port,
    named_checkpoint_epochs,
    own_token,
    ray_temp_folder,
    remove_ray_temp_folder,
    tiny_spec,
    write_spec,
)

from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow


BUCKET = "qkv-multinode"
NAME = "two-nodes"

# Runs in its own process: a Cluster needs a Ray of its own, not the test session's.
SCRIPT = textwrap.dedent("""
    import json, os, sys, threading, time
    from ray.cluster_utils import Cluster

    spec_file, exp, out, dashboard_port = sys.argv[1:5]
    # a dashboard port of its own: the test session's Ray may hold the default one
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trial_slot": 1},
                                                            "dashboard_port": int(dashboard_port)})
    second = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    import ray
    from ray.util.state import list_actors
    from qkvsearch.search.cli import main
    from qkvsearch.search.records.readers import read_trial_records

    result = {}
    def launch():
        result["rc"] = main(["launch", spec_file])
    driver = threading.Thread(target=launch)
    driver.start()
    while driver.is_alive():
        try:
            records, _ = read_trial_records(exp)
        except Exception:
            records = []
        if any(len(r["epochs"]) >= 1 for r in records):
            break
        time.sleep(0.5)
    alive = list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    result["worker_nodes"] = sorted({a.node_id for a in alive})
    result["nodes"] = {"head": cluster.head_node.node_id, "second": second.node_id}
    cluster.remove_node(second)
    result["removed_at"] = time.time()
    driver.join()
    ray.shutdown()  # the driver first: the Cluster will not remove a node a driver is connected to
    cluster.shutdown()
    open(out, "w").write(json.dumps(result))
""")


def test_a_trial_spreads_over_two_nodes_and_survives_losing_one(s3, tmp_path):
    s3.create_dir(BUCKET)
    spec = tiny_spec(f"s3://{BUCKET}/campaigns", NAME, workers=2, epochs=3, variants=[{"embedding": "linear"}],
                     steps=10)
    spec["resources"].update(placement_strategy="SPREAD", max_failures=2)
    spec_file = write_spec(tmp_path / "spec.yaml", spec)
    exp = f"s3://{BUCKET}/campaigns/{NAME}"
    (tmp_path / "cluster.py").write_text(SCRIPT)
    ray_tmp = ray_temp_folder()
    import os

    env = own_token({**os.environ, "RAY_TMPDIR": ray_tmp}, tmp_path)  # the cluster's own, not ~/.ray's
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, str(tmp_path / "cluster.py"), str(spec_file), exp, str(tmp_path / "out.json"),
                          str(free_port())],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    try:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        result = json.loads((tmp_path / "out.json").read_text())
    finally:
        remove_ray_temp_folder(ray_tmp, "the cluster's processes to stop")

    assert result["rc"] == 0, run.stdout[-3000:]
    assert result["worker_nodes"] == sorted(result["nodes"].values())  # one worker on each node
    records, problems = read_trial_records(exp)
    assert not problems and {r["status"] for r in records} == {"completed"}, [
        (r["trial_name"], r["status"], (r.get("error") or "")[-1500:]) for r in records]
    for r in records:
        assert [int(e["epoch"]) for e in r["epochs"]] == [1, 2, 3], r["trial_name"]
        assert r["checkpoint_path"].startswith(f"{exp}/train_runs/"), r["checkpoint_path"]  # a URI, not Train's
                                                                                            # bare path
    assert all(last == named for last, named in named_checkpoint_epochs(records).values())
    (hit,) = records
    assert hit["started_at"] < result["removed_at"] < hit["ended_at"]  # it ran on through the removal
    stored = [f.path for f in s3.get_file_info(pafs.FileSelector(f"{BUCKET}/campaigns/{NAME}", recursive=True))]
    assert any("/train_runs/" in p and p.endswith("state.pt") for p in stored)
    assert any(p.endswith("qs_campaign.json") for p in stored)
