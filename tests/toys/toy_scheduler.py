"""A trial scheduler of the test's own, added as a user adds one: this builder and its rows in spaces.sections (its
name, and ``patience``, an option of its own: tests/test_extending.py). It stops a trial once its first objective
has not improved for ``patience`` epochs."""
from __future__ import annotations

from ray.tune.schedulers import TrialScheduler

from qkvsearch.search.scheduling.tune_schedulers import CampaignFIFOScheduler
from qkvsearch.spaces.sections import SCHEDULER_FIELDS


class PatientScheduler(CampaignFIFOScheduler):
    def __init__(self, metric: str, mode: str, patience: int):
        super().__init__()
        self.watched, self.sign, self.patience = metric, 1.0 if mode == "max" else -1.0, patience
        self.best: dict[str, tuple[float, int]] = {}   # trial id -> (its best value, epochs since)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        value = self.sign * float(result[self.watched])
        best, since = self.best.get(trial.trial_id, (float("-inf"), 0))
        self.best[trial.trial_id] = (value, 0) if value > best else (best, since + 1)
        return TrialScheduler.STOP if self.best[trial.trial_id][1] >= self.patience else TrialScheduler.CONTINUE


def patient(*, metrics, modes, section=None, **_) -> PatientScheduler:
    """The builder (spaces.sections.SCHEDULERS): the campaign's section holds ``patience`` (`simulate`: its default)."""
    patience = section.patience if section is not None else SCHEDULER_FIELDS["patience"].default
    return PatientScheduler(metrics[0], modes[0], patience)
