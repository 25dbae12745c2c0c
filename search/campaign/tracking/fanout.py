"""The Tune callback that feeds the campaign's trackers, from the driver only (never a DDP worker).

It runs after the trial recorder in Tune's callback list and reads the recorder's records, so each tracker
sees what the records say: config, cost, epochs, status, duplicate_of, error, checkpoint. Infeasible
proposals (search.records.proposals: no trial, never trained) reach the trackers as ended records of status
infeasible, once each, when the next trial starts and at the end. Each tracker
runs on a thread of its own (except those that must stay in step with Tune, see Tracker.threaded): a slow
or unreachable tracker delays nothing. A tracker that raises is dropped with one warning naming it and the
error; the campaign and the other trackers go on, and the records stay the source of truth.

Run ids and the last epoch logged per trial are kept in ``<exp>/tracking/runs.json`` (written atomically
after each event), so a resumed campaign continues the same runs and logs no epoch twice.
"""
from __future__ import annotations

import copy
import logging
import os
import queue
import threading
from dataclasses import replace

from ray.tune import Callback

from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.tracking.base import CampaignInfo, Tracker, tracker_class
from qkvsearch.search.records.layout import STATUS_KEY
from qkvsearch.search.records.proposals import as_trial_record, read_proposals
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.storage import exists, read_json, write_json

log = logging.getLogger(__name__)

RUNS_FILE = "tracking/runs.json"
PROPOSALS_SENT = "proposals_sent"  # runs.json: ids of the infeasible proposals already given to the trackers
END_TIMEOUT_S = 300.0   # how long the end of a campaign waits for a tracker to log what it was given
REPORT_FILES = ("pareto.html", "pareto.csv")


class _Worker:
    """One tracker behind a queue (or called in place when it is not threaded); drops it on its first error."""

    def __init__(self, tracker: Tracker, save):
        self.tracker, self.save, self.failed = tracker, save, False
        self.queue: queue.Queue | None = None
        if tracker.threaded:
            self.queue = queue.Queue()
            self.thread = threading.Thread(target=self._loop, name=f"tracking-{tracker.name}", daemon=True)
            self.thread.start()
        self.send("start")

    def send(self, method: str, *args) -> None:
        if self.failed:
            return
        if self.queue is not None:
            self.queue.put((method, args))
        else:
            self._call(method, args)

    def _call(self, method: str, args) -> None:
        try:
            getattr(self.tracker, method)(*args)
            self.save()
        except Exception as exc:  # noqa: BLE001  (any library error: the campaign goes on)
            self.failed = True
            text = " ".join(str(exc).split())[:400]
            log.warning(f"tracking: {self.tracker.name} failed ({type(exc).__name__}: {text}); the campaign goes "
                        f"on without it, and its trial records are complete")
            try:
                self.tracker.close()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if not self.failed:
                self._call(*item)

    def finish(self, timeout: float) -> None:
        """Log what was sent, then close the tracker."""
        self.send("close")
        if self.queue is not None:
            self.queue.put(None)
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning(f"tracking: {self.tracker.name} had not logged everything after {timeout:.0f} s; "
                            f"the campaign ends without waiting longer")


class TrackingCallback(Callback):
    """Fans Tune's trial events out to the campaign's trackers (spaces.tracking.TRACKERS)."""

    def __init__(self, campaign: OpenedCampaign, recorder, code_version: str | None, study_in_storage: bool = False):
        self.campaign, self.recorder = replace(campaign, exp=campaign.exp.rstrip("/")), recorder
        self.code_version, self.study_in_storage = code_version, study_in_storage
        self.workers: list[_Worker] = []
        self.progress_key = None
        self._lock = threading.Lock()

    # Tune pickles its run config (tuner.pkl); a resumed driver brings its own callback. The pickled form stays
    # spec and exp, as every version wrote it: an earlier campaign's tuner.pkl reads, and none names OpenedCampaign.
    def __getstate__(self):
        return {"spec": self.campaign.spec, "exp": self.campaign.exp}

    def __setstate__(self, state):
        self.__init__(OpenedCampaign(state["spec"], state["exp"]), None, None)

    # -- set-up and the tracking file ------------------------------------------------------------
    def setup(self, **info) -> None:
        spec, exp = self.campaign.spec, self.campaign.exp
        local = exp[len("file://"):] if exp.startswith("file://") else exp
        self.state = self._read_state()
        spec_dict = spec.to_dict()
        for name, settings in spec.tracking.items():
            info = CampaignInfo(spec.name, local, spec_dict, self.code_version, dict(settings),
                                self.study_in_storage)
            tracker = tracker_class(name)(info, self.state.setdefault(name, {}))
            self.workers.append(_Worker(tracker, self._save))

    def _read_state(self) -> dict:
        uri = f"{self.campaign.exp}/{RUNS_FILE}"
        try:
            return read_json(uri) if exists(uri) else {}
        except Exception as exc:  # noqa: BLE001  (the campaign goes on; the trackers start new runs)
            log.warning(f"tracking: {uri} is unreadable ({type(exc).__name__}: {exc}); trials resumed now get "
                        f"new tracker runs")
            return {}

    def _save(self) -> None:
        with self._lock:
            write_json(f"{self.campaign.exp}/{RUNS_FILE}", copy.deepcopy(self.state))

    def _send(self, method: str, *args) -> None:
        for worker in self.workers:
            worker.send(method, *args)

    def _trial(self, trial) -> dict | None:
        rec = self.recorder.records.get(trial.trial_id) if self.recorder is not None else None
        return copy.deepcopy(rec) if rec is not None else None

    # -- Tune hooks ------------------------------------------------------------------------------
    def _proposals(self) -> None:
        """Infeasible proposals not yet sent, each as a record that ended (a run marked not trained)."""
        sent = self.state.setdefault(PROPOSALS_SENT, [])
        new = [p for p in read_proposals(self.campaign.exp) if p.get("proposal_id") not in sent]
        for proposal in new:
            self._send("on_trial_end", as_trial_record(proposal))
        if new:
            sent.extend(p["proposal_id"] for p in new)
            self._save()

    def on_trial_start(self, iteration, trials, trial, **info):
        self._proposals()  # the ones rejected before this trial's configuration was proposed
        rec = self._trial(trial)
        if rec is not None:
            self._send("on_trial_start", rec)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rec = self._trial(trial)
        if rec is None:
            return
        row = next((e for e in rec["epochs"] if e.get(EPOCH) == result.get(EPOCH)), None)
        if row is not None and result.get(STATUS_KEY) is None:
            self._send("on_epoch", rec, row)
        if result.get(STATUS_KEY) or result.get("checkpoint_path"):
            self._send("on_trial_result", rec)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial)

    def _ended(self, trial) -> None:
        rec = self._trial(trial)
        if rec is None:
            return
        self._send("on_trial_end", rec)
        if rec["status"] == "completed":
            self._progress()

    def _progress(self) -> None:
        """The completed front and its hypervolume, sent when they changed."""
        from qkvsearch.search.monitor.progress import read_progress

        p = read_progress(self.campaign.exp)
        key = (tuple(sorted(str(sorted(f.items())) for f in p.front)), p.hypervolume)
        if key != self.progress_key:
            self.progress_key = key
            self._send("on_campaign_progress", {"done": p.trials_done, "front": p.front,
                                                "hypervolume": p.hypervolume, "objectives": p.objectives})

    def on_experiment_end(self, trials, **info):
        """At the end: the report (when every trial has ended and a tracker is alive), then flush and close."""
        self._proposals()
        report = None
        ended = all(t.status in ("TERMINATED", "ERROR") for t in trials)
        if ended and any(not w.failed for w in self.workers):
            report = self._report()
        self._send("on_campaign_end", report)
        for worker in self.workers:
            worker.finish(END_TIMEOUT_S)

    def _report(self) -> dict | None:
        from qkvsearch.search.analysis.report import build_report

        try:
            paths = build_report(self.campaign.exp, static=False)
        except Exception as exc:  # noqa: BLE001  (`qkvsearch report` says what is wrong; trackers get none)
            log.warning(f"tracking: the report could not be written for the trackers ({type(exc).__name__}: {exc})")
            return {}
        return {os.path.basename(p): p for p in paths.values() if os.path.basename(str(p)) in REPORT_FILES}
