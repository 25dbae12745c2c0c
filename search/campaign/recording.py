"""The trial recorder as a Ray Tune callback: Tune calls it in the campaign's driver process."""
from __future__ import annotations

from ray.tune import Callback

from qkvsearch import ray_private
from qkvsearch.search.campaign.heap import release_freed
from qkvsearch.search.records.recorder import Recorder


class TrialRecorder(Recorder, Callback):
    __doc__ = Recorder.__doc__

    def on_step_begin(self, iteration, trials, **info):
        if self.forget_ended():  # every callback (trackers, retention) has seen the trials that ended before
            release_freed()      # and what their passes over the records freed

    def on_trial_complete(self, iteration, trials, trial, **info):
        super().on_trial_complete(iteration, trials, trial, **info)
        ray_private.drop_result_statistics(trial)   # the record holds its results

    def on_trial_error(self, iteration, trials, trial, **info):
        super().on_trial_error(iteration, trials, trial, **info)
        ray_private.drop_result_statistics(trial)
