"""Experiment trackers a campaign feeds from its driver: MLflow, Weights & Biases, TensorBoard, and an Optuna
study for optuna-dashboard (the campaign file's ``tracking`` section, spaces.tracking; `--track NAME`).

    TrackingCallback (fanout)  Tune's trial events -> each tracker (base.Tracker), failures isolated
    mlflow_tracker, wandb_tracker, tensorboard_tracker, optuna_tracker: one module per tracker
"""
from __future__ import annotations

import importlib.util

from qkvsearch.search.campaign.tracking.mlflow_tracker import MLflowTracker
from qkvsearch.search.campaign.tracking.optuna_tracker import OptunaTracker, study_storage
from qkvsearch.search.campaign.tracking.tensorboard_tracker import TensorBoardTracker
from qkvsearch.search.campaign.tracking.wandb_tracker import WandbTracker
from qkvsearch.spaces import SpecError

TRACKERS = {t.name: t for t in (MLflowTracker, WandbTracker, TensorBoardTracker, OptunaTracker)}
# tracker -> (the modules it imports, the extra that installs them)
PACKAGES = {"mlflow": (("mlflow",), "mlflow"), "wandb": (("wandb",), "wandb"),
            "tensorboard": (("tensorboard",), "tensorboard"), "optuna": (("optuna",), "optuna-dashboard")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules (None), or a module without spec
        return False


def check_trackers(spec) -> None:
    """SpecError naming each tracker of the spec whose package is not installed, with the install hint."""
    problems = []
    for name in spec.tracking:
        modules, extra = PACKAGES[name]
        missing = [m for m in modules if not _installed(m)]
        if missing:
            problems.append(f"tracking.{name}: needs the {', '.join(missing)} package, which is not installed: "
                            f"pip install 'qkvsearch[{extra}]'")
    if problems:
        raise SpecError(problems, spec.source)


def track_more(exp: str, spec, names) -> object:
    """A resumed campaign's spec with the trackers ``names`` added (`resume --track`); the campaign file keeps
    them, so later resumes feed them too. ``spec`` itself when nothing is added."""
    from qkvsearch.search.records.layout import CAMPAIGN_FILE, read_campaign
    from qkvsearch.spaces.tracking import add_trackers
    from qkvsearch.storage import write_json

    if not names or all(n in spec.tracking for n in names):
        return spec
    spec = add_trackers(spec, names)
    campaign = read_campaign(exp)
    campaign["spec"] = spec.to_dict()
    write_json(f"{exp}/{CAMPAIGN_FILE}", campaign)
    return spec


def tracking_callbacks(spec, exp: str, recorder, code_version, study_in_storage: bool = False) -> list:
    """[the TrackingCallback] when the spec has trackers, else []: for Tune's callback list, after the recorder."""
    if not spec.tracking:
        return []
    from qkvsearch.search.campaign.tracking.fanout import TrackingCallback

    return [TrackingCallback(spec, exp, recorder, code_version, study_in_storage)]


__all__ = ["TRACKERS", "check_trackers", "study_storage", "track_more", "tracking_callbacks"]
