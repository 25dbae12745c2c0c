"""TensorBoard: event files under ``<exp>/tracking/tensorboard/``, one folder per trial and ``_campaign``.

`tensorboard --logdir <exp>/tracking/tensorboard` shows every trial's epoch metrics (step = epoch) side by
side; each trial's config, cost and outcome are its text summaries; ``_campaign`` holds the spec, the code
version, and the front size and hypervolume (step = trials done) with the front as a table. A resumed
trial appends a new event file to its folder; no epoch is written twice.
"""
from __future__ import annotations

import json
import os

from qkvsearch.search.campaign.tracking.base import Tracker, numeric, outcome, param_text

CAMPAIGN_RUN = "_campaign"


def _table(rows: list[dict]) -> str:
    """Rows -> a Markdown table (TensorBoard's text plugin renders Markdown)."""
    if not rows:
        return "(none)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(param_text(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.SummaryWriter = SummaryWriter
        self.root = os.path.join(self.info.exp, "tracking", "tensorboard")
        self.writers: dict = {}
        self.campaign = SummaryWriter(os.path.join(self.root, CAMPAIGN_RUN))
        if not self.state.get("started"):
            self.campaign.add_text("spec", "```\n" + json.dumps(self.info.spec, indent=2) + "\n```")
            self.campaign.add_text("code_version", str(self.info.code_version))
            self.state["started"] = True

    def _writer(self, trial: dict):
        writer = self.writers.get(trial["trial_id"])
        if writer is None:
            writer = self.writers[trial["trial_id"]] = self.SummaryWriter(os.path.join(self.root, trial["trial_name"]))
            memo = self.trial_state(trial)
            if not memo.get("described"):
                rows = [{"key": k, "value": v} for k, v in trial["config"].items()]
                writer.add_text("config", _table(rows))
                for key, value in numeric(trial.get("cost") or {}).items():
                    writer.add_scalar(f"cost/{key}", value, 0)
                memo["described"] = True
        return writer

    def on_trial_start(self, trial: dict) -> None:
        self._writer(trial)

    def on_epoch(self, trial: dict, epoch: dict) -> None:
        writer = self._writer(trial)
        if self.new_epoch(trial, epoch):
            for key, value in numeric(epoch).items():
                if key != "epoch":
                    writer.add_scalar(key, value, int(epoch["epoch"]))
            writer.flush()

    def on_trial_end(self, trial: dict) -> None:
        writer = self._writer(trial)
        writer.add_text("status", trial["status"])
        writer.add_text("outcome", outcome(trial) + (f"\n\ncheckpoint: {trial['checkpoint_path']}"
                                                     if trial.get("checkpoint_path") else ""))
        writer.close()
        del self.writers[trial["trial_id"]]

    def on_campaign_progress(self, progress: dict) -> None:
        step = int(progress["done"])
        self.campaign.add_scalar("front_size", len(progress["front"]), step)
        if progress.get("hypervolume") is not None:
            self.campaign.add_scalar("hypervolume", progress["hypervolume"], step)
        self.campaign.add_text("front", _table(progress["front"]), step)
        self.campaign.flush()

    def on_campaign_end(self, report: dict | None) -> None:
        if report:
            self.campaign.add_text("report", "\n".join(f"- {name}: {path}" for name, path in report.items()))

    def close(self) -> None:
        for writer in [*getattr(self, "writers", {}).values(), getattr(self, "campaign", None)]:
            if writer is not None:
                writer.close()
