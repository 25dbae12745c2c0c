"""A campaign view (search.monitor: ``show(progress)``, ``close()``; a resume's ``skip_finished(exp)``) that
keeps what it was shown."""
from __future__ import annotations


class Recorder:
    def __init__(self):
        self.seen, self.closed, self.skipped = [], False, []

    def show(self, progress):
        self.seen.append(progress)

    def skip_finished(self, exp):
        """A resume's: the trials of ``exp`` that had ended are not to be announced again."""
        self.skipped.append(exp)

    def close(self):
        self.closed = True
