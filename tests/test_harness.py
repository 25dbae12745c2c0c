"""The suite's own harness: a test session stopped by SIGTERM (a CI job's timeout, a `kill`) stops the drivers
its tests started, as Ctrl-C does (helpers.interrupts)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers.live_campaign import wait_for
from helpers.processes import running

TESTS = Path(__file__).resolve().parent

INNER = '''
import subprocess, sys, time
from pathlib import Path
from helpers.live_campaign import started

def test_a_driver_then_a_long_wait(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started(proc, str(tmp_path / "its-ray"))
    Path({mark!r}).write_text(str(proc.pid))
    time.sleep(600)
'''


def test_a_session_stopped_by_sigterm_stops_the_drivers_its_tests_started(tmp_path):
    mark = tmp_path / "driver.pid"
    (tmp_path / "test_inner.py").write_text(INNER.format(mark=str(mark)))
    # the inner session runs as written here, not with the options given to the outer one (PYTEST_ADDOPTS may
    # name options of plugins that only the outer session loads, as `make test`'s --record-durations)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "PYTHONPATH": str(TESTS)}
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "helpers.interrupts",
                                "-p", "no:cacheprovider", "test_inner.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the inner session starts pytest, imports the package and launches its driver: on a loaded machine that
        # takes minutes, so wait while the session runs (the bound is for a session that hangs without a driver)
        wait_for(lambda: mark.exists() and mark.read_text() or session.poll() is not None, 900,
                 "the inner test's driver")
        assert mark.exists(), f"the inner session ended before its driver started:\n{session.communicate()[0]}"
        pid = int(mark.read_text())
        session.send_signal(signal.SIGTERM)
        out, _ = session.communicate(timeout=120)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 2, out  # pytest's exit code for an interrupted session
    assert f"stopped the drivers an interrupted test had started: pids {pid}" in out, out
    try:   # killed by the session, then reaped by init once the session has ended
        wait_for(lambda: not running(pid), 60, "the driver's end")
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_test_file_the_durations_do_not_know_goes_out_first():
    from helpers.scheduling import expected_s, read_durations

    known = read_durations()
    assert known, "tests/durations.json is read"   # the record exists and parses
    longest = max(known.values())
    assert expected_s(known, "tests/search/test_brand_new.py") > longest
    assert expected_s({"a.py": 3.0}, "a.py") == 3.0
