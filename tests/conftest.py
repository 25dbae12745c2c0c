"""Shared fixtures. Ray is started once per test session, on loopback, and shut down at the end."""
import os
from pathlib import Path

# Train's controller polls workers every 2 s by default: each report would arrive ~2 s late.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # as search.campaign.launch: local Ray on loopback
# Ray starts its workers at niceness 15 (Ray's worker_niceness): beside any load at niceness 0 they get about 3 %
# of a core, and a test waiting on its trials' progress waits on that load instead. The tests' Rays (in this
# process, in the drivers they start, in `ray start`) run their workers at the priority of what runs beside them.
os.environ.setdefault("RAY_worker_niceness", "0")

import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu run where CUDA is present and are skipped, saying so, elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def s3(monkeypatch):
    """A real S3-protocol server (moto, server mode) on 127.0.0.1; AWS_ENDPOINT_URL and credentials point
    this process and its children at it. Yields a pyarrow S3FileSystem that may create buckets."""
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e '.[dev]')")
    import logging

    import pyarrow.fs as pafs

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        yield pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], allow_bucket_creation=True)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 CPUs and one trial slot (the campaign layer's concurrency cap)."""
    import ray

    from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray

    if not ray.is_initialized():
        start_local_ray(trial_slots=1, num_cpus=2)
    yield ray
    stop_local_ray()


@pytest.fixture(scope="session")
def trained_oneshot(tmp_path_factory):
    """The folder of a small one-shot campaign, its supernet, scores, selection and retrained subnet
    (helpers.trained_supernet: its space and settings, and campaigns that take its supernet). Trained once per
    test run: under pytest-xdist the first process to ask trains it and the others wait for it. Each process
    gets a copy of its own, as tests write beside it and one checks that a refused export writes nothing."""
    import fcntl
    import shutil

    from helpers.trained_supernet import train_oneshot

    shared = run_folder(tmp_path_factory)
    with open(shared / "trained_oneshot.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released as the file closes, or as this process ends
        done = shared / "trained_oneshot.done"   # the trained folder's path, once it is trained
        if not done.exists():
            shutil.rmtree(shared / "trained_oneshot", ignore_errors=True)   # what a process that failed left
            (shared / "trained_oneshot").mkdir()
            done.write_text(str(train_oneshot(shared / "trained_oneshot")))
        trained = Path(done.read_text())
    own = tmp_path_factory.mktemp("trained_oneshot") / trained.name
    shutil.copytree(trained, own)
    yield own


def run_folder(tmp_path_factory) -> Path:
    """A folder that every process of this test run shares (pytest-xdist's workers each have a base folder of their
    own, under one parent that other runs share too)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    folder = tmp_path_factory.getbasetemp().parent / f"run-{run}" if run else tmp_path_factory.getbasetemp() / "run"
    folder.mkdir(exist_ok=True)
    return folder


# ---------------------------------------------------------------------------------- nothing left running
RAY_PROCESS_MARKS = ("ray::", "raylet", "gcs_server", "default_worker.py", "ray/dashboard/", "runtime_env/agent")
ORPHAN_GRACE_S = 30  # a shut-down Ray's workers notice their raylet is gone within seconds


# Under pytest-xdist each worker judges only what its own tests started: every process they start inherits
# the worker's name in PYTEST_XDIST_WORKER (Ray's processes too: the raylet passes its environment on).
WORKER_VAR = "PYTEST_XDIST_WORKER"


def _started_here(pid: int) -> bool:
    """Whether ``pid`` was started by this pytest process's tests (always so without xdist)."""
    mine = os.environ.get(WORKER_VAR)
    if mine is None:
        return True
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False
    return f"{WORKER_VAR}={mine}".encode() in environ


def _ray_orphans(exclude: set[int]) -> dict[int, str]:
    """Ray processes whose parent is gone (re-parented to init or a subreaper), not in ``exclude``, started
    by this process's tests."""
    import subprocess

    out = subprocess.run(["ps", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()[1:]]
    alive = {int(r[0]) for r in rows}
    found = {}
    for pid, ppid, stat, args in (r for r in rows if len(r) == 4):
        pid, ppid = int(pid), int(ppid)
        if stat.startswith("Z"):  # ended, left for init to reap (a killed driver's agents): not running
            continue
        if pid not in exclude and any(m in args for m in RAY_PROCESS_MARKS) and (ppid == 1 or ppid not in alive) \
                and _started_here(pid):
            found[pid] = args[:160]
    return found


def _wait_for_orphans(exclude: set[int]) -> dict[int, str]:
    import time

    end = time.monotonic() + ORPHAN_GRACE_S
    while True:
        orphans = _ray_orphans(exclude)
        if not orphans or time.monotonic() > end:
            return orphans
        time.sleep(1)


def _kill(pids) -> None:
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_PRESENT_AT_START: set[int] = set()
_SEEN: set[int] = set()  # orphans found after earlier tests (each failed its test and was killed)


def pytest_sessionstart(session):
    _PRESENT_AT_START.update(_ray_orphans(set()))  # someone else's: not this suite's to judge


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each test file's seconds to tests/durations.json (the order -n 2 runs files in)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile: the longest files first, one file ahead per process (helpers.scheduling)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from helpers.scheduling import LongestFileFirst

    return LongestFileFirst(config, log)


def pytest_configure(config):
    from helpers import interrupts

    if not config.pluginmanager.is_registered(interrupts):  # its pytest_configure is called as it registers
        config.pluginmanager.register(interrupts, "helpers.interrupts")
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        from helpers.scheduling import DurationRecorder

        config.pluginmanager.register(DurationRecorder(), "duration-recorder")
    _make_ray_token(config)


def _make_ray_token(config):
    """Ray's token for a local Ray exists before tests start Ray side by side (pytest-xdist): on a machine
    without one, each would write its own, and a cluster could read another's."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    import subprocess
    import sys

    ray_bin = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_bin), "get-auth-token", "--generate"], check=True, capture_output=True)


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """Each test leaves torch's intra-op thread count as it found it. Code that trains, scores or measures in the
    calling process sets it to its worker's CPUs (trainers.ray_train.loop, search.campaign.measured,
    search.campaign.oneshot.scorers); a test that ran such code here would leave it so for the tests after it, whose
    float sums would then split over other threads than in the processes they compare with."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_orphaned_ray_process(request):
    """Fail the test after which a Ray process is left without its parent (stopped: later tests go on).
    One `ps` per test: what was there before the test is what the previous test's check found."""
    yield
    if not _ray_orphans(_PRESENT_AT_START | _SEEN):
        return
    orphans = _wait_for_orphans(_PRESENT_AT_START | _SEEN)
    if orphans:
        _SEEN.update(orphans)
        _kill(orphans)
        pytest.fail("Ray processes left running without their parent:\n"
                    + "\n".join(f"  {pid} {args}" for pid, args in orphans.items()), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """The session's own Ray (shut down after the last test) must not leave orphans either."""
    orphans = _wait_for_orphans(_PRESENT_AT_START)
    if orphans:
        _kill(orphans)
        print("\nRay processes left running without their parent after the test session:\n"
              + "\n".join(f"  {pid} {args}" for pid, args in orphans.items()))
        session.exitstatus = 1
