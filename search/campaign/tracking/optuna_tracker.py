"""Optuna: the campaign as an Optuna study that optuna-dashboard shows while the campaign runs.

Storage: a journal file (default ``<exp>/tracking/optuna.journal``; `optuna-dashboard <file>` opens it) or
an RDB URL (``sqlite:///...``, ``postgresql://...``); a relative path or SQLite file lies inside the campaign
folder (spaces.tracking.tracker_location), wherever the driver was started. The study is named after the
campaign, with one direction per objective.

Optuna-searched campaigns (random, tpe, nsga2...): the storage *is* the searcher's study
(search.campaign.assemble.build_search's ``storage``): the searcher asks and tells there, and a resumed
campaign's searcher reopens it there. This
tracker then only annotates each trial (user attributes: trial_id, trial_name, status, duplicate_of,
error, checkpoint_path) while it runs; Optuna's own state says COMPLETE, PRUNED (stopped early) or FAIL.
Grid campaigns (and a study added on resume): the tracker adds each trial (a duplicate: its original stands
for it; an infeasible one as FAIL) to the study when it
ends, its grid point as parameters and its objectives (last epoch, else cost) as values.
"""
from __future__ import annotations

import os
import warnings

from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.tracking.base import Tracker, last_line, numeric
from qkvsearch.search.searchers.optuna_samplers import TRIAL_ID_ATTR
from qkvsearch.spaces import dimensions
from qkvsearch.spaces.tracking import tracker_location

JOURNAL = "optuna.journal"


def storage_location(settings, exp: str) -> str:
    """The study's storage: the setting as spaces.tracking resolves it, else the journal in the campaign folder."""
    given = settings.get("storage")
    return tracker_location("optuna", given, exp) if given else os.path.join(exp, "tracking", JOURNAL)


def open_storage(location: str):
    """An RDB URL -> RDBStorage; a file path -> a JournalStorage on that file (its folder created)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if "://" in location:
        return optuna.storages.RDBStorage(location)
    path = os.path.abspath(location)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(path))


def study_storage(campaign: OpenedCampaign):
    """The storage an Optuna searcher's study is to live in, or None (no optuna tracker, or a grid)."""
    settings = campaign.spec.tracking.get("optuna")
    if settings is None or campaign.spec.search.algorithm == "grid":
        return None
    return open_storage(storage_location(settings, campaign.exp))


class OptunaTracker(Tracker):
    name = "optuna"
    threaded = False  # annotations must reach a trial before the searcher tells it (Tune tells it first)

    def start(self) -> None:
        import optuna

        self.optuna = optuna
        storage = open_storage(storage_location(self.info.settings, self.info.exp))
        objectives = self.info.spec.get("objectives") or []
        self.metrics = [o["metric"] for o in objectives]
        directions = ["maximize" if o["mode"] == "max" else "minimize" for o in objectives]
        self.study = optuna.create_study(storage=storage, study_name=self.info.name, directions=directions,
                                         load_if_exists=True)
        self.own = self.state.setdefault("own_study", not self.info.study_in_storage)
        self.study.set_user_attr("code_version", str(self.info.code_version))
        self.study.set_user_attr("objectives", self.metrics)
        with warnings.catch_warnings():  # ExperimentalWarning: the names optuna-dashboard shows on its axes
            warnings.simplefilter("ignore")
            self.study.set_metric_names(self.metrics)
        self.found: dict[str, int] = {}

    # -- the searcher's study: annotate its trials ----------------------------------------------
    def _annotate(self, trial: dict, attrs: dict) -> None:
        if self.own:
            return
        number = self.found.get(trial["trial_id"])
        if number is None:
            for t in self.study.get_trials(deepcopy=False):
                if t.user_attrs.get(TRIAL_ID_ATTR) == trial["trial_id"]:
                    number = self.found[trial["trial_id"]] = t._trial_id
        if number is None:
            return
        storage = self.study._storage
        if storage.get_trial(number).state.is_finished():
            return  # told already: Optuna's state holds the outcome
        for key, value in attrs.items():
            storage.set_trial_user_attr(number, key, value)

    def on_trial_start(self, trial: dict) -> None:
        self._annotate(trial, {"trial_name": trial["trial_name"],
                               **{f"cost_{k}": v for k, v in numeric(trial.get("cost") or {}).items()}})

    def on_trial_result(self, trial: dict) -> None:
        attrs = {} if trial["status"] == "running" else {"status": trial["status"]}  # running: on_epoch decides
        for key in ("duplicate_of", "checkpoint_path"):
            if trial.get(key):
                attrs[key] = str(trial[key])
        if trial.get("error"):
            attrs["error"] = last_line(trial["error"])
        self._annotate(trial, attrs)

    def on_epoch(self, trial: dict, epoch: dict) -> None:
        done = int(epoch["epoch"])  # the last planned epoch makes a trial completed (the recorder's rule)
        self._annotate(trial, {"epochs_done": done, **({"status": "completed"} if done >= int(
            trial.get("epochs_planned") or 0) else {})})

    # -- an own study: add each trained trial when it ends --------------------------------------
    def on_trial_end(self, trial: dict) -> None:
        memo = self.trial_state(trial)
        if not self.own or trial["status"] == "duplicate" or memo.get("added"):
            return
        self.study.add_trial(self._frozen(trial))
        memo["added"] = True

    def _frozen(self, trial: dict):
        TS = self.optuna.trial.TrialState
        last = trial["epochs"][-1] if trial.get("epochs") else {}
        cost = trial.get("cost") or {}
        values = [last.get(m, cost.get(m)) for m in self.metrics]
        state = TS.COMPLETE if trial["status"] == "completed" and None not in values else (
            TS.PRUNED if trial["status"] == "stopped_early" else TS.FAIL)
        params, dists = self._params(trial["config"])
        attrs = {TRIAL_ID_ATTR: trial["trial_id"], "trial_name": trial["trial_name"], "status": trial["status"],
                 **{f"cost_{k}": v for k, v in numeric(cost).items()}}
        if trial.get("checkpoint_path"):
            attrs["checkpoint_path"] = str(trial["checkpoint_path"])
        if trial.get("error"):
            attrs["error"] = last_line(trial["error"])
        inter = {}
        if len(self.metrics) == 1:
            inter = {int(e["epoch"]): e[self.metrics[0]] for e in trial.get("epochs") or [] if self.metrics[0] in e}
        return self.optuna.trial.create_trial(
            state=state, values=[float(v) for v in values] if state == TS.COMPLETE else None, params=params,
            distributions=dists, user_attrs=attrs, intermediate_values=inter)

    def _params(self, config: dict) -> tuple[dict, dict]:
        """The searched keys' values and their distributions (the space's choices, or its ranges)."""
        from qkvsearch.spaces import load_campaign

        space = getattr(self, "_space", None) or load_campaign(self.info.spec, check_names=False).space
        self._space = space
        D = self.optuna.distributions
        params, dists = {}, {}
        for key in space.keys:
            value = config.get(key)
            if value is None:
                continue
            dim = space.dimension(key)
            if dim is not None and not dim.enumerable:
                cls = D.IntDistribution if dim.kind == "int" else D.FloatDistribution
                dists[key] = cls(dim.low, dim.high, log=dim.log)
            else:
                choices = [v for v in dimensions.possible_values(key, space.dimensions, space.variants)
                           if v is not dimensions.ABSENT]
                choices = list(dict.fromkeys(choices)) if value in choices else [value]
                dists[key] = D.CategoricalDistribution(choices)
            params[key] = value
        return params, dists

    def on_campaign_progress(self, progress: dict) -> None:
        self.study.set_user_attr("front_size", len(progress["front"]))
        if progress.get("hypervolume") is not None:
            self.study.set_user_attr("hypervolume", progress["hypervolume"])
