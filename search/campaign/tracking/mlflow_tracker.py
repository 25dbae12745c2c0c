"""MLflow: one run per trial (nested under one campaign run) in the campaign's experiment.

Default store: SQLite in the campaign folder (``sqlite:///<exp>/tracking/mlflow.db``). MLflow 3 refuses its
file store ("maintenance mode": creating an experiment there raises), and SQLite needs no server and no
network; `mlflow ui --backend-store-uri sqlite:///<exp>/tracking/mlflow.db` (full `mlflow` package) or any
MLflow client reads it. A ``tracking_uri`` that is a path is a SQLite store at that path, inside the campaign
folder when relative, as is a relative SQLite URL's file (spaces.tracking.tracker_location): never in the
working directory. A SQLite store's artifacts lie beside it, in ``mlflow-artifacts``.

Trial runs: params = the resolved config (names of spaces.keys, values as JSON spellings); metrics =
the cost at step 0 and every epoch's metrics at step = epoch; tags qkvsearch.status (completed,
stopped_early, duplicate, infeasible, failed...), qkvsearch.outcome (in words), qkvsearch.duplicate_of,
qkvsearch.checkpoint. Campaign run: the spec (campaign.json), the code version, the front (front.json) and
its hypervolume as they change, and the report files at the end.
"""
from __future__ import annotations

import os
import time

from qkvsearch.search.campaign.tracking.base import Tracker, last_line, numeric, outcome, param_text, trained
from qkvsearch.spaces.tracking import tracker_location

TAG = "qkvsearch."


def default_uri(exp: str) -> str:
    return f"sqlite:///{os.path.join(exp, 'tracking', 'mlflow.db')}"


class MLflowTracker(Tracker):
    name = "mlflow"

    def start(self) -> None:
        # An unreachable server: MLflow retries each call with exponential back-off (minutes by default);
        # the campaign goes on meanwhile (the tracker has its own thread), but it gives up after these.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        from mlflow.tracking import MlflowClient

        uri = tracker_location("mlflow", given, self.info.exp) if (given := self.info.settings.get("tracking_uri")) \
            else default_uri(self.info.exp)
        if uri.startswith("sqlite:///"):  # SQLite creates the file, not its folder
            os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = self._experiment(uri)
        run = self.state.get("campaign_run")
        if run is None:
            run = self.client.create_run(self.experiment, run_name=f"campaign {self.info.name}",
                                         tags={TAG + "kind": "campaign", TAG + "campaign": self.info.name,
                                               TAG + "code_version": str(self.info.code_version)}).info.run_id
            self.state["campaign_run"] = run
            self.client.log_dict(run, self.info.spec, "campaign.json")
        else:
            self.client.update_run(run, status="RUNNING")

    def _experiment(self, uri: str) -> str:
        name = self.info.settings.get("experiment") or self.info.name
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        artifacts = None
        if uri.startswith("sqlite:///"):  # beside the store: MLflow's default is the working directory
            artifacts = "file://" + os.path.join(os.path.dirname(uri[len("sqlite:///"):]), "mlflow-artifacts")
        return self.client.create_experiment(name, artifact_location=artifacts)

    def _run(self, trial: dict) -> str:
        memo = self.trial_state(trial)
        if "run" not in memo:
            from mlflow.entities import Metric, Param

            tags = {TAG + "kind": "trial", TAG + "trial_id": trial["trial_id"], TAG + "status": trial["status"],
                    "mlflow.parentRunId": self.state["campaign_run"]}
            memo["run"] = self.client.create_run(self.experiment, run_name=trial["trial_name"],
                                                 tags=tags).info.run_id
            now = int(time.time() * 1000)
            params = [Param(k, param_text(v)) for k, v in trial["config"].items()]
            cost = [Metric(k, v, now, 0) for k, v in numeric(trial.get("cost") or {}).items()]
            self.client.log_batch(memo["run"], metrics=cost, params=params)
        return memo["run"]

    def on_trial_start(self, trial: dict) -> None:
        run = self._run(trial)
        self.client.set_tag(run, TAG + "status", "running")
        self.client.update_run(run, status="RUNNING")

    def on_epoch(self, trial: dict, epoch: dict) -> None:
        from mlflow.entities import Metric

        run = self._run(trial)
        if self.new_epoch(trial, epoch):
            now, step = int(time.time() * 1000), int(epoch["epoch"])
            metrics = [Metric(k, v, now, step) for k, v in numeric(epoch).items() if k != "epoch"]
            self.client.log_batch(run, metrics=metrics)

    def on_trial_end(self, trial: dict) -> None:
        run = self._run(trial)
        tags = {TAG + "status": trial["status"], TAG + "outcome": outcome(trial)}
        if trial.get("duplicate_of"):
            tags[TAG + "duplicate_of"] = str(trial["duplicate_of"])
        if trial.get("error"):
            tags[TAG + "error"] = last_line(trial["error"], 4000)
        if trial.get("checkpoint_path"):
            tags[TAG + "checkpoint"] = str(trial["checkpoint_path"])
        if not trained(trial):
            tags["mlflow.note.content"] = f"Not trained: {outcome(trial)}."
        for key, value in tags.items():
            self.client.set_tag(run, key, value)
        failed = trial["status"] in ("failed", "diverged")
        self.client.set_terminated(run, status="FAILED" if failed else "FINISHED")

    def on_campaign_progress(self, progress: dict) -> None:
        from mlflow.entities import Metric

        run, now, step = self.state["campaign_run"], int(time.time() * 1000), int(progress["done"])
        metrics = [Metric("front_size", float(len(progress["front"])), now, step)]
        if progress.get("hypervolume") is not None:
            metrics.append(Metric("hypervolume", float(progress["hypervolume"]), now, step))
        self.client.log_batch(run, metrics=metrics)
        self.client.log_dict(run, {"objectives": progress["objectives"], "front": progress["front"]}, "front.json")

    def on_campaign_end(self, report: dict | None) -> None:
        run = self.state["campaign_run"]
        for path in (report or {}).values():
            self.client.log_artifact(run, path, "report")
        self.client.set_terminated(run, status="FINISHED" if report is not None else "KILLED")
