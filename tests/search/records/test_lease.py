"""The driver lease (search.records.lease) without Ray: on a local folder and on a real S3-protocol server
(moto on 127.0.0.1), a live hold refuses a second driver, naming it; the heartbeat renews it; a stale hold
is taken over by exactly one of several drivers racing for it; the old holder then neither renews nor
deletes the new one's lease."""
import io
import json
import os
import socket
import sys
import threading
import time

import pytest
from helpers.campaign_files import write_campaign

from qkvsearch.search.cli import EXIT_OK, main
from qkvsearch.search.monitor.progress import read_progress
from qkvsearch.search.monitor.status import status_table
from qkvsearch.search.monitor.terminal import TerminalView
from qkvsearch.search.records.lease import (
    LEASE_FILE,
    RENEW_PER_STALE,
    STALE_ENV,
    STALE_S,
    CampaignHeld,
    DriverLease,
    Holder,
    LeaseStorageError,
    read_lease,
    renew_every_s,
    stale_after_s,
)
from qkvsearch.spaces.errors import BadInput

BUCKET = "qkv-leases"


def _race(exp: str, n: int) -> tuple[list[DriverLease], list[BaseException]]:
    """n drivers acquiring exp at the same moment (threads behind a barrier) -> (winners, refusals). A
    winner's heartbeat starts at once, as a driver's does."""
    barrier, won, refused = threading.Barrier(n), [], []

    def take(i):
        barrier.wait()
        try:
            won.append(DriverLease.acquire(exp, f"taker {i}").__enter__())  # a winner beats at once
        except BaseException as exc:  # noqa: BLE001  (collected and checked below)
            refused.append(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def _wait_stale(exp: str, timeout: float = 10) -> float:
    """Seconds until read_lease(exp) calls the hold stale."""
    start = time.monotonic()
    while not read_lease(exp).stale:
        assert time.monotonic() - start < timeout, "the hold never went stale"
        time.sleep(0.02)
    return time.monotonic() - start


def test_the_stale_limit_is_declared_once_and_checked(monkeypatch):
    monkeypatch.delenv(STALE_ENV, raising=False)
    assert stale_after_s() == STALE_S and renew_every_s(STALE_S) == STALE_S / RENEW_PER_STALE
    monkeypatch.setenv(STALE_ENV, "2.5")
    assert stale_after_s() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(STALE_ENV, bad)
        with pytest.raises(BadInput, match=f"{STALE_ENV}: expected a number of seconds > 0, given '{bad}'"):
            stale_after_s()


def test_a_second_driver_is_refused_naming_the_live_one(tmp_path):
    exp = str(tmp_path / "results" / "c1")
    with DriverLease.acquire(exp, "qkvsearch resume c1") as first:
        assert sorted(os.listdir(exp)) == [LEASE_FILE]
        held = json.loads((tmp_path / "results" / "c1" / LEASE_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        assert held["command"] == "qkvsearch resume c1" and held["stale_s"] == STALE_S
        with pytest.raises(CampaignHeld) as refused:
            DriverLease.acquire(exp, "qkvsearch launch c1.yaml --overwrite")
        text = str(refused.value)
        assert isinstance(refused.value, BadInput)
        assert f"host {socket.gethostname()}, pid {os.getpid()}" in text and "last heartbeat 0 s ago" in text
        assert "command: qkvsearch resume c1" in text and f"kill -TERM {os.getpid()}" in text
        assert f"stale {STALE_S:g} s after its last heartbeat" in text and f"qkvsearch resume {exp}" in text
        state = read_lease(exp)
        assert state.live and state.holder.token == first.holder.token
        assert state.line().startswith(f"driver: live, host {socket.gethostname()}, pid {os.getpid()}")
    assert not (tmp_path / "results").exists()  # the lease was all it wrote: released, nothing is left
    assert read_lease(str(tmp_path)).line() == "driver: none"


def test_the_heartbeat_renews_and_a_stale_hold_goes_to_exactly_one_taker(tmp_path, monkeypatch):
    # The live hold's limit is long enough that no load on the machine stops its heartbeat for that long; the
    # killed one's short; the race's winner holds for the rest of the test.
    monkeypatch.setenv(STALE_ENV, "2")  # heartbeat every 0.33 s
    exp = str(tmp_path / "c2")
    with DriverLease.acquire(exp, "first") as first:
        beat = first.holder.heartbeat_at
        time.sleep(2.4)  # longer than the stale limit: only the heartbeat keeps it live
        assert read_lease(exp).holder.heartbeat_at > beat and read_lease(exp).live
        with pytest.raises(CampaignHeld):
            DriverLease.acquire(exp, "second")

    monkeypatch.setenv(STALE_ENV, "0.6")
    dead = DriverLease.acquire(exp, "killed")  # never entered: no heartbeat, as a SIGKILLed driver's
    assert 0.4 < _wait_stale(exp) < 5  # at its own limit, not the default's (STALE_S)
    assert "stale hold" in read_lease(exp).line() and "stale after 0.6 s" in read_lease(exp).line()
    monkeypatch.setenv(STALE_ENV, "60")
    won, refused = _race(exp, 8)
    assert len(won) == 1 and len(refused) == 7, refused
    assert all(isinstance(r, CampaignHeld) and r.holder.token == won[0].holder.token for r in refused)
    assert not dead.renew() and dead.lost  # taken over: it no longer writes
    dead.release()
    assert read_lease(exp).holder.token == won[0].holder.token  # nor deletes the new holder's lease
    won[0].release()
    assert read_lease(exp).holder is None and os.listdir(exp) == []


def test_an_unreadable_lease_is_stale_and_is_taken_over(tmp_path):
    (tmp_path / LEASE_FILE).write_text("{not json")
    state = read_lease(str(tmp_path))
    assert state.stale and not state.live and "lease file unreadable" in state.line()
    with DriverLease.acquire(str(tmp_path), "next") as lease:
        assert read_lease(str(tmp_path)).holder.token == lease.holder.token


def test_overwrite_clears_the_campaign_but_keeps_the_lease(tmp_path):
    (tmp_path / "qs_trials").mkdir()
    (tmp_path / "qs_trials" / "t1.json").write_text("{}")
    (tmp_path / "qs_campaign.json").write_text("{}")
    with DriverLease.acquire(str(tmp_path), "qkvsearch launch --overwrite") as lease:
        lease.clear_folder()
        assert os.listdir(tmp_path) == [LEASE_FILE] and read_lease(str(tmp_path)).live
    assert os.listdir(tmp_path) == []  # the folder was there before: it stays


def test_a_bucket_without_boto3_or_an_unsupported_scheme_is_refused(s3, monkeypatch):
    s3.create_dir(BUCKET)
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if not installed
    with pytest.raises(LeaseStorageError, match=rf"s3://{BUCKET}/c.*`pip install boto3`"):
        DriverLease.acquire(f"s3://{BUCKET}/c", "launch")
    with pytest.raises(LeaseStorageError, match=r"storage: expected a local path, s3:// or gs://"):
        DriverLease.acquire("mock:///c", "launch")


def test_on_a_bucket_one_conditional_create_wins_and_a_stale_hold_is_taken_over(s3, monkeypatch):
    pytest.importorskip("boto3")
    s3.create_dir(BUCKET)
    exp = f"s3://{BUCKET}/campaigns/c3"
    for _ in range(5):  # two drivers at once, five times: exactly one wins each time
        won, refused = _race(exp, 2)
        assert len(won) == 1 and len(refused) == 1 and isinstance(refused[0], CampaignHeld), refused
        assert read_lease(exp).holder.token == won[0].holder.token
        won[0].release()
        assert read_lease(exp).holder is None

    # Each hold goes stale by its own limit: the live one's is long enough that no load on the machine stops
    # its heartbeat for that long, the killed one's short; the race's winners hold for the rest of the test.
    monkeypatch.setenv(STALE_ENV, "3")  # heartbeat every 0.5 s
    with DriverLease.acquire(exp, "first") as first:
        time.sleep(1.2)
        assert read_lease(exp).live and read_lease(exp).holder.heartbeat_at > first.holder.started_at
        with pytest.raises(CampaignHeld, match=r"campaign held by a live driver \(host "):
            DriverLease.acquire(exp, "second")
    monkeypatch.setenv(STALE_ENV, "0.9")
    dead = DriverLease.acquire(exp, "killed")
    _wait_stale(exp)
    monkeypatch.setenv(STALE_ENV, "60")
    won, refused = _race(exp, 4)
    assert len(won) == 1 and all(isinstance(r, CampaignHeld) for r in refused) and len(refused) == 3
    assert not dead.renew() and dead.lost
    dead.release()
    assert read_lease(exp).holder.token == won[0].holder.token
    won[0].release()
    assert read_lease(exp).holder is None


@pytest.mark.parametrize("command", ["resume", "launch --overwrite"])
def test_a_driver_beside_a_live_one_is_refused_before_it_imports_ray(tmp_path, command):
    """The refusal comes first: the command ends at once instead of after seconds of imports, well within
    the hold's stale limit even on a loaded machine."""
    import subprocess

    from helpers.live_campaign import tiny_spec, write_spec

    raw = tiny_spec(tmp_path / "results", "c1", workers=1, epochs=1, variants=[{"embedding": "linear"}])
    exp = tmp_path / "results" / "c1"
    records = write_campaign(exp, ["completed"], spec=raw, name="c1")
    _other_driver(exp, heartbeat_age_s=1)
    spec = write_spec(tmp_path / "c1.yaml", raw)
    args = [str(exp)] if command == "resume" else [str(spec), "--overwrite"]
    code = ("import sys; from qkvsearch.search.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, sorted(m for m in ('ray', 'qkvsearch.search.campaign.launch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, command.split()[0], *args], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split("\n")[-2] == "2 []", done.stdout + done.stderr[-3000:]
    assert "campaign held by a live driver (host node-7, pid 4242" in done.stderr
    assert len(list((exp / "qs_trials").glob("*.json"))) == len(records)  # nothing deleted


def _other_driver(exp, heartbeat_age_s: float) -> None:
    """The lease of a driver on another node, its last heartbeat heartbeat_age_s ago."""
    now = time.time()
    other = Holder("node-7", 4242, now - 100, now - heartbeat_age_s, "qkvsearch resume x", None, STALE_S, "t")
    (exp / LEASE_FILE).write_bytes(other.encode())


def test_status_and_watch_show_whether_a_driver_is_live(tmp_path, capsys):
    write_campaign(tmp_path, ["completed", "running"])
    exp = str(tmp_path)
    assert status_table(exp).splitlines()[0] == "driver: none"
    _other_driver(tmp_path, 3)
    line = status_table(exp).splitlines()[0]
    assert line.startswith("driver: live, host node-7, pid 4242, started ") and "last heartbeat 3 s ago" in line
    assert main(["watch", exp, "--once"]) == EXIT_OK
    assert "driver: live, host node-7, pid 4242" in capsys.readouterr().out

    out = io.StringIO()
    view = TerminalView(out, live=False)
    view.show(read_progress(exp))
    _other_driver(tmp_path, 5)  # a newer heartbeat age alone prints nothing new
    view.show(read_progress(exp))
    _other_driver(tmp_path, STALE_S + 30)  # the driver died
    view.show(read_progress(exp))
    driver_lines = [line for line in out.getvalue().splitlines() if line.startswith("driver: ")]
    assert len(driver_lines) == 2 and driver_lines[0].startswith("driver: live, host node-7"), driver_lines
    assert driver_lines[1].startswith("driver: none live; stale hold (host node-7, pid 4242")
    assert f"last heartbeat {STALE_S + 30:.0f} s ago; stale after {STALE_S:g} s" in status_table(exp)

    (tmp_path / LEASE_FILE).unlink()
    with DriverLease.acquire(exp, "this one"):  # a driver's own view does not announce itself
        out = io.StringIO()
        TerminalView(out, live=False).show(read_progress(exp))
        assert "driver:" not in out.getvalue() and status_table(exp).startswith("driver: live")
