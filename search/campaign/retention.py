"""What an ended trial keeps of its checkpoints: the campaign file's ``checkpoints: {keep: ...}``.

A Train run keeps its last checkpoints (``train_runs/<run>/checkpoint_epoch_NNNN/state.pt``): the model,
and the optimizer's and scheduler's state (AdamW: two moments per weight), which only resuming the run
needs. Once a trial has ended for good, the policy (spaces.schema.KEEP_POLICIES) decides what stays:

    keep: front   the weights alone (``qs_weights/<trial_id>.pt``: the state less optimizer and scheduler)
                  of the completed trials on the Pareto front of the campaign's objectives, computed as
                  the report computes it (search.analysis.front.objective_columns, search.analysis.pareto);
                  nothing of the others. A trial that a newer one dominates loses its weights then.
    keep: all     everything, as training left it.
    keep: none    nothing.

Whatever the policy, a trial that may still run keeps what resuming it needs: one running, interrupted,
or one Tune may still restart (its end is not yet in the experiment state Tune saved: a driver killed
before that save restores the trial as running and runs it again). ``still_needed`` names the trials a
later stage of the campaign may still need whole; they keep everything too.

Quantization policies (spaces.keys QUANT_KEYS, and a block's own precisions): where the space searches one, a
completed trial that trained keeps at least its weights until the campaign has ended (``close``), since another
policy of its configuration may still be proposed and is evaluated from them (search.campaign.policies). A
completed trial on the front whose policy quantizes something also keeps its quantized weights, ready to deploy:
``qs_weights/<trial_id>.quantized.pt`` (``{"model": the quantized state_dict, "config", "format"}``; load it
with torchao installed), made from its trainer's weights on the driver's CPU; it goes when the trial leaves
the front.

``decide`` is the rule (pure: a trials table in, a Keep per trial out); ``Retention`` applies it to a
campaign's files (local path or URI) and records what each trial kept in its record (checkpoint_path,
checkpoint_kept, checkpoint_note, through the recorder); ``RetentionCallback`` runs it in the driver as
trials end and when the campaign's driver ends. Its decisions only ever shrink what a trial keeps: a
dominated trial never rejoins the front (dominating trials stay), so what was removed is never wanted back.
"""
from __future__ import annotations

import io
import logging
from dataclasses import dataclass, replace

import numpy as np
from ray.tune import Callback
from ray.tune.experiment import Trial

from qkvsearch.search.analysis.front import objective_columns
from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.campaign.driver import TrialSettings, train_run_name
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.layout import FINAL_STATUSES, WEIGHTS_DIR
from qkvsearch.search.records.readers import read_trials
from qkvsearch.spaces.keys import is_policy_key, quant_policy
from qkvsearch.storage import exists, remove_tree, write_bytes

log = logging.getLogger(__name__)

STATE, WEIGHTS, NONE = "state", "weights", "none"   # a record's checkpoint_kept
WEIGHTS_FORMAT = "qkvsearch-weights-1"   # a weights file's "format": trainers.training.engine.load_state refuses it
QUANTIZED_FORMAT, QUANTIZED_SUFFIX = "qkvsearch-quantized-weights-1", ".quantized.pt"   # a front member's, deployable
RESUME_ONLY = ("optimizer", "scheduler")  # keys of a checkpoint state (trainers.training.engine.Run.state_dict)
                                          # only resuming needs


@dataclass(frozen=True)
class Keep:
    """What one trial keeps: ``kept`` (STATE, WEIGHTS or NONE) and ``note``, the reason, for its record."""

    kept: str
    note: str


MAY_RUN = Keep(STATE, "may still run: resuming it needs its checkpoint")


def still_needed(campaign: OpenedCampaign, trials) -> set[str]:
    """Ids of trials a later stage of the campaign may still need whole (fine-tuning from a trial's
    checkpoint, spaces.stages): they keep everything until this no longer names them. ``trials`` is the
    trials table (search.analysis.results.collect). Until the stages' selection is written (every trial
    ended), any completed trial may be chosen; then the chosen ones whose stages have not all completed."""
    from qkvsearch.search.records.stages import latest_by_stage, read_selection, read_stages

    spec, exp = campaign.spec, campaign.exp
    if not getattr(spec, "stages", None):
        return set()
    completed = {t for t, s in zip(trials.column("trial_id").to_pylist(), trials.column("status").to_pylist())
                 if s == "completed"}
    selection = read_selection(exp)
    if selection is None:
        return completed
    names = [f.name for f in spec.stages.finetune] + (["ood"] if spec.stages.ood else [])
    latest = latest_by_stage(read_stages(exp))
    done = {t for t in selection["trial_ids"]
            if all(latest.get((t, n), {}).get("status") == "completed" for n in names)}
    return (set(selection["trial_ids"]) & completed) - done


FRONT_NOTE = "on the Pareto front of"
POLICIES_NOTE = "other quantization policies of its configuration may still come"


def decide(trials, objectives, policy: str, *, restartable=frozenset(), needed=frozenset(),
           trainers=frozenset()) -> dict[str, Keep]:
    """trial_id -> Keep, for every row of ``trials`` (search.analysis.results.collect's table).

    objectives: the spec's (Objective objects, or {"metric", "mode"} mappings); policy: "front" | "all" |
    "none"; restartable: ids of trials Tune may still run (kept whole whatever their record says);
    needed: ids a later stage needs (``still_needed``); trainers: ids whose weights other quantization
    policies may still need (kept as weights at least)."""
    ids = trials.column("trial_id").to_pylist()
    statuses = trials.column("status").to_pylist()
    ended = [s in FINAL_STATUSES and t not in restartable for t, s in zip(ids, statuses)]
    on_front, why = _front(trials, objectives, ended, statuses) if policy == "front" else (None, "")
    out = {}
    for i, (tid, status) in enumerate(zip(ids, statuses)):
        if not ended[i]:
            out[tid] = MAY_RUN
        elif tid in needed:
            out[tid] = Keep(STATE, "a later stage of the campaign needs it")
        elif policy == "all":
            out[tid] = Keep(STATE, "checkpoints: keep all")
        elif on_front is not None and on_front[i]:
            out[tid] = Keep(WEIGHTS, f"{FRONT_NOTE} {why} (checkpoints: keep front)")
        elif tid in trainers:
            out[tid] = Keep(WEIGHTS, POLICIES_NOTE)
        elif policy == "none":
            out[tid] = Keep(NONE, "checkpoints: keep none")
        elif on_front is None:
            out[tid] = Keep(STATE, f"the Pareto front is unknown ({why}): nothing removed")
        elif status == "completed":
            out[tid] = Keep(NONE, f"off the Pareto front of {why}: a completed trial dominates it "
                                  "(checkpoints: keep front)")
        else:
            out[tid] = Keep(NONE, f"{status}: only completed trials form the Pareto front (checkpoints: keep front)")
    return out


def _front(trials, objectives, ended, statuses) -> tuple[np.ndarray | None, str]:
    """(n,) bool: ended completed trials on the front of the objectives (as the report computes it), and
    the objectives as text; (None, the reason) when no front can be computed."""
    specs = [o if isinstance(o, dict) else {"metric": o.metric, "mode": o.mode} for o in objectives]
    eligible = np.array([e and s == "completed" for e, s in zip(ended, statuses)], dtype=bool)
    mask = np.zeros(len(statuses), dtype=bool)
    if not eligible.any():
        return mask, "no completed trial"
    try:
        metrics, cols, dirs = objective_columns(trials, specs)
    except ValueError as err:
        return None, str(err)
    values = np.column_stack([trials.column(c).to_numpy(zero_copy_only=False).astype("float64") for c in cols])
    mask[eligible] = nondominated_mask(values[eligible], dirs)
    return mask, ", ".join(f"{m} ({d})" for m, d in zip(metrics, dirs))


def weights_only(state: dict) -> dict:
    """A checkpoint state (trainers.training.engine.Run.state_dict) without what only resuming needs: model weights,
    config, epoch counters and history stay; ``format`` says it is no resumable state."""
    return {**{k: v for k, v in state.items() if k not in RESUME_ONLY}, "format": WEIGHTS_FORMAT}


class Retention:
    """Applies ``decide`` to a campaign's files. ``recorder``: the campaign's (search.records.recorder),
    which writes what each trial kept into its record; ``settings``: where the trials' Train runs lie."""

    def __init__(self, campaign: OpenedCampaign, recorder, settings: TrialSettings):
        self.campaign = replace(campaign, exp=campaign.exp.rstrip("/"))
        self.recorder, self.settings = recorder, settings
        self._gone: set[str] = set()  # trials whose Train run folder is known removed (this driver)

    # Tune pickles its callbacks with its run config (tuner.pkl); a resumed driver brings its own. The pickled form
    # stays exp and spec, as every version wrote it: an earlier campaign's tuner.pkl reads, and none names
    # OpenedCampaign.
    def __getstate__(self):
        state = dict(self.__dict__)
        campaign = state.pop("campaign")
        return {"exp": campaign.exp, "spec": campaign.spec, **state}

    def __setstate__(self, state):
        state = dict(state)
        campaign = OpenedCampaign(state.pop("spec", None), state.pop("exp", None))
        self.__dict__.update({"_gone": set(), **state, "campaign": campaign})

    def run(self, restartable=frozenset(), final: bool = False, closed: bool = False) -> dict[str, Keep]:
        """One pass over every trial; final: also look for files a pass cut short left behind; closed: the
        campaign has ended (no other quantization policy can come). Under ``keep: all`` nothing is read or
        written: records and checkpoints stay as training left them."""
        spec, exp = self.campaign.spec, self.campaign.exp
        if spec.checkpoints.keep == "all":
            return {}
        trials, _ = collect(exp)
        records = {r["trial_id"]: r for r in read_trials(exp).records}
        searched = {k for k in spec.space.keys if is_policy_key(k)}   # a block's own precision too
        trainers = set() if closed or not searched else {
            t for t, r in records.items() if r.get("status") == "completed" and not r.get("trained_by")}
        plan = decide(trials, spec.objectives, spec.checkpoints.keep, restartable=restartable,
                      needed=still_needed(self.campaign, trials), trainers=trainers)
        for tid, keep in plan.items():  # first: a quantized trial's trainer still has its weights
            if keep != MAY_RUN and tid in records and quant_policy(records[tid]["config"]):
                self._quantized(records[tid], keep, records)
        for tid, keep in plan.items():
            if keep != MAY_RUN and tid in records and not records[tid].get("trained_by"):
                self._apply(records[tid], keep, final)
        return plan

    def quantized_uri(self, trial_id: str) -> str:
        return f"{self.campaign.exp}/{WEIGHTS_DIR}/{trial_id}{QUANTIZED_SUFFIX}"

    def _quantized(self, rec: dict, keep: Keep, records: dict) -> None:
        """A completed front member's quantized weights (module docstring) written once; removed off the front."""
        uri, wanted = self.quantized_uri(rec["trial_id"]), keep.note.startswith(FRONT_NOTE)
        if not wanted or rec.get("status") != "completed":
            if exists(uri):
                remove_file(uri)
            return
        if exists(uri):
            return
        import torch

        from qkvsearch.trainers import build_model
        from qkvsearch.trainers.deploy.policy_eval import trained_weights
        from qkvsearch.trainers.model.quantize import quantize_model

        trainer = records.get(rec.get("trained_by"), rec)
        if not trainer.get("checkpoint_path"):
            log.warning("trial %s: no weights left to quantize (trial %s kept none)", rec["trial_id"],
                        trainer["trial_id"])
            return
        model = build_model(rec["config"])
        model.load_state_dict(trained_weights(trainer["checkpoint_path"]))
        quantize_model(model.eval(), rec["config"], "cpu")
        buf = io.BytesIO()
        torch.save({"format": QUANTIZED_FORMAT, "model": model.state_dict(), "config": rec["config"]}, buf)
        write_bytes(uri, buf.getbuffer())

    def weights_uri(self, trial_id: str) -> str:
        return f"{self.campaign.exp}/{WEIGHTS_DIR}/{trial_id}.pt"

    def run_dir(self, rec: dict) -> str:
        return (f"{self.settings.train_storage.rstrip('/')}/"
                f"{train_run_name(self.settings, rec['config'], rec['trial_id'])}")

    def _apply(self, rec: dict, keep: Keep, final: bool) -> None:
        tid, path = rec["trial_id"], rec.get("checkpoint_path")
        has = WEIGHTS if path and path == self.weights_uri(tid) else STATE if path else NONE
        if keep.kept == STATE:  # nothing removed, the record left as training left it
            return
        if keep.kept == WEIGHTS and has == STATE:
            self._keep_weights(rec, path, keep.note)
            return
        if keep.kept == WEIGHTS and has == NONE:
            keep = Keep(NONE, "no checkpoint was written")
        if keep.kept == has:
            noted = rec.get("checkpoint_kept")
            self._note(rec, has, keep.note)
            if final or noted != has:
                self._remove_leftovers(rec, has)
            return
        self.recorder.note_checkpoint(tid, None, NONE, keep.note)  # the record first: it never names a removed file
        self._remove_leftovers(rec, NONE)

    def _note(self, rec: dict, kept: str, note: str) -> None:
        if (rec.get("checkpoint_kept"), rec.get("checkpoint_note")) != (kept, note):
            self.recorder.note_checkpoint(rec["trial_id"], rec.get("checkpoint_path"), kept, note)

    def _keep_weights(self, rec: dict, folder: str, note: str) -> None:
        """Write the weights of the checkpoint at ``folder``, point the record at them, then remove the run:
        a pass cut short leaves the record naming a complete file, at worst beside files to remove."""
        import torch

        from qkvsearch.trainers.training.engine import CheckpointError, load_state

        try:
            state = load_state(folder)
        except CheckpointError as err:  # left as it is: nothing better to keep
            log.warning("trial %s keeps its checkpoint whole: %s", rec["trial_id"], err)
            return
        buf = io.BytesIO()
        torch.save(weights_only(state), buf)
        uri = self.weights_uri(rec["trial_id"])
        write_bytes(uri, buf.getbuffer())
        self.recorder.note_checkpoint(rec["trial_id"], uri, WEIGHTS, note)
        self._remove_leftovers(rec, WEIGHTS)

    def _remove_leftovers(self, rec: dict, kept: str) -> None:
        """Remove the trial's Train run (and its weights file, when it keeps none) where they exist."""
        tid = rec["trial_id"]
        if tid not in self._gone:
            run = self.run_dir(rec)
            if exists(run):
                remove_tree(run)
            self._gone.add(tid)
        if kept == NONE and exists(self.weights_uri(tid)):
            remove_file(self.weights_uri(tid))


class RetentionCallback(Callback):
    """Runs a Retention in the campaign's driver: a pass when a trial ends, and a final one when the driver's
    Tune run ends. A trial that ended here counts as ended only once Tune's saved experiment state shows it:
    Tune calls ``get_state`` as it saves (the save of trial changes, search.scheduling.tune_schedulers, waits
    until the state is stored), so a trial that ended before one save is in the storage at the next. Goes
    after the recorder in Tune's callbacks, so that a pass reads the ended trial's final record."""

    def __init__(self, retention: Retention):
        self.retention = retention
        self._ended: set[str] = set()   # trials that ended under this driver, until a stored state shows it
        self._saving: set[str] = set()  # of them, those that had ended when Tune last saved

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended.add(trial.trial_id)
        self._pass(trials)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended.add(trial.trial_id)
        self._pass(trials)

    def close(self) -> None:
        """The campaign has ended: a last pass, no other quantization policy to keep trainers' weights for."""
        try:
            self.retention.run(final=True, closed=True)
        except Exception as err:  # noqa: BLE001  (as _pass: the files stay, the campaign's results are whole)
            log.warning("checkpoints of ended trials not pruned this time: %s", err, exc_info=True)

    def get_state(self):
        self._ended -= self._saving  # stored by now: no id kept per ended trial, whatever the campaign's size
        self._saving = set(self._ended)
        return None  # nothing to save: the records hold what was kept

    def on_experiment_end(self, trials, **info):
        self._ended.clear()  # Tune stored its final state just before (ray.tune.tune.run)
        self._saving.clear()
        self._pass(trials, final=True)

    def _pass(self, trials, final: bool = False) -> None:
        live = {t.trial_id for t in trials if t.status not in (Trial.TERMINATED, Trial.ERROR)}
        try:
            self.retention.run(live | self._ended, final=final)
        except Exception as err:  # noqa: BLE001  (a Tune callback's error would fail the trial that just ended)
            # Storage unreachable, a damaged file: the campaign goes on, the files stay, the next pass retries.
            log.warning("checkpoints of ended trials not pruned this time: %s", err, exc_info=True)


def remove_file(uri: str) -> None:
    from qkvsearch.storage import open_location

    fs, path = open_location(uri)
    fs.delete_file(path)


def retention_callback(campaign: OpenedCampaign, recorder, settings: TrialSettings) -> RetentionCallback:
    return RetentionCallback(Retention(campaign, recorder, settings))


__all__ = ["Keep", "NONE", "STATE", "WEIGHTS", "Retention", "RetentionCallback", "decide", "retention_callback",
           "still_needed", "weights_only"]

