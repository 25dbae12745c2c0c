"""A `qkvsearch launch` or `resume` in its own process, with its own local Ray (its own RAY_TMPDIR, so its
processes can be told apart from any other Ray on the machine), for tests of what a user sees from
outside: the dashboard, metrics, signals, the terminal."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from helpers import tiny_model, tiny_space

QKVSEARCH = [sys.executable, "-m", "qkvsearch.search.cli"]


def tiny_spec(storage: Path, name: str, *, workers: int, epochs: int, variants: list[dict], steps: int = 4,
              keep: str = "all") -> dict:
    """keep: what ended trials keep of their checkpoints (default here: all, as training leaves them)."""
    return {
        "name": name,
        "model": tiny_model(),
        "data": {"dataset": "digits"},
        "train": {"epochs": epochs, "batch_size": 32, "lr": 2e-3, "warmup_epochs": 0,
                  "max_steps_per_epoch": steps, "seed": 0, "checkpoint_every": 1},
        "space": tiny_space({"variants": variants}),
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "grid"},
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": workers, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "checkpoints": {"keep": keep},
        "storage": str(storage),
    }


# Drivers a test started and has not stopped yet, with their Ray temp folders: a test interrupted (Ctrl-C, or
# SIGTERM, which tests/conftest.py turns into the same KeyboardInterrupt) may end before its own cleanup runs;
# the session's end stops what is left (stop_started).
_STARTED: dict[subprocess.Popen, str] = {}


def started(proc: subprocess.Popen, ray_tmp: str) -> None:
    _STARTED[proc] = ray_tmp


def stopped(proc: subprocess.Popen) -> None:
    _STARTED.pop(proc, None)


def stop_started() -> list[int]:
    """Stop every driver still registered (stop_driver). Returns the pids of those it found running."""
    found = [proc.pid for proc in _STARTED if proc.poll() is None]
    for proc, ray_tmp in list(_STARTED.items()):
        stop_driver(proc, ray_tmp)
    return found


def ray_temp_folder() -> str:
    """A temp folder for a Ray a test starts (its RAY_TMPDIR or --temp-dir): in /tmp, not under the test's
    tmp_path, as Ray's socket paths must stay under 108 characters; remove_ray_temp_folder removes it."""
    return tempfile.mkdtemp(prefix="r", dir="/tmp")


def remove_ray_temp_folder(ray_tmp: str, what: str = "the Ray's processes to end") -> None:
    """Wait for none of a Ray's processes to be left (within 60 s, else fail naming ``what``), then remove its
    temp folder (its sessions' sockets and logs)."""
    wait_for(lambda: not ray_processes(ray_tmp), 60, what)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def stop_driver(proc: subprocess.Popen, ray_tmp: str) -> None:
    """Stop a driver if it still runs (SIGTERM: it stops its own Ray; SIGKILL after 60 s), end what its Ray
    left, remove its Ray's folder, and take it off the drivers to stop."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    end_ray_processes(ray_tmp, STOP_GRACE_S)
    remove_ray_temp_folder(ray_tmp)
    stopped(proc)


class LiveCampaign:
    """with LiveCampaign(args, tmp) as run: ...  the command runs with stdout/stderr in files; on exit it
    is stopped if still running (SIGTERM, then SIGKILL) and its Ray processes must be gone."""

    def __init__(self, args: list[str], tmp: Path, env: dict | None = None):
        self.args, self.tmp = args, tmp
        self.ray_tmp = ray_temp_folder()
        self.env = {**os.environ, "RAY_TMPDIR": self.ray_tmp, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.out, self.err = tmp / f"{args[0]}.out", tmp / f"{args[0]}.err"
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([*QKVSEARCH, *self.args], stdout=out, stderr=err, env=self.env,
                                         cwd=self.tmp)
        started(self.proc, self.ray_tmp)
        return self

    def __exit__(self, *exc):
        stop_driver(self.proc, self.ray_tmp)
        return False

    def advancing(self, *folders) -> tuple:
        """What changes while this command's campaign advances: its output and the folders given."""
        return folder_state(self.out, self.err, *folders)

    def kill(self, grace_s: float = 5) -> None:
        """SIGKILL the driver, as a lost machine or an OOM killer would, then end what its Ray left."""
        self.proc.kill()
        self.proc.wait()
        end_ray_processes(self.ray_tmp, grace_s)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def finish(self, *folders) -> int:
        """The command's exit code, waited for as long as its output or the folders given keep changing (a busy
        machine makes a campaign slow, not stuck: wait_while_advancing)."""
        wait_while_advancing(lambda: self.proc.poll() is not None, lambda: self.advancing(*folders),
                             f"qkvsearch {self.args[0]} to exit")
        return self.proc.wait()

    def line_starting(self, prefix: str, timeout: float) -> str:
        def found():
            self._check_alive()
            return next((line for line in self.stdout().splitlines() if line.startswith(prefix)), None)
        return wait_for(found, timeout, f"a line starting {prefix!r}")

    def _check_alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"qkvsearch {self.args[0]} exited {self.proc.returncode}:\n{self.stdout()}\n"
                                 f"{self.stderr()[-3000:]}")


def ray_processes(ray_tmp: str) -> list[str]:
    """Processes of the Ray whose temp folder is ray_tmp (its raylet, GCS, workers, dashboard, agents...), found
    by its session, not by name: the folder in a process's command line or environment, or a file it holds
    open there (Ray's agents rename themselves and drop RAY_TMPDIR, but keep their session's logs open)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    mine = []
    for line in out.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if ray_tmp in args or _in_session(pid, ray_tmp):
            mine.append(line.strip())
    return mine


def _in_session(pid: str, ray_tmp: str) -> bool:
    proc = Path("/proc") / pid
    try:
        if ray_tmp.encode() in (proc / "environ").read_bytes():
            return True
        for fd in (proc / "fd").iterdir():
            try:
                if os.readlink(fd).startswith(ray_tmp):
                    return True
            except OSError:
                continue
    except OSError:  # gone, or not ours to read
        return False
    return False


STOP_GRACE_S = 30  # what a stopped driver's Ray takes to end by itself on an idle machine, with room to spare


def end_ray_processes(ray_tmp: str, grace_s: float) -> None:
    """Wait for the Ray processes of ray_tmp to end; after grace_s, SIGKILL those left (a SIGKILLed driver's
    raylet leaves its dashboard and runtime-env agents running: their own watch of it takes minutes)."""
    try:
        wait_for(lambda: not ray_processes(ray_tmp), grace_s, "the driver's Ray processes to end")
    except AssertionError:
        for line in ray_processes(ray_tmp):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not ray_processes(ray_tmp), 30, "the ended Ray processes to go")


HEAD_STOP_GRACE_S = 5  # measured: a `ray start --block` head given SIGTERM takes 20-35 s to end by itself


def stop_head(head: subprocess.Popen, ray_tmp: str) -> None:
    """Stop a head started with `ray start --head --block` in a session of its own (start_new_session), and
    every process of its temp folder: SIGTERM to its process group, a short grace, then SIGKILL to what
    is left (its own graceful stop waits on timeouts; nothing of a test's cluster needs to be kept)."""
    try:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(HEAD_STOP_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for line in ray_processes(ray_tmp):  # the nodes a provider added, workers outside the group
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if head.poll() is None:
        head.kill()
        head.wait()
    remove_ray_temp_folder(ray_tmp, "the head's processes to stop")


STALL_S = 240  # a campaign that writes nothing for this long is hung (its slowest step writes within ~30 s)


def folder_state(*paths) -> tuple:
    """What changes while a campaign advances: every file under ``paths`` (a campaign folder, a driver's
    output) with its size and modification time; the driver's lease is left out (its heartbeat goes on in a
    hung driver too)."""
    seen = []
    for root in map(Path, paths):
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            try:
                info = path.stat()
            except OSError:  # removed meanwhile
                continue
            if path.is_file() and "lease" not in path.name:
                seen.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(seen)


def wait_while_advancing(predicate, progress, what: str, stall_s: float = STALL_S, every: float = 0.5):
    """Wait for ``predicate`` as long as ``progress()`` keeps changing: a busy machine makes a campaign slow,
    not stuck, so only ``stall_s`` seconds without any change fail the wait (a hang)."""
    last, since = progress(), time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise AssertionError(f"nothing changed for {stall_s:.0f} s while waiting for {what}")
        time.sleep(every)


def run_to_end(argv: list[str], *, env: dict | None = None, cwd=None, folders=(),
               stall_s: float = STALL_S) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)`` with no fixed time limit: the command runs as long as
    its output or ``folders`` keep changing (wait_while_advancing), and is killed, failing the wait, once nothing
    changed for ``stall_s`` seconds."""
    with tempfile.TemporaryDirectory(prefix="qs-run-") as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(argv, stdout=o, stderr=e, env=env, cwd=cwd)
        try:
            wait_while_advancing(lambda: proc.poll() is not None, lambda: folder_state(out, err, *folders),
                                 f"{' '.join(map(str, argv[:4]))} to exit", stall_s=stall_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def wait_for(predicate, timeout: float, what: str, every: float = 0.5):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # where Ray's processes look first, in this order


def token_file(env: dict | None = None) -> str:
    """Where the processes started with `env` (default: this one's) find the dashboard's token:
    RAY_AUTH_TOKEN_PATH, else Ray's default ~/.ray/auth_token (of that environment's HOME)."""
    env = os.environ if env is None else env
    home = env.get("HOME") or os.path.expanduser("~")
    return env.get("RAY_AUTH_TOKEN_PATH") or os.path.join(home, ".ray", "auth_token")


def auth_token(env: dict | None = None) -> str:
    """The token the processes started with `env` (default: this one's) use."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"]
    path = Path(token_file(env))
    if not path.is_file():  # a local ray.init() writes one; `ray start` never does
        raise AssertionError(f"no Ray token at {path}: the test must make its own (own_token)")
    return path.read_text().strip()


def own_token(env: dict, folder: Path | str) -> dict:
    """`env` with token auth on and a new token of its own, for the processes of a cluster a test starts
    with `ray start` (which reads a token but never creates one). The token is made the way a user makes
    one on a head, `ray get-auth-token --generate`, with HOME at `folder`, so it lands in
    folder/.ray/auth_token and RAY_AUTH_TOKEN_PATH names it; nothing depends on the user's ~/.ray."""
    folder = Path(folder)
    ray_bin = str(Path(sys.executable).parent / "ray")
    clean = {k: v for k, v in env.items() if k not in TOKEN_VARS}
    subprocess.run([ray_bin, "get-auth-token", "--generate"], env={**clean, "HOME": str(folder)},
                   capture_output=True, check=True, timeout=120)
    path = folder / ".ray" / "auth_token"
    assert path.is_file(), f"`ray get-auth-token --generate` wrote no {path}"
    return {**clean, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def get_json(url: str, token: str | None = None, timeout: float = 10):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
        return json.loads(resp.read())


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a Ray or a server a test starts beside the suite's)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def named_checkpoint_epochs(records, statuses=("completed",)) -> dict[str, tuple[int, int]]:
    """Trial of one of `statuses` -> (its record's last epoch, the epoch of the checkpoint its record
    names), read through the record's checkpoint_path as a user would (a local folder or a URI)."""
    from qkvsearch.trainers.training.engine import load_state

    return {r["trial_name"]: (int(r["epochs"][-1]["epoch"]),
                              int(load_state(r["checkpoint_path"])["history"][-1]["epoch"]))
            for r in records if r["status"] in statuses}
