"""A campaign view (search.monitor: ``show(progress)``, ``close()``) that keeps what it was shown."""
from __future__ import annotations


class Recorder:
    def __init__(self):
        self.seen, self.closed = [], False

    def show(self, progress):
        self.seen.append(progress)

    def close(self):
        self.closed = True
