"""The sections of a campaign file, each checked against its declaration (spaces.keys, its table: spaces.fields),
every problem collected with the path of its field; the scheduler, resources and checkpoints sections' specs are
made from their tables here. The search section: spaces.search_options; space: spaces.dimensions; stages:
spaces.stages; tracking: spaces.tracking; measure: spaces.measure; supernet: spaces.supernet."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.batches import batch_plan
from qkvsearch.spaces.checks import MAX_COUNT, NONNEG_INT, POS_INT, integer, is_number, one_of
from qkvsearch.spaces.errors import Collector, hint, show
from qkvsearch.spaces.fields import MODE, POSITIVE_OR_AUTO, Field, read_table, section_spec, table
from qkvsearch.spaces.keys import (
    KEYS,
    REQUIRED_TRAIN_KEYS,
    ConfigError,
    fill_from_dataset,
    flatten,
    section_keys,
)
from qkvsearch.spaces.metrics import (
    COST_METRICS,
    FINETUNE_METRIC,
    METRICS,
    SCHEDULER_METRICS,
    STAGE_METRICS,
    bound_problem,
    ranked_by,
)
from qkvsearch.spaces.schema import (
    DEFAULT_OBJECTIVES,
    KEEP_POLICIES,
    WORKER_RESOURCES,
    Constraint,
    DataSpec,
    FrozenMap,
    ModelSpec,
    Objective,
    Space,
    TrainSpec,
)

# A trial scheduler (not the learning-rate schedules: spaces.keys.LR_SCHEDULES) is its builder and its row here: the
# name a campaign file gives (scheduler.type) -> "module:function" that builds its Tune scheduler from the section
# (search.scheduling.tune_schedulers.make_scheduler), imported when a campaign or `simulate` builds one. An option
# of its own is a SCHEDULER_FIELDS row that applies to it.
_BUILDERS = "qkvsearch.search.scheduling.tune_schedulers"
SCHEDULERS = {
    "fifo": f"{_BUILDERS}:fifo",
    "asha": f"{_BUILDERS}:asha",
    "moasha": f"{_BUILDERS}:moasha",
}
TRIAL_SCHEDULERS = tuple(SCHEDULERS)
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs")
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MISSING = object()
RUNGS = ("asha", "moasha")   # the schedulers that judge trials at rungs



class Rungs:
    """What a scheduler spec computes of its rungs and brackets (SchedulerSpec's own methods)."""

    # the defaults of ``brackets``, see bracket_count
    DEFAULT_BRACKETS = FrozenMap({"moasha": 3, "asha": 1})

    @staticmethod
    def rung_epochs(grace_epochs: float, reduction_factor: float, epochs: float) -> list:
        """The rungs of bracket 0: grace * rf**k, k = 0, 1, ..., below the planned epochs (trials at
        ``epochs`` are done); whole numbers as ints. The one ladder of the spec checks, the MO-ASHA
        scheduler and the simulator."""
        out, m = [], grace_epochs
        while m < epochs:
            out.append(int(m) if float(m).is_integer() else float(m))
            m *= reduction_factor
        return out

    def bracket_count(self, epochs: int) -> int:
        """Brackets the campaign's scheduler gets: ``brackets`` when the spec sets it, else the default
        (at most one per rung that fits in ``epochs``, and at least 1).

        Default for moasha: 3, chosen with benchmarks/bench_search.py (replays of 81 and 243
        configurations x 27 epochs, grace 1, rf 3, where 3 is every rung: 1, 3, 9; MO-ASHA deals
        bracket s rf**(2 s) shares of the trials, see search/scheduling/moasha.py and benchmarks/README.md). At
        half the full grid's epochs, MO-ASHA with 3 brackets keeps 0.98 / 0.99 of the grid's hypervolume when
        curves keep their order and 0.97 / 0.97 when larger models learn slower and overtake, where 1 bracket
        keeps 0.97 / 0.99 and 0.70 / 0.81, and 2 brackets 0.99 / 1.00 and 0.85 / 0.93. On curves that keep
        their order one bracket is nearly as good and cheaper (it tries every configuration with a
        quarter of the epochs or fewer), but on crossing curves fewer brackets lose much of the front,
        and a campaign cannot tell beforehand which kind it has. Smaller budgets favour fewer brackets:
        at a quarter of the grid's epochs 3 brackets trail 1 on ordered curves (0.91 vs 0.96 for 81
        configurations) while still ahead of random search (0.88). The benchmark's targets at half the
        epochs (0.97 ordered, 0.95 crossing, never 0.02 below random search) hold with 3 brackets on
        all four benchmarks.
        Default for asha: 1, Ray's own (its brackets are drawn at random, weighted toward bracket 0;
        not benchmarked here)."""
        if self.brackets is not None:
            return self.brackets
        fit = len(self.rung_epochs(self.grace_epochs, self.reduction_factor, epochs))
        return max(1, min(self.DEFAULT_BRACKETS.get(self.type, 1), fit))


# The fields of the scheduler, resources and checkpoints sections (spaces.fields), and the specs made of them.
SCHEDULER_FIELDS = table(
    Field("type", one_of(*TRIAL_SCHEDULERS), "fifo",
          "fifo runs every trial to train.epochs; asha stops trials on one metric; moasha ranks them by "
          "non-dominated sorting over the objectives"),
    Field("grace_epochs", POS_INT, 1, "epochs before the first rung; at most train.epochs", applies=RUNGS),
    Field("reduction_factor", integer(2, MAX_COUNT), 3,
          "rungs at grace_epochs x reduction_factor^k epochs; the top 1/reduction_factor go on", applies=RUNGS),
    Field("metric", one_of(*SCHEDULER_METRICS), None, "the training metric asha stops trials on",
          default_doc="the first objective's (top1 for top1_q)", applies=("asha",)),
    Field("mode", MODE, None, "whether asha keeps the metric's high or low values",
          default_doc="the first objective's, else the metric's natural mode", applies=("asha",)),
    Field("brackets", POS_INT, None,
          "asynchronous Hyperband brackets, bracket s judging first at grace_epochs x reduction_factor^s; at most "
          "one per rung below train.epochs", default_doc="3 for moasha (fewer where fewer rungs fit), 1 for asha",
          applies=RUNGS),
)
SchedulerSpec = section_spec("SchedulerSpec", SCHEDULER_FIELDS, __name__,
                             "The scheduler section (SCHEDULER_FIELDS); brackets None: the default (bracket_count).",
                             Rungs)
_WORKER_DOCS = {"workers_per_trial": ("Ray Train workers (DDP ranks) per trial", 1),
                "cpus_per_worker": ("CPUs each worker holds", 1.0),
                "gpus_per_worker": ("GPUs each worker holds; 1: NCCL DDP with bf16 autocast", 0.0)}
RESOURCES_FIELDS = table(
    *(Field(name, check, _WORKER_DOCS[name][1], _WORKER_DOCS[name][0]) for name, check in WORKER_RESOURCES),
    Field("max_concurrent_trials", POSITIVE_OR_AUTO, "auto",
          "trials at once; auto: what fits the nodes present, or the node types an autoscaler can add"),
    Field("placement_strategy", one_of(*PLACEMENTS), "PACK",
          "Ray placement of a trial's workers; STRICT_PACK keeps them on one node"),
    Field("max_failures", NONNEG_INT, 3,
          "recoveries of a trial from a lost process (a worker, the trial's own process), from its last "
          "checkpoint"),
)
ResourcesSpec = section_spec("ResourcesSpec", RESOURCES_FIELDS, __name__, "The resources section (RESOURCES_FIELDS).")
CHECKPOINTS_FIELDS = table(
    Field("keep", one_of(*KEEP_POLICIES), "front",
          "what an ended trial keeps: front, the weights of the completed trials on the front; all, every "
          "checkpoint; none, nothing"),
)
CheckpointsSpec = section_spec("CheckpointsSpec", CHECKPOINTS_FIELDS, __name__,
                               "The checkpoints section (CHECKPOINTS_FIELDS; search.campaign.retention).")


def as_mapping(raw, c: Collector, path: str, what: str) -> dict | None:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        c.expected(path, what, raw)
        return None
    return dict(raw)


def parse_section_keys(raw: dict, section: str, c: Collector) -> dict:
    """Check each key of a campaign-file section against its declaration (spaces.keys); fill defaults."""
    table = section_keys(section)
    c.unknown_keys(section, raw, table)
    out = {}
    for name, key in table.items():
        if raw.get(name) is not None:
            value = dimensions.check_value(key.check, raw[name], c, f"{section}.{name}")
            out[name] = key.default if value is dimensions.ABSENT else value
        else:
            out[name] = key.default
    return out


def section_path(message: str) -> str:
    """``"<trial key>: ..."`` (a ConfigError) -> ``"<section>.<section key>: ..."`` where the key has a section."""
    name, sep, rest = message.partition(":")
    key = KEYS.get(name)
    if not sep or key is None or key.section is None:
        return message
    return f"{key.section}.{key.section_key or key.name}:{rest}"


def parse_name(raw, c: Collector) -> str:
    if raw is MISSING:
        c.add("name", "required (it names the experiment folder under storage)")
    elif not isinstance(raw, str) or not NAME_RE.match(raw):
        c.expected("name", "letters, digits, '.', '_' or '-' (it names the experiment folder)", raw)
    return raw if isinstance(raw, str) else ""


def parse_model(raw, c: Collector) -> ModelSpec:
    raw = as_mapping(raw, c, "model", "a mapping (name, img_size, num_classes, ...)")
    if raw is None:
        return ModelSpec(None)
    return ModelSpec(**parse_section_keys(raw, "model", c))


def parse_data(raw, c: Collector) -> DataSpec:
    raw = as_mapping(raw, c, "data", "a mapping (dataset, path, val_fraction)")
    if raw is None:
        return DataSpec()
    return DataSpec(**parse_section_keys(raw, "data", c))


def parse_train(raw, c: Collector):
    raw = as_mapping(raw, c, "train", "a mapping of training keys (epochs, batch_size, lr, ...)")
    if raw is None:
        return TrainSpec()
    for key in REQUIRED_TRAIN_KEYS:
        if raw.get(key) is None:
            c.add(f"train.{key}", "required (the number of epochs every trial trains for)")
    return TrainSpec(**parse_section_keys(raw, "train", c))


def parse_objectives(raw, c: Collector) -> list[Objective]:
    if raw is None:
        return list(DEFAULT_OBJECTIVES)
    if not isinstance(raw, list) or not raw:
        c.expected("objectives", "a non-empty list of {metric, mode}", raw)
        return []
    out, seen = [], set()
    for i, item in enumerate(raw):
        path = f"objectives[{i}]"
        if isinstance(item, str):
            item = {"metric": item}
        if not isinstance(item, Mapping):
            c.expected(path, "a mapping {metric, mode} or a metric name", item)
            continue
        c.unknown_keys(path, item, ("metric", "mode"))
        metric = item.get("metric")
        if metric not in METRICS:
            staged = isinstance(metric, str) and (metric in STAGE_METRICS or metric.startswith(FINETUNE_METRIC))
            c.add(f"{path}.metric", f"expected one of {', '.join(METRICS)}, given {show(metric)}"
                  + (" (a stage metric: list it under stages.objectives; the searcher learns pretraining metrics)"
                     if staged else hint(metric, METRICS, list_known=False) if isinstance(metric, str) else ""))
            continue
        mode = item.get("mode", METRICS[metric])
        if mode not in ("max", "min"):
            c.expected(f"{path}.mode", "max or min", mode)
            continue
        if metric in seen:
            c.add(f"{path}.metric", f"duplicate objective {show(metric)}")
        seen.add(metric)
        out.append(Objective(metric, mode))
    return out


def parse_constraints(raw, c: Collector) -> list[Constraint]:
    raw = as_mapping(raw, c, "constraints", "a mapping {cost metric: {max: x} or {min: x}}")
    out = []
    for metric, bound in (raw or {}).items():
        path = f"constraints.{metric}"
        if metric not in COST_METRICS:
            why = " (constraints are checked before training)" if metric in METRICS else hint(metric, COST_METRICS)
            c.add(path, f"expected a cost metric ({', '.join(COST_METRICS)}), given {show(metric)}{why}")
            continue
        if not isinstance(bound, Mapping) or not bound:
            c.expected(path, "{max: number} and/or {min: number}", bound)
            continue
        c.unknown_keys(path, bound, ("max", "min"))
        values = {}
        for side in ("max", "min"):
            if side in bound:
                if not is_number(bound[side]):
                    c.expected(f"{path}.{side}", "a number", bound[side])
                elif problem := bound_problem(metric, float(bound[side]), side):
                    c.add(f"{path}.{side}", problem)
                else:
                    values[side] = float(bound[side])
        if "max" in values and "min" in values and values["min"] > values["max"]:
            c.add(path, f"expected min <= max, given min {values['min']:g} > max {values['max']:g}")
        if values:
            out.append(Constraint(metric, values.get("max"), values.get("min")))
    return out


def parse_scheduler(raw, objectives: list[Objective], train, c: Collector) -> SchedulerSpec:
    """The scheduler section. ``brackets`` (asha, moasha): Hyperband brackets, bracket s judging
    trials first at grace_epochs * reduction_factor**s; at most one per rung that fits below
    train.epochs. Left out (stored as None) it takes SchedulerSpec.bracket_count's default: 3 for
    moasha (see there: measured with benchmarks/bench_search.py), 1 for asha (Ray's). None rather than
    the number keeps a spec that shrinks train.epochs (smoke_test) valid."""
    raw = as_mapping(raw, c, "scheduler", "a mapping (type, grace_epochs, reduction_factor, brackets)")
    if raw is None:
        return SchedulerSpec()
    fields = SCHEDULER_FIELDS
    c.unknown_keys("scheduler", raw, fields)
    kind = dimensions.check_value(fields["type"].check, raw.get("type", fields["type"].default), c, "scheduler.type")

    def only_for(name: str, why):   # a field of some types only, given for another: refused, saying why
        def read(given, c: Collector, path: str):
            if given is not None and kind not in fields[name].applies:
                if kind is not dimensions.ABSENT:  # an invalid type has its own message
                    c.add(path, why(given))
                return fields[name].default
            return fields[name].read(raw, c, "scheduler")
        return read

    def objectives_instead(_) -> str:
        return f"applies to type asha only ({kind} uses the objectives)"

    values = read_table(raw, fields, c, "scheduler", type=lambda *_: "fifo" if kind is dimensions.ABSENT else kind,
                        metric=only_for("metric", objectives_instead), mode=only_for("mode", objectives_instead),
                        brackets=only_for("brackets", lambda given: f"expected no brackets for type {kind} (they "
                                                                    f"apply to asha and moasha), given {given}"))
    grace, factor, brackets, epochs = (values["grace_epochs"], values["reduction_factor"], values["brackets"],
                                       train.epochs)
    if kind in RUNGS and epochs is not None and grace > epochs:
        c.add("scheduler.grace_epochs", f"expected at most train.epochs ({epochs}), given {grace}")
    elif kind in RUNGS and brackets is not None and epochs is not None:
        rungs = SchedulerSpec.rung_epochs(grace, factor, epochs)
        if brackets > max(1, len(rungs)):
            listed = ", ".join(map(str, rungs)) or "none"
            c.add("scheduler.brackets", f"expected at most {max(1, len(rungs))} (one per rung below train.epochs "
                                        f"{epochs}: epochs {listed}), given {brackets}")
    if kind == "moasha" and objectives and not any(ranked_by(o.metric) in SCHEDULER_METRICS for o in objectives):
        c.add("scheduler.type", "moasha stops trials on training metrics, but every objective is known "
                                "before training; add e.g. {metric: top1, mode: max} or use fifo")
    if kind == "asha" and raw.get("metric") is None:   # asha's metric and mode: the objectives' unless given
        values["metric"], values["mode"] = _asha_target(objectives, values["mode"], c)
    elif kind == "asha" and values["metric"] is not None and values["mode"] is None:
        values["mode"] = METRICS[values["metric"]]
    return SchedulerSpec(**values)


def _asha_target(objectives, mode, c: Collector):
    """asha's metric and mode when the file names no metric: the first objective's (top1 for top1_q)."""
    if not objectives:
        return None, None
    metric = ranked_by(objectives[0].metric)   # top1_q: its rungs rank on top1
    if metric not in SCHEDULER_METRICS:
        c.add("scheduler.metric", f"asha stops trials on a training metric; the first objective {metric} "
                                  f"is known before training (set scheduler.metric)")
        return None, None
    return metric, mode or objectives[0].mode


def parse_resources(raw, c: Collector) -> ResourcesSpec:
    raw = as_mapping(raw, c, "resources", "a mapping (workers_per_trial, cpus_per_worker, ...)")
    if raw is None:
        return ResourcesSpec()
    c.unknown_keys("resources", raw, RESOURCES_FIELDS)
    return ResourcesSpec(**read_table(raw, RESOURCES_FIELDS, c, "resources", max_concurrent_trials=_concurrency(raw)))


def _concurrency(raw: dict):
    """resources.max_concurrent_trials: null is refused here (not taken as the default), "auto" being a value
    of its own."""
    row = RESOURCES_FIELDS["max_concurrent_trials"]

    def read(_, c: Collector, path: str):
        value = dimensions.check_value(row.check, raw.get(row.name, "auto"), c, path)
        return row.default if value is dimensions.ABSENT else value

    return read


def parse_worker_resources(raw, where: str, names: tuple[str, ...], c: Collector) -> FrozenMap:
    """A phase's own ``resources`` (a stage's, the supernet's): a subset of ``names`` (spaces.schema.WORKER_RESOURCES),
    each checked as the resources section checks it."""
    if raw is None:
        return FrozenMap()
    if not isinstance(raw, Mapping):
        c.expected(where, f"a mapping ({', '.join(names)})", raw)
        return FrozenMap()
    c.unknown_keys(where, raw, names)
    out = {}
    for name, check in WORKER_RESOURCES:
        if name in names and raw.get(name) is not None:
            value = dimensions.check_value(check, raw[name], c, f"{where}.{name}")
            if value is not dimensions.ABSENT:
                out[name] = value
    return FrozenMap(out)


def parse_checkpoints(raw, c: Collector) -> CheckpointsSpec:
    """What ended trials keep of their checkpoints (spaces.schema.KEEP_POLICIES; search.campaign.retention)."""
    raw = as_mapping(raw, c, "checkpoints", "a mapping (keep: " + " | ".join(KEEP_POLICIES) + ")")
    if raw is None:
        return CheckpointsSpec()
    c.unknown_keys("checkpoints", raw, CHECKPOINTS_FIELDS)
    return CheckpointsSpec(**read_table(raw, CHECKPOINTS_FIELDS, c, "checkpoints"))


def parse_storage(raw, c: Collector) -> str:
    if not isinstance(raw, str) or not raw.strip():
        c.expected("storage", "a local path or a URI (s3://, gs://, file://)", raw)
        return "results/"
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", raw)
    if scheme and scheme.group(1).lower() not in STORAGE_SCHEMES:
        c.expected("storage", "a local path or a URI with scheme " + ", ".join(f"{s}://" for s in STORAGE_SCHEMES),
                   raw)
    return raw


def dataset_defaults(model: ModelSpec, data: DataSpec, train, c: Collector) -> ModelSpec:
    """img_size / num_classes from the dataset, and the rules that tie model keys to the data
    (spaces.datasets.fill_from_dataset, the rule every trial config goes through)."""
    flat = {**flatten("model", model.as_dict()), **flatten("data", data.as_dict()),
            "augment": train.augment, "randaugment": train.randaugment}
    try:
        fill_from_dataset(flat)
    except ConfigError as err:
        c.add("", section_path(str(err)))
        return model
    return replace(model, img_size=flat["img_size"], num_classes=flat.get("num_classes"))


def cross_check(train, space: Space, resources: ResourcesSpec, c: Collector) -> None:
    """Checks that span sections (run only when every section parsed cleanly)."""
    if train.warmup_epochs > train.epochs:
        c.add("train.warmup_epochs", f"expected at most train.epochs ({train.epochs}), given {train.warmup_epochs:g}")
    workers = resources.workers_per_trial
    mixing = {k: max(_values_of(k, getattr(train, k), space), key=lambda v: v or 0) for k in ("mixup", "cutmix")}
    for batch in _values_of("batch_size", train.batch_size, space):
        for bpw in _values_of("batch_per_worker", train.batch_per_worker, space):
            try:
                batch_plan({"batch_size": batch, "batch_per_worker": bpw, **mixing}, workers)
            except ConfigError as err:
                c.add("", f"train.{err}")


def _values_of(key: str, base, space: Space) -> list:
    """The values a train key can take over the space (base value where the space leaves it unset)."""
    possible = dimensions.possible_values(key, space.dimensions, space.variants)
    if possible is None:  # a range: checked per trial by the trainer
        return [base]
    return list(dict.fromkeys(base if v is dimensions.ABSENT else v for v in possible))


def optional(raw: dict, key: str, check, default, c: Collector, section: str):
    if raw.get(key) is None:
        return default
    value = dimensions.check_value(check, raw[key], c, f"{section}.{key}")
    return default if value is dimensions.ABSENT else value
