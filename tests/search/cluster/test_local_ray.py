"""A local Ray stops with every process it started, even one whose graceful exit hangs.

Train's controller (its handle out of scope) and placement-group cleaner (`exit_actor()`) end gracefully:
the process disconnects from its raylet, which stops its check that the raylet lives, then tears its
interpreter down with no time limit. Ray force-kills it only 30 s later, from the GCS; a campaign shuts
Ray down right after its last trial, so a teardown that stalls leaves the process running without its
raylet. The actor below hangs in its teardown on purpose; the run is a process of its own, with a Ray of
its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.processes import running

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, time
from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray
import ray
from ray.util.state import list_actors

@ray.remote(num_cpus=0)
class Stuck:
    def arm(self):
        import atexit
        atexit.register(time.sleep, 600)  # a teardown that does not end
        return os.getpid()

start_local_ray(trial_slots=1, num_cpus=1)
here = ray.get_runtime_context().gcs_address  # the suite's own Ray may run beside this one
stuck = Stuck.remote()
pid = ray.get(stuck.arm.remote())
del stuck  # out of scope: Ray ends the actor gracefully
end = time.time() + 60
while time.time() < end and [a.state for a in list_actors(here, filters=[("class_name", "=", "Stuck")])] != ["DEAD"]:
    time.sleep(0.2)
time.sleep(1)
killed = stop_local_ray(wait_s=3)
print(json.dumps({"pid": pid, "killed": killed}))
"""



def test_a_process_hanging_in_its_graceful_exit_is_stopped_with_the_local_ray():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        # The cause: 3 s after Ray's own shutdown the hung actor still ran (its raylet gone), so it was killed.
        assert out["pid"] in out["killed"], out
        assert not running(out["pid"])
    finally:
        if running(out["pid"]):
            os.kill(out["pid"], 9)


SLOW_NODE = """
import json, subprocess
import ray
from qkvsearch.search.cluster import local_ray

real_init, half_started = ray.init, []

def first_node_too_slow(*args, **kwargs):   # as ray._private.node fails a raylet that registers after 30 s
    if not half_started:
        half_started.append(subprocess.Popen(["sleep", "600"]))   # stands for the node's GCS and raylet
        raise Exception("The current node timed out during startup. This could happen because some of the "
                        "raylet failed to startup or the GCS has become overloaded.")
    return real_init(*args, **kwargs)

local_ray.ray.init = first_node_too_slow
local_ray.start_local_ray(trial_slots=1, num_cpus=1)
up = ray.is_initialized() and ray.cluster_resources().get("trial_slot") == 1.0
local_ray.stop_local_ray()
print(json.dumps({"up": up, "left": half_started[0].poll() is None}))
"""


def test_a_node_slower_than_rays_own_limit_is_started_again_and_the_half_started_one_stopped():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", SLOW_NODE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"up": True, "left": False}
    assert "starting it again (2 of 3)" in done.stderr
