"""The tracker interface: what a campaign tells an experiment tracker, from its driver, once per event.

Events carry plain data, copied when they happen (a tracker may handle them later, on its own thread):
- trial: the trial's record as the recorder keeps it (search.records.recorder): trial_id, trial_name,
  status, config (the resolved config, keys of spaces.keys.RESOLVED_KEYS), cost, epochs, duplicate_of,
  error, checkpoint_path;
- epoch: one row of the trial's epochs file ({"epoch": n, metric: value...});
- progress: {"done": trials in a final status, "front": [{"trial", metric: value...}], "hypervolume",
  "objectives": [(metric, mode)]}, whenever the completed front changes;
- report: {file name: local path} of the report written at the end (pareto.html, pareto.csv), or None
  when the driver was stopped before the end.

`state` is the tracker's part of the campaign's tracking file (search.campaign.tracking.fanout): run ids
and the last epoch logged per trial, so that a resumed campaign continues the same runs and logs no
epoch twice. A tracker keeps it current; the fan-out saves it after each event.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass

from qkvsearch.search.records.layout import UNTRAINED_STATUSES
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.tracking import TRACKERS


@dataclass(frozen=True)
class CampaignInfo:
    name: str
    exp: str             # the campaign folder (local path)
    spec: dict           # spec.to_dict()
    code_version: str | None
    settings: dict       # this tracker's settings (spaces.tracking.TRACKERS)
    study_in_storage: bool = False  # optuna: the searcher's own study lives in the tracker's storage


class Tracker:
    """Base: every hook does nothing. Subclasses set `name` and override what they log."""

    name = "tracker"
    threaded = True      # handle events on a thread of its own (False: in Tune's loop, in order)

    def __init__(self, info: CampaignInfo, state: dict):
        self.info, self.state = info, state

    def start(self) -> None:
        """Open (or reopen, on resume) the campaign's own run."""

    def on_trial_start(self, trial: dict) -> None:
        pass

    def on_epoch(self, trial: dict, epoch: dict) -> None:
        pass

    def on_trial_result(self, trial: dict) -> None:
        """Any result that changed the record (a status reported by the trial, a checkpoint)."""

    def on_trial_end(self, trial: dict) -> None:
        pass

    def on_campaign_progress(self, progress: dict) -> None:
        pass

    def on_campaign_end(self, report: dict | None) -> None:
        pass

    def close(self) -> None:
        pass

    # -- helpers for subclasses ----------------------------------------------------------------
    def trial_state(self, trial: dict) -> dict:
        """This tracker's memo of a trial: {"run": id, "epoch": last logged, ...}, created empty."""
        return self.state.setdefault("trials", {}).setdefault(trial["trial_id"], {})

    def new_epoch(self, trial: dict, epoch: dict) -> bool:
        """Whether ``epoch`` is past the last one logged for the trial (a resumed trial reports its
        checkpoint's epochs again); marks it logged."""
        memo = self.trial_state(trial)
        n = int(epoch.get("epoch", 0))
        if n <= memo.get("epoch", 0):
            return False
        memo["epoch"] = n
        return True


def tracker_class(name: str) -> type[Tracker]:
    """The Tracker class of a tracker's row in spaces.tracking.TRACKERS (imported when asked for)."""
    module, _, cls = TRACKERS[name].home.partition(":")
    return getattr(importlib.import_module(module), cls)


def outcome(trial: dict) -> str:
    """A trial's final status in words: completed, stopped early, duplicate of <trial>, failed: <message>."""
    status = str(trial.get("status"))
    if status == "duplicate":
        return f"duplicate of {trial.get('duplicate_of')} (same configuration, not trained again)"
    if status == "stopped_early":
        return "stopped early by the scheduler"
    error = trial.get("error")
    if status in ("failed", "diverged", "infeasible") and error:
        return f"{status}: {last_line(error)}"
    return status


def last_line(text, limit: int = 500) -> str:
    lines = [s for s in str(text).strip().splitlines() if s.strip()]
    return (lines[-1] if lines else "")[:limit]


def trained(trial: dict) -> bool:
    """Whether a trial trains (duplicates and infeasible configurations do not)."""
    return trial.get("status") not in UNTRAINED_STATUSES


def numeric(values: dict) -> dict[str, float]:
    """The finite numbers of a flat dict (cost, an epoch row), as floats."""
    return {k: v for k, v in ((k, finite(v)) for k, v in values.items()) if v is not None}


def param_text(value) -> str:
    """A config value as a tracker parameter: the JSON spelling (null, true, 0.5, "fsne" -> fsne)."""
    return value if isinstance(value, str) else json.dumps(value)
