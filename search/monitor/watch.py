"""Reads a campaign's progress every few seconds and hands each snapshot to its views (the terminal
block, the campaign metrics): during `launch` / `resume` on a daemon thread beside Tune, and as the
whole of `qkvsearch watch`."""
from __future__ import annotations

import logging
import threading
import time

from qkvsearch.search.monitor.progress import Progress, read_progress

log = logging.getLogger(__name__)
INTERVAL_S = 2.0  # between reads of the records: a read of 100 trials' records takes milliseconds


class CampaignMonitor:
    """with CampaignMonitor(exp, views): ...  polls read_progress(exp) on a daemon thread; on exit one
    last snapshot reaches every view, then view.close(). A view has show(progress) and close()."""

    def __init__(self, exp, views, interval: float = INTERVAL_S):
        self.exp, self.views, self.interval = exp, list(views), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qkvsearch-monitor", daemon=True)
        self.last: Progress | None = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.poll()
        for view in self.views:
            view.close()
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> Progress | None:
        """One snapshot to every view. A read that fails (a record being written, storage away) is
        logged and skipped: watching never stops the campaign."""
        try:
            progress = read_progress(self.exp)
        except Exception as exc:  # noqa: BLE001  (the campaign must go on whatever the monitor meets)
            log.debug("progress of %s not read: %s", self.exp, exc)
            return None
        self.last = progress
        for view in self.views:
            try:
                view.show(progress)
            except Exception as exc:  # noqa: BLE001
                log.warning("campaign view %s failed: %s", type(view).__name__, exc)
        return progress


def watch(exp, view, interval: float = INTERVAL_S, until_ended: bool = True) -> Progress:
    """Show ``exp``'s progress every ``interval`` s until its driver records its end; -> the last
    snapshot. Reads the campaign file first, so a folder that is not a campaign fails at once."""
    progress = read_progress(exp)
    try:
        while True:
            view.show(progress)
            if progress.ended or not until_ended:
                return progress
            time.sleep(interval)
            progress = read_progress(exp)
    finally:
        view.close()
