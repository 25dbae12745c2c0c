"""The order in which `make test` hands test files to its two pytest-xdist processes (`--dist loadfile`).

xdist's loadfile hands files out by how many tests they hold and gives a process more while it still has two
tests to run, so one process could end up holding the last long files while the other sat idle. Here files
go out longest first, by their duration in the last recorded run (`DURATIONS`; a file not recorded there
goes first: it is new, and a new slow test is usually a campaign), and a process gets its next file only when
at most one test of its own is left: the one xdist holds back until it knows what runs next.

`pytest -n 2 --dist loadfile --record-durations` rewrites `DURATIONS` from its run.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"  # {test file: seconds}, repository-relative


def read_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):  # absent or damaged: every file counts as new
        return {}


def expected_s(durations: dict[str, float], scope: str) -> float:
    """How long a test file is expected to take: its recorded seconds, or, for a file the record does not know
    (new, or renamed), longer than any: it goes out first rather than last, where a slow one would hold the
    run's end."""
    return durations.get(scope, float("inf"))


class LongestFileFirst(LoadFileScheduling):
    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.durations = read_durations()

    def _expected_s(self, scope: str) -> float:
        return expected_s(self.durations, scope)

    def _assign_work_unit(self, node) -> None:
        longest = max(self.workqueue, key=self._expected_s)
        self.workqueue.move_to_end(longest, last=False)  # the base class hands out the first
        super()._assign_work_unit(node)

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:  # xdist's own rule gives more at 2
            return
        self._assign_work_unit(node)


class DurationRecorder:
    """Sums each test file's setup, call and teardown seconds as reports reach the controlling process."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if session.exitstatus == 0 and self.seconds:
            recorded = {**read_durations(), **{f: round(s, 1) for f, s in self.seconds.items()}}
            DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
