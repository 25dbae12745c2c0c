"""A local Ray for one machine: started bound to 127.0.0.1, stopped with every process it started.

Ray's own shutdown stops the head's processes (GCS, raylet, dashboard); each worker process then ends
when it sees its raylet gone. A worker that was ending gracefully when Ray stopped has already stopped
looking: a graceful exit (an actor whose handle went out of scope, or that called `exit_actor()`, as
Train's controller and placement-group cleaner end) first disconnects from the raylet, then tears the
interpreter down with no time limit, and Ray force-kills it only after `actor_graceful_shutdown_timeout_ms`
(30 s), from a GCS that is gone by then. A teardown that stalls in that window leaves the process running,
orphaned. `stop_local_ray` therefore ends, after Ray's shutdown, whatever the local Ray started that is
still there.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys

# Set before Ray starts: a local cluster's processes inherit them.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # reports otherwise arrive ~2 s late
if not os.environ.get("RAY_ADDRESS") and "ray" not in sys.modules:  # Ray reads both when imported
    # A local Ray serves this machine alone: Ray then takes 127.0.0.1 as the node's address, so its GCS,
    # raylet, agents and metrics exporter listen on loopback only (else on every interface). Set it to 1
    # to reach a local Ray from other machines.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Token auth, the default of a new local Ray, said explicitly: Ray then does not warn about it.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    # Ray ends a worker past its soft limit after 1 s idle; one-shot scoring's measurement tasks come seconds
    # apart, and each new worker imports torch and timm again (about 20 s on 2 cores).
    os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", "60000")

import ray  # noqa: E402

# isort: split
import psutil  # noqa: E402  (Ray's own copy: on the path once ray is imported)

from qkvsearch.ray_private import node_startup_timed_out  # noqa: E402
from qkvsearch.search.cluster.jobs import job_config  # noqa: E402

log = logging.getLogger(__name__)

# Passed on to every process of the job when set here. RAY_TRAIN_ENABLE_STATE_TRACKING=1 (Train runs at
# /api/train/v2/runs/v1) is left to the user: it starts a state actor that imports torch, and makes every
# controller report each state change to it.
RAY_ENV = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_STATE_TRACKING")
TRIAL_SLOT = "trial_slot"   # the custom resource that caps how many trials run at once
RESOURCES_ENV = "QKVSEARCH_RAY_RESOURCES"   # JSON {name: amount}: what a local Ray declares besides (ray start
                                            # --resources for a cluster's nodes), e.g. a deployment target's
STOP_WAIT_S = 10.0          # how long what Ray started may take to end after its shutdown
STARTS = 3                  # tries to start the local Ray: Ray gives its node a fixed 30 s to come up

_started: list = []         # the processes ray.init started in this process (psutil.Process)


def start_local_ray(trial_slots: int, num_cpus: int | None = None, metadata: dict | None = None,
                    num_gpus: int | None = None):
    """Start a local Ray bound to 127.0.0.1 with `trial_slots` trial slots; returns its context. num_gpus:
    the GPUs it declares (None: those it detects; more than there are: logical GPUs, as tests declare them).

    Ray processes find their own cluster through RAY_ADDRESS; without it, Train's State API calls
    fail ("Found multiple active Ray instances") whenever another Ray runs on the same machine, and
    a stopped trial's placement group is never cleaned up. So the GCS port is chosen up front and
    every process of the job is told the address. metadata: the job's (search.cluster.jobs).
    """
    resources = {**declared(), TRIAL_SLOT: trial_slots}
    for attempt in range(1, STARTS + 1):
        port = free_port()
        before = {p.pid for p in psutil.Process().children()}
        os.environ["RAY_GCS_SERVER_PORT"] = str(port)
        try:
            env = ray_env() | {
                "RAY_ADDRESS": f"127.0.0.1:{port}",
                "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # one machine: no spot preemption to watch for
            }
            ctx = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources,
                           _node_ip_address="127.0.0.1",
                           include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False,
                           logging_level=logging.WARNING,  # the campaign's own lines say what Ray's info lines did
                           runtime_env={"env_vars": env}, job_config=job_config(metadata or {}))
        except Exception as exc:
            if attempt == STARTS or not node_startup_timed_out(exc):
                raise
            ray.shutdown()   # whatever the failed init had set up in this process
            left = _descendants([p for p in psutil.Process().children() if p.pid not in before])
            for proc in left:  # the half-started node: its GCS, raylet and what they started
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(left, timeout=STOP_WAIT_S)
            log.warning("Ray's node did not start within Ray's own 30 s (a loaded machine): starting it again "
                        "(%d of %d)", attempt + 1, STARTS)
            continue
        finally:
            del os.environ["RAY_GCS_SERVER_PORT"]
        _started[:] = [p for p in psutil.Process().children() if p.pid not in before]
        return ctx
    raise AssertionError("unreachable")


def declared() -> dict[str, float]:
    """The custom resources RESOURCES_ENV declares ({} when unset); BadInput naming it when it is no mapping of
    names to positive amounts."""
    import json

    from qkvsearch.spaces.errors import BadInput

    text = os.environ.get(RESOURCES_ENV, "").strip()
    try:
        found = json.loads(text) if text else {}
        ok = isinstance(found, dict) and all(isinstance(v, (int, float)) and v > 0 for v in found.values())
    except ValueError:
        ok = False
    if not ok:
        raise BadInput(f"{RESOURCES_ENV}: expected a JSON mapping of resource names to positive amounts, "
                       f"e.g. {{\"cpu_node\": 1}}, given {text!r}")
    return {k: float(v) for k, v in found.items()}


def stop_local_ray(wait_s: float = STOP_WAIT_S) -> list[int]:
    """ray.shutdown(), then end every process the local Ray started (its head's processes and all they
    started) that is still running `wait_s` later. Returns the pids it had to kill."""
    tree = _descendants(_started)
    _started.clear()
    ray.shutdown()
    _, alive = psutil.wait_procs(tree, timeout=wait_s)
    killed = {}
    for proc in alive:
        try:
            name = proc.name()
            proc.kill()
            killed[proc.pid] = name
        except psutil.NoSuchProcess:
            pass
    if killed:
        log.info("stopped what Ray left running %g s after its shutdown: %s", wait_s,
                 ", ".join(f"{pid} {name}" for pid, name in killed.items()))
    psutil.wait_procs(alive, timeout=wait_s)
    return list(killed)


def _descendants(roots: list) -> list:
    """roots and every process they started, as they are now (psutil.Process; gone ones left out)."""
    found = []
    for root in roots:
        try:
            found += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return found


def ray_env() -> dict:
    return {k: os.environ[k] for k in RAY_ENV if k in os.environ}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
