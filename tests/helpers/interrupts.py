"""A test session stopped by SIGTERM ends as one stopped by Ctrl-C: the running test unwinds (its `finally`
and `with` blocks stop what it started), fixtures are torn down, and the drivers a test started and had not
stopped yet (helpers.live_campaign.started) are stopped with their Ray before the session ends.

Registered by tests/conftest.py; a pytest run elsewhere loads it with ``-p helpers.interrupts``."""
from __future__ import annotations

import signal
import threading

import pytest


def _interrupt(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one interruption: the cleanup it starts runs to its end
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    from helpers.live_campaign import stop_started

    left = stop_started()
    if left:
        print(f"\nstopped the drivers an interrupted test had started: pids {', '.join(map(str, left))}")
