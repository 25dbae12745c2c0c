"""One live driver per campaign: a lease file, ``<exp>/qs_driver.lease``, in the campaign's own storage.

`launch`, `resume` and `launch --overwrite` hold it while they run; a second driver finds it and stops
before it starts Ray or writes anything (CampaignHeld, a BadInput: exit 2). The holder's heartbeat
thread rewrites the lease every `renew_every_s` (stale limit / RENEW_PER_STALE); a lease whose heartbeat
is older than the stale limit belongs to a driver that died without releasing it (SIGKILL, node lost),
and the next driver takes it over. The lease reads (JSON)::

    {"host": ..., "pid": ..., "started_at": unix s, "heartbeat_at": unix s, "command": "qkvsearch resume ...",
     "job": Ray job submission id or null, "stale_s": its stale limit, "token": random hex: this holder}

The holder declares its stale limit (it knows how often it beats): a reader or a would-be taker judges a
lease by the limit written in it, never by its own setting.

Every change is conditional on the version last read, so that of two drivers exactly one wins: a create
if absent, a replace or delete if unchanged (search.records.lease_stores: link / O_EXCL locally and on NFS,
If-None-Match / If-Match on S3, generation preconditions on GCS).

Ages compare the holder's clock with the reader's: the machines' clocks must agree within seconds (NTP).
Readers (`read_lease`: status, watch) go through pyarrow and need neither boto3 nor Ray.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from qkvsearch.search.records.lease_stores import LeaseStorageError, open_store
from qkvsearch.spaces.errors import BadInput, reason
from qkvsearch.storage import open_location

log = logging.getLogger(__name__)

# JSON, but not named *.json: Tune's restore copies every top-level .json and .pkl of the experiment into its
# staging folder and uploads that folder on each sync, which would put back the lease as it was at restore.
LEASE_FILE = "qs_driver.lease"
STALE_ENV = "QKVSEARCH_DRIVER_STALE_S"  # seconds without a heartbeat after which a lease is stale
STALE_S = 60.0  # default: six missed heartbeats, so a slow storage round trip or a GC pause never frees a live hold
RENEW_PER_STALE = 6  # heartbeats per stale limit: every 10 s by default
ATTEMPTS = 20  # reads of a lease that other drivers are changing, before giving up


def stale_after_s() -> float:
    """The stale limit: STALE_ENV's value, else STALE_S. BadInput when the variable is not a number > 0."""
    text = os.environ.get(STALE_ENV)
    if text is None or not text.strip():
        return STALE_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise BadInput(f"{STALE_ENV}: expected a number of seconds > 0, given {text!r}")
    return value


def renew_every_s(stale_s: float) -> float:
    return stale_s / RENEW_PER_STALE


@dataclass(frozen=True)
class Holder:
    """The driver named in a lease."""

    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    command: str
    job: str | None
    stale_s: float
    token: str

    def encode(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    def age_s(self, now: float | None = None) -> float:
        """Seconds since its last heartbeat (by the reader's clock)."""
        return (time.time() if now is None else now) - self.heartbeat_at

    def describe(self, now: float | None = None) -> str:
        """`host node-3, pid 4242, started 2026-11-25 06:40:12 UTC, last heartbeat 4 s ago`"""
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at))
        job = f", Ray job {self.job}" if self.job else ""
        return (f"host {self.host}, pid {self.pid}{job}, started {started}, "
                f"last heartbeat {max(0.0, self.age_s(now)):.0f} s ago")

    def is_stale(self, now: float | None = None) -> bool:
        return self.age_s(now) >= self.stale_s

    def is_this_process(self) -> bool:
        return self.host == socket.gethostname() and self.pid == os.getpid()


def _decode(data: bytes) -> Holder | None:
    """A lease's holder; None for a lease that cannot be read as one (it counts as stale)."""
    try:
        raw = json.loads(data.decode("utf-8"))
        holder = Holder(host=str(raw["host"]), pid=int(raw["pid"]), started_at=float(raw["started_at"]),
                        heartbeat_at=float(raw["heartbeat_at"]), command=str(raw["command"]),
                        job=raw.get("job"), stale_s=float(raw.get("stale_s", STALE_S)), token=str(raw["token"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    times = (holder.started_at, holder.heartbeat_at, holder.stale_s)
    # a NaN or infinite time would never go stale: such a lease could never be taken over
    return holder if all(math.isfinite(t) for t in times) and holder.stale_s > 0 else None


@dataclass(frozen=True)
class DriverState:
    """What a reader sees of a campaign's driver: holder None = no lease (no driver, or one that ended)."""

    holder: Holder | None
    read_at: float
    damaged: bool = False  # a lease file that is not one (stale, like a dead driver's)

    @property
    def live(self) -> bool:
        return self.holder is not None and not self.holder.is_stale(self.read_at)

    @property
    def stale(self) -> bool:
        return self.damaged or (self.holder is not None and not self.live)

    def line(self) -> str:
        """One line for status and watch."""
        if self.live:
            return f"driver: live, {self.holder.describe(self.read_at)}"
        if self.stale:
            who = self.holder.describe(self.read_at) if self.holder else "lease file unreadable"
            limit = f"; stale after {self.holder.stale_s:g} s" if self.holder else ""
            return f"driver: none live; stale hold ({who}{limit}): `qkvsearch resume` takes it over"
        return "driver: none"


def read_lease(exp) -> DriverState:
    """The driver holding the campaign at ``exp`` (local path or URI), read without taking anything."""
    fs, root = open_location(exp)
    now = time.time()
    try:
        with fs.open_input_stream(f"{root}/{LEASE_FILE}") as f:
            data = f.read()
    except FileNotFoundError:
        return DriverState(None, now)
    holder = _decode(data)
    return DriverState(holder, now, damaged=holder is None)


def refuse_if_held(exp: str) -> None:
    """CampaignHeld when a live driver holds ``exp``: a second driver reads this before it imports Ray and
    the launcher, so that it is refused at once. `DriverLease.acquire` takes the hold later by the same rule
    (a holder whose heartbeat is within its stale limit); whatever else is wrong with ``exp`` is left to the
    command's own checks."""
    try:
        state = read_lease(exp)
    except (OSError, ValueError):  # no such folder or storage, a URI pyarrow cannot open: the command says so
        return
    if state.live:
        raise CampaignHeld(exp, state.holder)


class CampaignHeld(BadInput):
    """Another live driver holds the campaign."""

    def __init__(self, exp: str, holder: Holder):
        age, stale_s = max(0.0, holder.age_s()), holder.stale_s
        super().__init__(
            f"{exp}: campaign held by a live driver ({holder.describe()}; command: {holder.command}). "
            f"Wait for it to end, or stop it (Ctrl-C in its terminal, `kill -TERM {holder.pid}` on {holder.host}"
            + (f", or `ray job stop {holder.job}`" if holder.job else "")
            + f"), then run this again. If that driver is gone (killed, node lost), its hold goes stale "
            f"{stale_s:g} s after its last heartbeat, in about {max(0.0, stale_s - age):.0f} s; "
            f"`qkvsearch resume {exp}` then takes it over.")
        self.holder = holder


# ------------------------------------------------------------------------------------------- holding
class DriverLease:
    """with DriverLease.acquire(exp, command) as lease: ...  holds ``exp`` for this process: a heartbeat
    thread renews the lease every renew_every_s; on exit (any exit: return, exception, KeyboardInterrupt)
    the thread stops and the lease is deleted, if it is still this driver's."""

    def __init__(self, exp: str, store, holder: Holder, version: str, stale_s: float):
        self.exp, self.holder, self.stale_s = exp, holder, stale_s
        self._store, self._version = store, version
        self._lock = threading.Lock()  # one change at a time: heartbeat thread vs release
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="qkvsearch-driver-lease", daemon=True)
        self.lost = False  # another driver took the lease over (this one went unheard for stale_s)

    @classmethod
    def acquire(cls, exp: str, command: str, job: str | None = None) -> DriverLease:
        """Create the lease, or take over a stale one; CampaignHeld when a live driver holds it."""
        stale_s = stale_after_s()
        store = open_store(exp, LEASE_FILE, stale_s)
        now = time.time()
        mine = Holder(socket.gethostname(), os.getpid(), now, now, command, job, stale_s, uuid.uuid4().hex)
        for attempt in range(ATTEMPTS):  # another taker mid-change (milliseconds): look again shortly
            if attempt:
                time.sleep(random.uniform(0.01, 0.05))
            version = store.create(mine.encode())
            if version is not None:
                return cls(exp, store, mine, version, stale_s)
            current = store.read()
            if current is None:
                continue
            holder = _decode(current[0])
            if holder is not None and not holder.is_stale():
                raise CampaignHeld(exp, holder)
            version = store.replace(mine.encode(), current[1])
            if version is not None:
                who = holder.describe() if holder else "an unreadable lease"
                log.warning(f"took over the stale hold on {exp} ({who})")
                return cls(exp, store, mine, version, stale_s)
        raise LeaseStorageError(f"{exp}/{LEASE_FILE}: other drivers keep changing the lease as this one "
                                f"reads it ({ATTEMPTS} tries); try again")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def renew(self) -> bool:
        """Write a new heartbeat; False when the lease is no longer this driver's."""
        with self._lock:
            if self.lost or self._stop.is_set():
                return not self.lost
            beat = Holder(**{**asdict(self.holder), "heartbeat_at": time.time()})
            version = self._store.replace(beat.encode(), self._version)
            if version is None:
                self.lost = True
                log.error(f"{self.exp}: this driver's hold was taken over by another driver (no heartbeat "
                          f"for {self.stale_s:g} s: storage unreachable or the process paused); "
                          f"`qkvsearch status {self.exp}` names it")
                return False
            self.holder, self._version = beat, version
            return True

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if self.lost:
                return
            try:
                self.lost = not self._store.delete(self._version)
            except Exception as exc:  # noqa: BLE001  (how the driver ended matters more than its lease)
                log.warning(f"{self.exp}: the driver's lease was not removed ({reason(exc)}); it goes stale "
                            f"{self.stale_s:g} s after its last heartbeat")

    def clear_folder(self) -> None:
        """Remove everything in the campaign folder but the lease (`launch --overwrite`)."""
        fs, root = open_location(self.exp)
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
            if info.base_name == LEASE_FILE or info.base_name.startswith(f".{LEASE_FILE}."):  # its claims, temps
                continue
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(info.path)
            else:
                fs.delete_file(info.path)

    def _beat(self) -> None:
        every = renew_every_s(self.stale_s)
        while not self._stop.wait(every):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # noqa: BLE001  (storage away for a moment: the next beat tries again)
                log.warning(f"{self.exp}: driver heartbeat not written ({reason(exc)}); retrying in {every:g} s")
