"""Weights & Biases: one run per trial and one for the campaign, grouped under the campaign's name.

Mode offline (the default) writes run folders under ``<exp>/tracking/wandb/wandb/offline-run-*`` and
nothing leaves the machine; `wandb sync <folder>` uploads them later. A resumed trial continues its run
(same id, kept in the tracking file); offline, each driver writes a folder of its own under that id, which
`wandb sync` merges into the one run. Neither the environment nor the code nor system metrics are
collected (x_disable_meta, x_disable_stats, disable_git, save_code off).
"""
from __future__ import annotations

import os
import uuid

from qkvsearch.search.campaign.tracking.base import Tracker, last_line, numeric, outcome, trained


class WandbTracker(Tracker):
    name = "wandb"

    def start(self) -> None:
        import wandb

        self.wandb = wandb
        self.dir = os.path.join(self.info.exp, "tracking", "wandb")
        os.makedirs(self.dir, exist_ok=True)
        self.runs: dict[str, object] = {}
        memo = self.state.setdefault("campaign", {})
        memo.setdefault("run", uuid.uuid4().hex[:16])
        self.campaign = self._init(memo["run"], f"campaign {self.info.name}", "campaign",
                                   {"spec": self.info.spec, "code_version": self.info.code_version})

    def _init(self, run_id: str, name: str, job_type: str, config: dict, tags=()):
        s = self.info.settings
        settings = self.wandb.Settings(
            mode=s["mode"], silent=True, console="off", x_disable_stats=True, x_disable_meta=True,
            x_disable_machine_info=True, disable_git=True, save_code=False, x_save_requirements=False,
            disable_job_creation=True)
        return self.wandb.init(project=s.get("project") or self.info.name, entity=s.get("entity"), id=run_id,
                               name=name, group=self.info.name, job_type=job_type, config=config, tags=list(tags),
                               dir=self.dir, resume="allow", reinit="create_new", settings=settings)

    def _run(self, trial: dict):
        run = self.runs.get(trial["trial_id"])
        if run is None:
            memo = self.trial_state(trial)
            memo.setdefault("run", uuid.uuid4().hex[:16])
            run = self._init(memo["run"], trial["trial_name"], "trial", dict(trial["config"]))
            run.summary.update({"trial_id": trial["trial_id"], **{f"cost/{k}": v for k, v in
                                                                   numeric(trial.get("cost") or {}).items()}})
            self.runs[trial["trial_id"]] = run
        return run

    def on_trial_start(self, trial: dict) -> None:
        self._run(trial).summary["status"] = "running"

    def on_epoch(self, trial: dict, epoch: dict) -> None:
        run = self._run(trial)
        if self.new_epoch(trial, epoch):
            run.log(numeric(epoch), step=int(epoch["epoch"]))

    def on_trial_end(self, trial: dict) -> None:
        run = self._run(trial)
        summary = {"status": trial["status"], "outcome": outcome(trial)}
        for key in ("duplicate_of", "checkpoint_path"):
            if trial.get(key):
                summary[key] = str(trial[key])
        if trial.get("error"):
            summary["error"] = last_line(trial["error"], 4000)
        run.summary.update(summary)
        run.tags = tuple(run.tags or ()) + ((trial["status"],) if trained(trial) else ("not-trained", trial["status"]))
        run.finish(exit_code=1 if trial["status"] in ("failed", "diverged") else 0)
        del self.runs[trial["trial_id"]]

    def on_campaign_progress(self, progress: dict) -> None:
        row = {"front_size": len(progress["front"]), "trials_done": progress["done"]}
        if progress.get("hypervolume") is not None:
            row["hypervolume"] = progress["hypervolume"]
        if progress["front"]:
            columns = list(progress["front"][0])
            row["front"] = self.wandb.Table(columns=columns, data=[[p.get(c) for c in columns]
                                                                   for p in progress["front"]])
        self.campaign.log(row)

    def on_campaign_end(self, report: dict | None) -> None:
        if report:
            artifact = self.wandb.Artifact(f"report-{self.info.name}", type="report")
            for path in report.values():
                artifact.add_file(path)
            self.campaign.log_artifact(artifact)
        self.campaign.finish(exit_code=0 if report is not None else 1)

    def close(self) -> None:
        for run in list(getattr(self, "runs", {}).values()):  # trials the driver stopped: resume continues them
            run.finish(exit_code=1)
