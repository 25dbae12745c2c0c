"""Experiment trackers a campaign feeds from its driver: MLflow, Weights & Biases, TensorBoard, and an Optuna
study for optuna-dashboard (the campaign file's ``tracking`` section, spaces.tracking; `--track NAME`).

    TrackingCallback (fanout)  Tune's trial events -> each tracker (base.Tracker), failures isolated
    mlflow_tracker, wandb_tracker, tensorboard_tracker, optuna_tracker: one module per tracker
"""
from __future__ import annotations

import importlib.util

from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.tracking.base import tracker_class
from qkvsearch.search.campaign.tracking.optuna_tracker import study_storage
from qkvsearch.spaces import SpecError
from qkvsearch.spaces.tracking import TRACKERS


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules (None), or a module without spec
        return False


def check_trackers(spec) -> None:
    """SpecError naming each tracker of the spec whose package is not installed, with the install hint."""
    problems = []
    for name in spec.tracking:
        missing = [m for m in TRACKERS[name].modules if not _installed(m)]
        if missing:
            problems.append(f"tracking.{name}: needs the {', '.join(missing)} package, which is not installed: "
                            f"pip install 'qkvsearch[{TRACKERS[name].extra}]'")
    if problems:
        raise SpecError(problems, spec.source)


def track_more(spec, names) -> object:
    """``spec`` with the trackers ``names`` added (`resume --track`; the resumed driver keeps it in the campaign
    file, so later resumes feed them too); ``spec`` itself when each is on already."""
    from qkvsearch.spaces.tracking import add_trackers

    return spec if all(n in spec.tracking for n in names) else add_trackers(spec, names)


def tracking_callbacks(campaign: OpenedCampaign, recorder, code_version, study_in_storage: bool = False) -> list:
    """[the TrackingCallback] when the spec has trackers, else []: for Tune's callback list, after the recorder."""
    if not campaign.spec.tracking:
        return []
    from qkvsearch.search.campaign.tracking.fanout import TrackingCallback

    return [TrackingCallback(campaign, recorder, code_version, study_in_storage)]


__all__ = ["check_trackers", "study_storage", "track_more", "tracker_class", "tracking_callbacks"]
