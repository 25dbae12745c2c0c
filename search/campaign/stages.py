"""The stages after training (spaces.stages): fine-tuning per dataset, then OOD detection, for the
configurations the pretraining selects, once every trial of the campaign has ended (select: front, top_k)
or as each trial completes (select: as_completed, `StagesAsCompleted`).

    trials ended --select--> completed trials on the front of the campaign's objectives (or top_k by
                             non-dominated rank; a trial stopped early never goes on); as_completed: a
                             trial on the front of the trials completed so far when it completes (a
                             superset of the final front: a trial dominated then stays dominated)
      per selected trial:  finetune@<dataset>: its own Train run (stage_runs/<run>/), from the trial's final
                           checkpoint with a new head, in a Ray task holding one worker's resources
                           (several workers: the task only drives the TorchTrainer, as a trial does)
                           ood: a Ray task scoring the in-distribution fine-tuning's model (trainers.stages.transfer)

Each stage is recorded under its key (search.records.stages: configuration, upstream checkpoint, settings):
a completed one is never run again, so `resume` after a kill between or inside stages goes on where it
stopped; a fine-tuning cut short resumes from its own last checkpoint. Stages run one after another. The
searcher never sees stage metrics: with front and top_k it has learnt from the trials alone before the
first stage starts; with as_completed the stages run beside the trials, in a thread of the driver, and
still tell the searcher nothing.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time

import numpy as np
from ray.tune import Callback

from qkvsearch.search.analysis.front import objective_columns
from qkvsearch.search.analysis.pareto import nondominated_mask, nondominated_ranks
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.layout import STAGE_RUNS_DIR
from qkvsearch.search.records.stages import (
    read_selection,
    read_stage,
    stage_key,
    write_selection,
    write_stage,
)
from qkvsearch.spaces.keys import fill, identity, model_keys
from qkvsearch.spaces.metrics import FINETUNE_METRIC
from qkvsearch.spaces.stages import result_settings

POLL_S = 1.0  # how often a stage run in a thread looks for a stop


class StageStopped(Exception):
    """A stage left off (its record interrupted) because the campaign is stopping."""

log = logging.getLogger(__name__)


def select_trials(campaign: OpenedCampaign) -> list[dict]:
    """{"trial_id", "trial_name", "config", "checkpoint"} of the completed trials the stages run for."""
    spec, exp = campaign.spec, campaign.exp
    trials, _ = collect(exp)
    df = trials.to_pandas()
    ok = (df["status"] == "completed").to_numpy() & df["checkpoint_path"].notna().to_numpy()
    if not ok.any():
        return []
    specs = [{"metric": o.metric, "mode": o.mode} for o in spec.objectives]
    _, cols, dirs = objective_columns(trials, specs)
    values = df[cols].astype("float64").to_numpy()
    chosen = np.zeros(len(df), dtype=bool)
    if spec.stages.select == "as_completed":  # those chosen when they completed, and the front now
        earlier = set((read_selection(exp) or {}).get("trial_ids", []))
        chosen[ok] = df["trial_id"].isin(earlier).to_numpy()[ok]
    if spec.stages.select == "top_k":
        ranks = np.full(len(df), np.iinfo(np.int64).max)
        ranks[ok] = nondominated_ranks(values[ok], dirs)
        order = sorted(np.flatnonzero(ok), key=lambda i: (ranks[i], df["trial_id"].iat[i]))
        chosen[order[:spec.stages.top_k]] = True
    else:
        chosen[ok] |= nondominated_mask(values[ok], dirs)

    # upstream: what names the trial's final checkpoint, stable when retention moves its weights elsewhere
    return [{"trial_id": df["trial_id"].iat[i], "trial_name": df["trial_name"].iat[i],
             "config": json.loads(df["config_json"].iat[i]), "checkpoint": df["checkpoint_path"].iat[i],
             "upstream": f"{df['trial_id'].iat[i]}@epoch{int(df['epochs_run'].iat[i])}"}
            for i in np.flatnonzero(chosen)]


def finetune_config(trial_config: dict, stage) -> dict:
    """The trial's resolved config on the stage's dataset, with its recipe: a filled trial config."""
    cfg = {**trial_config, "dataset": stage.dataset, "data_path": stage.path, "num_classes": None,
           **dict(stage.recipe)}
    return fill(cfg)


def run_stages(campaign: OpenedCampaign, settings, retention=None) -> None:
    """Run every stage not yet completed for the selected configurations (spec.stages: none, nothing to do);
    then a final pass of ``retention`` (search.campaign.retention.Retention), which keeps until then what
    the stages may need. KeyboardInterrupt (a stop signal) leaves the running stage's record interrupted."""
    stages = campaign.spec.stages
    if not stages:
        return
    chosen = select_trials(campaign)
    write_selection_of(campaign, chosen)
    log.info(f"stages: {len(chosen)} configuration(s) go on ({stages.select} of the pretraining)")
    for trial in chosen:
        run_chain(campaign, settings, trial)
    if retention is not None:
        retention.run(final=True)
    _log_front(campaign)


def run_chain(campaign: OpenedCampaign, settings, trial: dict, stop: threading.Event | None = None) -> None:
    """Every stage of one selected trial not yet completed: its fine-tunings, then OOD detection."""
    finetuned = {}
    for stage in campaign.spec.stages.finetune:
        finetuned[stage.dataset] = _finetune(campaign, settings, trial, stage, stop)
    ood = campaign.spec.stages.ood
    if ood is not None and (up := finetuned.get(ood.in_distribution)) and up.get("status") == "completed":
        _ood(campaign, settings, trial, up, stop)


def write_selection_of(campaign: OpenedCampaign, chosen: list[dict]) -> None:
    """The selection file names exactly ``chosen`` (written only when it changes)."""
    selection = read_selection(campaign.exp)
    ids = [t["trial_id"] for t in chosen]
    if selection is None or sorted(selection["trial_ids"]) != sorted(ids):
        write_selection(campaign.exp, campaign.spec.stages.select, ids, time.time())


class StagesAsCompleted(Callback):
    """select: as_completed. A Tune callback (it goes before the retention callback, so that a pass sees the
    selection) that sends a trial completing on the front of the trials completed so far to its stages at
    once, in one thread of the driver: the stages of the chosen trials run one after another, beside the
    campaign's trials. ``finish`` waits for them; ``stop`` ends them (the running stage's record
    interrupted; `resume` runs it again)."""

    def __init__(self, campaign: OpenedCampaign, settings):
        self.campaign, self.settings = campaign, settings
        self.sent: set[str] = set()
        self.todo: queue.Queue = queue.Queue()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._work, name="qkvsearch-stages", daemon=True)

    # Tune pickles its run config (tuner.pkl); a resumed driver brings its own callback. The pickled form stays
    # spec and exp, as every version wrote it: an earlier campaign's tuner.pkl reads, and none names OpenedCampaign.
    def __getstate__(self):
        return {"spec": self.campaign.spec, "exp": self.campaign.exp, "settings": self.settings}

    def __setstate__(self, state):
        self.__init__(OpenedCampaign(state["spec"], state["exp"]), state["settings"])

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        chosen = select_trials(self.campaign)
        write_selection_of(self.campaign, chosen)
        for t in chosen:
            if t["trial_id"] not in self.sent:
                self.sent.add(t["trial_id"])
                self.todo.put(t)
                log.info(f"stages: {t['trial_name']} goes on (on the front as it completed)")
        if self.sent and not self.thread.is_alive() and not self.halt.is_set():
            self.thread.start()

    def _work(self) -> None:
        while not self.halt.is_set():
            try:
                trial = self.todo.get(timeout=POLL_S)
            except queue.Empty:
                continue
            try:
                run_chain(self.campaign, self.settings, trial, self.halt)
            except StageStopped:
                return
            finally:
                self.todo.task_done()

    def finish(self) -> None:
        """Wait until every sent trial's stages have run (a stop signal meanwhile: KeyboardInterrupt)."""
        try:
            while self.thread.is_alive() and self.todo.unfinished_tasks:
                time.sleep(0.2)
        except KeyboardInterrupt:
            self.stop()
            raise
        self.stop()

    def stop(self) -> None:
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join()


def stage_resources(stage, settings) -> tuple[int, float, float]:
    """(workers, cpus per worker, GPUs per worker) of a stage: its own resources, else the campaign's."""
    own = stage.resources
    return (own.get("workers_per_trial", settings.workers), own.get("cpus_per_worker", settings.cpus_per_worker),
            own.get("gpus_per_worker", settings.gpus_per_worker))


def _log_front(campaign: OpenedCampaign) -> None:
    """The configurations ranked on the stages' objectives (the report's Stages section, in short)."""
    from qkvsearch.search.analysis.stages import stage_table

    stages = campaign.spec.stages
    df = stage_table(campaign.exp, stages, collect(campaign.exp)[0])
    metrics = [o.metric for o in stages.objectives]
    log.info(f"stages' front on {', '.join(metrics)} ({int(df['on_stage_front'].sum())} of {len(df)}):")
    for _, row in df.iterrows():
        values = "  ".join(f"{m} {row.get(m, float('nan')):.4g}" for m in metrics if m in row)
        log.info(f"  rank {row['stage_rank']:.0f}  {row['trial_name']:<32} {values}")


def _finetune(campaign: OpenedCampaign, settings, trial: dict, stage, stop=None) -> dict:
    spec, exp = campaign.spec, campaign.exp
    settings_dict = result_settings(stage)
    key = stage_key(identity(trial["config"]), trial["upstream"], settings_dict)
    done = read_stage(exp, key)
    if done is not None and done.get("status") == "completed":
        return done
    cfg = finetune_config(trial["config"], stage)
    run_name = f"{spec.name}-{trial['trial_name']}-{stage.dataset}-{key[:8]}"
    storage = f"{exp}/{STAGE_RUNS_DIR}"
    workers, cpus, gpus = stage_resources(stage, settings)
    kwargs = dict(cfg=cfg, name=run_name, storage=storage, init=trial["checkpoint"], workers=workers, cpus=cpus,
                  gpus=gpus, faults=list(settings.faults))

    def finish(history: list[dict]) -> dict:
        from qkvsearch.trainers.ray_train.loop import epoch_checkpoint

        last = history[-1] if history else {}
        return {"metrics": {f"{FINETUNE_METRIC}{stage.dataset}": last.get("top1")}, "epochs": history,
                "checkpoint": epoch_checkpoint(f"{storage}/{run_name}", cfg["epochs"]), "run": run_name}

    return _run(exp, key, stage.name, trial, settings_dict, "finetune", kwargs, finish, stop)


def _ood(campaign: OpenedCampaign, settings, trial: dict, upstream: dict, stop=None) -> dict:
    spec, exp = campaign.spec, campaign.exp
    ood = spec.stages.ood
    settings_dict = result_settings(ood)
    key = stage_key(identity(trial["config"]), upstream["key"], settings_dict)  # the fine-tuning's
    done = read_stage(exp, key)
    if done is not None and done.get("status") == "completed":
        return done
    stage = next(f for f in spec.stages.finetune if f.dataset == ood.in_distribution)
    _, cpus, gpus = stage_resources(ood, settings)
    kwargs = dict(cfg=finetune_config(trial["config"], stage), checkpoint=upstream["checkpoint"], workers=1,
                  cpus=cpus, gpus=gpus,
                  sets=[{"name": s.name, "format": s.format, "path": s.path} for s in ood.datasets], score=ood.score)

    def finish(result: dict) -> dict:
        metrics = {k: v for k, v in result.items() if k not in ("per_set", "top1")}
        return {"metrics": metrics, "per_set": result["per_set"], "id_top1": result["top1"]}

    return _run(exp, key, "ood", trial, settings_dict, "ood", kwargs, finish, stop)


def _run(exp, key, stage, trial, settings_dict, kind, kwargs, finish, stop=None) -> dict:
    """Record the stage running, run it in a Ray task, record how it ended: the final record. stop: an Event
    that, once set, cancels the task (StageStopped), looked at every POLL_S."""
    import ray

    rec = {"key": key, "stage": stage, "trial_id": trial["trial_id"], "trial_name": trial["trial_name"],
           "status": "running", "upstream": kwargs.get("init") or kwargs.get("checkpoint"), "settings": settings_dict,
           "metrics": {}, "started_at": time.time(), "ended_at": None, "error": None}
    write_stage(exp, rec)
    log.info(f"stage {stage} of {trial['trial_name']}: started")
    local = kwargs["workers"] == 1  # one worker trains in the task; several: the task drives their run
    resources = {"num_cpus": kwargs["cpus"] if local else 0, "num_gpus": kwargs["gpus"] if local else 0}
    try:
        ref = ray.remote(_in_task).options(**resources, max_retries=0).remote(kind, kwargs)
        while stop is not None and not ray.wait([ref], timeout=POLL_S)[0]:
            if stop.is_set():
                ray.cancel(ref, force=True)
                raise StageStopped(stage)
        rec.update(finish(ray.get(ref)), status="completed")
    except (KeyboardInterrupt, StageStopped):
        rec.update(status="interrupted", ended_at=time.time())
        write_stage(exp, rec)
        raise
    except Exception as exc:  # noqa: BLE001  (the stage's error is its outcome; the next stage goes on)
        from qkvsearch.search.campaign.driver import error_text

        rec.update(status="failed", error=error_text(exc))
        log.warning(f"stage {stage} of {trial['trial_name']}: failed: {str(exc).strip().splitlines()[-1:]}")
    rec.update(ended_at=time.time(), duration_s=time.time() - rec["started_at"])
    write_stage(exp, rec)
    if rec["status"] == "completed":
        shown = ", ".join(f"{k} {v:.2f}" for k, v in rec["metrics"].items() if isinstance(v, float))
        log.info(f"stage {stage} of {trial['trial_name']}: {shown} ({rec['duration_s']:.1f} s)")
    return rec


def _in_task(kind: str, kwargs: dict):
    """In a Ray task: a fine-tuning (-> its epochs' metrics) or an OOD evaluation (-> its metrics)."""
    if kind == "ood":
        from qkvsearch.trainers.stages.transfer import ood_evaluation

        return ood_evaluation(kwargs["cfg"], kwargs["checkpoint"], kwargs["sets"], kwargs["score"])
    from qkvsearch.trainers.ray_train.loop import RunSettings, run_trainer

    k = kwargs
    result = run_trainer(k["cfg"], RunSettings(
        num_workers=0 if k["workers"] == 1 else k["workers"], cpus_per_worker=k["cpus"], gpus_per_worker=k["gpus"],
        name=k["name"], storage_path=k["storage"], init_from=k["init"], faults=k["faults"], num_to_keep=1))
    return list(result.return_value or [])


def check_stages(spec, trial_configs: list[dict], launching: bool) -> None:
    """Before Ray starts: every fine-tuning's config can be made of each trial's (``trial_configs``: the
    space's models, resolved), its model at the stage's img_size included, and its data is where the spec
    says; so are the OOD sets. BadInput naming the stage's field. A folder this machine does not have fails
    a launch; `validate` (launching=False) only warns."""
    from qkvsearch.spaces.errors import BadInput, SpecError
    from qkvsearch.trainers.data.datasets import check_dataset, data_here
    from qkvsearch.trainers.model.cost import resolve_trial

    problems = []
    for i, stage in enumerate(spec.stages.finetune):
        where = f"stages.finetune[{i}]"
        try:
            cfg = finetune_config(trial_configs[0], stage)
            if data_here(stage.path, f"{where}.path", launching):
                check_dataset(cfg)
            resized = {}  # a model the stage's img_size changes, once per model: the patches must tile it
            for trial_config in trial_configs:
                if stage.recipe.get("img_size", trial_config.get("img_size")) != trial_config.get("img_size"):
                    cfg = finetune_config(trial_config, stage)
                    resized.setdefault(identity(model_keys(cfg)), cfg)
            for cfg in resized.values():
                resolve_trial(cfg)
        except BadInput as err:  # "data_path: ..." is this stage's path; "<trial key>: ..." its recipe or the trial
            problems.append(_stage_problem(where, stage, str(err)))
    for i, s in enumerate(spec.stages.ood.datasets if spec.stages.ood else ()):
        if s.path is not None and data_here(s.path, f"stages.ood.datasets[{i}].path", launching):
            problem = _ood_set_problem(s)
            if problem:
                problems.append(f"stages.ood.datasets[{i}].path: {problem}")
    if problems:
        raise SpecError(problems, spec.source)


def _stage_problem(where: str, stage, text: str) -> str:
    """A trial-key message ("<key>: ...") about a fine-tuning's config, named by the stage's field: its path,
    a key its recipe sets, else the stage."""
    key, sep, rest = text.partition(": ")
    if sep and key == "data_path":
        return f"{where}.path: {rest}"
    if sep and key in stage.recipe:
        return f"{where}.{key}: {rest}"
    return f"{where}: {text}"


def _ood_set_problem(s) -> str | None:
    """Why an OOD set cannot be read from its path, or None."""
    import os

    from qkvsearch.trainers.data import datasets as data
    from qkvsearch.trainers.data import formats as data_sources

    if not os.path.isdir(s.path):
        return f"expected a folder holding the {s.format} set {s.name!r}, given {s.path!r}, which is not one"
    try:
        if s.format == "imagefolder" and data._first_image(s.path) is None:
            return f"expected images ({', '.join(data.IMAGE_EXTENSIONS)}) under {s.path!r}, given a folder without any"
        if s.format in data.CIFAR_FILES:
            data._check_cifar(s.format, s.path)
        elif s.format == "stl10":
            data_sources.check_stl10(s.path)
    except data.DatasetError as err:
        return str(err).removeprefix("data_path: ")
    return None
