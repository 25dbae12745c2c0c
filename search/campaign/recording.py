"""The trial recorder as a Ray Tune callback: Tune calls it in the campaign's driver process."""
from __future__ import annotations

from ray.tune import Callback

from qkvsearch.search.records.recorder import Recorder


class TrialRecorder(Recorder, Callback):
    __doc__ = Recorder.__doc__

    def on_step_begin(self, iteration, trials, **info):
        self.forget_ended()  # every callback (trackers, retention) has seen the trials that ended before
