"""Tune's experiment state saved whenever trials were added or ended: a mixin every campaign scheduler
(search.scheduling.tune_schedulers) has. Tune otherwise saves that state at most every 10 s, and a driver
killed in between restores an older list of trials and an older searcher."""
from __future__ import annotations

import math
import time

from qkvsearch import ray_private

CHEAP_SAVE_S = 0.5   # a forced save this quick is made at every trial change
SAVE_SHARE = 0.05    # slower ones: at most this share of the driver's time (Tune's rule for its own saves)


class CheckpointsTrialChanges:
    """Scheduler mixin: Tune saves its experiment state (the trials, with the searcher's state: what
    ``Tuner.restore`` starts from) before it starts a trial, whenever trials were added or ended since.

    Tune saves that state at most every 10 s (longer on large experiments). A driver killed in between
    restores an older state: a trial added since is unknown to it (its searcher, restored as it was,
    suggests it again under a new id, which trains from scratch, and the trial count goes back), and a
    trial that ended since runs again. The scheduler is the one extension point Tune hands its controller,
    at every step (``choose_trial_to_run``, called before any trial starts). Each save writes the state and
    copies Tune's staging folder to the campaign's storage, once per trial added or ended.

    Every save writes every trial (about 33 KB each: benchmarks/README.md, "Driver scale"), so saving at every
    change writes O(N²) bytes over a campaign. A save that took under ``CHEAP_SAVE_S`` is made at every change
    (a campaign of a few thousand trials: always); a slower one only once ``1 / SAVE_SHARE`` times its duration
    has passed since it, Tune's own rule for its periodic saves, so forced saves take at most that share of the
    driver's time and the bytes they write grow with the campaign's duration, not with N². Past that size a
    driver killed between two saves restores the older state (the cost the first paragraph names)."""

    _trials_changed = False  # a trial added or ended since the last save
    _saved_at = -math.inf    # time.monotonic() when the last save ended
    _save_s = 0.0            # how long it took

    def on_trial_add(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_error(tune_controller, trial)

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        self._trials_changed = True
        super().on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._trials_changed = True
        super().on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller):
        if self._trials_changed and self._save_due():
            started = time.monotonic()
            _save_experiment(tune_controller)
            self._saved_at = time.monotonic()
            self._save_s, self._trials_changed = self._saved_at - started, False
        return super().choose_trial_to_run(tune_controller)

    def _save_due(self) -> bool:
        return save_due(self._save_s, time.monotonic() - self._saved_at)


def save_due(last_save_s: float, since_s: float) -> bool:
    """Whether a forced save is made now, the last one having taken ``last_save_s`` and ended ``since_s`` ago."""
    return last_save_s < CHEAP_SAVE_S or since_s >= last_save_s / SAVE_SHARE


def _save_experiment(tune_controller) -> None:
    """Tune's experiment state saved and copied to storage now. Tune hands schedulers a wrapper that warns
    about attributes outside a short list; the controller behind it has ``checkpoint(force, wait)``. No
    controller (a scheduler driven by hand): nothing."""
    ray_private.save_experiment_now(tune_controller)
