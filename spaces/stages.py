"""The campaign file's ``stages`` section: what the configurations that pretraining selects go on to do.

    stages:
      finetune:                              # one stage per dataset, each from the trial's final checkpoint
        - {dataset: cifar10, path: /data/cifar10, epochs: 1000, lr: 5.0e-5, img_size: 224, batch_size: 512}
      ood:                                   # scores a finetune stage's model on its test set and OOD sets
        in_distribution: cifar10             # a finetune stage's dataset
        datasets:
          - {name: svhn, format: imagefolder, path: /data/svhn}   # format: OOD_FORMATS
          - {name: noise, format: noise}
        score: msp                           # msp | energy | max_logit
        resources: {gpus_per_worker: 1}      # optional, a stage's own (finetune: also workers_per_trial)
      select: front                          # front (default) | top_k | as_completed: configurations going on
      top_k: 3                               # select top_k: that many, by non-dominated rank
      objectives: [{metric: fpr95, mode: min}, {metric: gmacs, mode: min}]   # the final front
      constraints: {fpr95: {max: 40}}        # bounds on stage metrics (the final front keeps what meets them)

A finetune recipe sets train-section keys (spaces.keys.KEYS; ``epochs`` required) and ``img_size``; the
rest comes from the trial's own config. A stage's ``resources`` (spaces.schema.WORKER_RESOURCES) replace the
campaign's for that stage only; they are not part of what a stage's result is keyed by. Stage metrics are
declared in spaces.keys (STAGE_METRICS, FINETUNE_METRIC); the campaign's own objectives stay those of
pretraining, which the searcher learns.
A campaign without the section has no stages (``StagesSpec()``, empty) and runs as it always did.
"""
from __future__ import annotations

from collections.abc import Mapping

from qkvsearch.spaces.checks import POS_INT, TEXT, Bad, Check, is_number, one_of
from qkvsearch.spaces.datasets import DATASET_INFO
from qkvsearch.spaces.errors import Collector, hint, show
from qkvsearch.spaces.fields import Field, choice, table
from qkvsearch.spaces.keys import KEYS, section_keys
from qkvsearch.spaces.metrics import (
    COST_METRICS,
    FINETUNE_METRIC,
    METRICS,
    OOD_METRICS,
    STAGE_METRIC_LIST,
    STAGE_METRICS,
    TRANSFER_AVG,
    bound_problem,
)
from qkvsearch.spaces.schema import (  # noqa: F401  (the stage specs: named by campaigns' pickles here)
    WORKER_RESOURCES,
    Constraint,
    FinetuneStage,
    FrozenMap,
    Objective,
    OODSet,
    OODStage,
    StagesSpec,
)
from qkvsearch.spaces.sections import parse_worker_resources

OOD_SCORES = ("msp", "energy", "max_logit")
OOD_FORMATS = ("imagefolder", "cifar10", "cifar100", "stl10", "noise", "digits_heldout")
OOD_EMBEDDED = ("noise", "digits_heldout")   # need no path
# front: the pretraining front once every trial has ended; top_k: by non-dominated rank then; as_completed:
# a trial on the front of those completed so far, at once, beside the campaign's other trials.
SELECTIONS = ("front", "top_k", "as_completed")
# A finetune recipe: train keys by their section names, and the input size.
RECIPE_KEYS = {**section_keys("train"), "img_size": KEYS["img_size"]}
_WORKERS = tuple(n for n, _ in WORKER_RESOURCES)
OOD_WORKERS = ("cpus_per_worker", "gpus_per_worker")   # an OOD stage is one task

# The section's fields and those of its parts (spaces.fields); defaults: the stage specs'. A finetune recipe also
# takes RECIPE_KEYS (spaces.keys.KEYS).
STAGES_FIELDS = table(
    Field("finetune", "a list of recipes {dataset, path, epochs, lr, ...}", [],
          "one fine-tuning per dataset, each from the trial's final checkpoint with a new head",
          example=[{"dataset": "digits", "epochs": 1}]),
    Field("ood", "a mapping (in_distribution, datasets, score)", None,
          "scores a finetune stage's model on its test set against each OOD set", default_doc="null (no OOD stage)",
          example={"in_distribution": "digits_0to8", "datasets": [{"format": "noise"}]}),
    Field("select", choice(*SELECTIONS), StagesSpec.select,
          "which configurations go on: the pretraining front once every trial has ended, the top_k by "
          "non-dominated rank, or each trial on the front of those completed so far, at once"),
    Field("top_k", Check("a positive int (select top_k)", "positive ints", POS_INT.fn), StagesSpec.top_k,
          "how many configurations go on, by non-dominated rank", default_doc="null (required with select: top_k)",
          applies=("top_k",)),
    Field("objectives", "a non-empty list of {metric, mode}", None, "the final front's objectives (stage metrics "
                                                                    "or pretraining metrics)",
          default_doc="the stages' headline metrics",
          example=[{"metric": "transfer_avg", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]),
    Field("constraints", "a mapping {stage metric: {max: x} or {min: x}}", {},
          "bounds on stage metrics: the final front keeps the configurations that meet them",
          example={"transfer_avg": {"min": 10}}),
)
FINETUNE_STAGE_FIELDS = table(
    Field("dataset", one_of(*DATASET_INFO), None, "the dataset fine-tuned on (one stage per dataset)",
          required=True),
    Field("path", "a folder path", None, "the dataset's root folder", default_doc="null (required where the "
                                                                             "dataset is read from files)"),
    Field("resources", f"a mapping ({', '.join(_WORKERS)})", {},
          "the stage's own resources, replacing the campaign's for this stage", default_doc="{} (the campaign's)",
          example={"cpus_per_worker": 2}),
)
OOD_STAGE_FIELDS = table(
    Field("in_distribution", "the dataset of a finetune stage", None, "whose fine-tuned model is scored",
          required=True, example="digits"),
    Field("datasets", "a non-empty list of {name, format, path}", None, "the OOD sets", required=True,
          example=[{"format": "digits_heldout"}]),
    Field("score", choice(*OOD_SCORES), OODStage.score, "the in-distribution score: maximum softmax probability, "
                                                         "energy, or maximum logit"),
    Field("resources", f"a mapping ({', '.join(OOD_WORKERS)})", {}, "the stage's own resources",
          default_doc="{} (the campaign's)", example={"cpus_per_worker": 2}),
)
OOD_SET_FIELDS = table(
    Field("name", "a name no other OOD set has", None, "the set's name in results", default_doc="the format"),
    Field("format", choice(*OOD_FORMATS), None, "how the set is read; noise and digits_heldout are made, not read",
          required=True),
    Field("path", "a folder path", OODSet.path, "the set's folder",
          default_doc="null (required unless the format is " + " or ".join(OOD_EMBEDDED) + ")"),
)
FINETUNE_FIELDS = (*FINETUNE_STAGE_FIELDS, *RECIPE_KEYS)
OOD_FIELDS = tuple(OOD_STAGE_FIELDS)
STAGE_METRIC_STAGE = {m.name: m.stage for m in STAGE_METRIC_LIST}   # stage metric -> the stage measuring it


def result_settings(stage) -> dict:
    """What a stage's result depends on (its settings without the resources it ran on): part of its key."""
    return {k: v for k, v in stage.to_dict().items() if k != "resources"}


def stage_metric_mode(metric, finetune_datasets) -> str | None:
    """A metric's natural mode when the stages can report it (or a pretraining metric), else None."""
    if not isinstance(metric, str):
        return None
    if metric.startswith(FINETUNE_METRIC):
        return "max" if metric[len(FINETUNE_METRIC):] in finetune_datasets else None
    return STAGE_METRICS.get(metric) or METRICS.get(metric)


def _unmeasured(metric: str, finetune, ood) -> str | None:
    """Why no stage of the campaign measures stage metric ``metric`` (its stage is absent), or None."""
    stage = "finetune" if metric.startswith(FINETUNE_METRIC) else STAGE_METRIC_STAGE.get(metric)
    if (stage == "ood" and ood is None) or (stage == "finetune" and not finetune):
        present = [f"{FINETUNE_METRIC}<dataset>", TRANSFER_AVG] if finetune else []
        present += list(OOD_METRICS) if ood is not None else []
        return (f"expected a metric of a stage the campaign has ({', '.join(present) or 'none'}, or a pretraining "
                f"metric), given {show(metric)}, which the {stage} stage measures: stages has no {stage} section")
    return None


def parse_stages(raw, c: Collector) -> StagesSpec:
    """The stages section -> StagesSpec (empty when absent or null); problems go to ``c``, named by path."""
    keys = tuple(STAGES_FIELDS)
    raw = c.section("stages", raw, keys, f"a mapping ({', '.join(keys)})")
    if raw is None:
        return StagesSpec()
    finetune = _parse_finetune(raw.get("finetune"), c)
    datasets = [f.dataset for f in finetune]
    ood = _parse_ood(raw.get("ood"), datasets, c) if raw.get("ood") is not None else None
    select, top_k = _parse_selection(raw, c)
    objectives = _parse_objectives(raw.get("objectives"), finetune, ood, c)
    constraints = _parse_constraints(raw.get("constraints"), finetune, ood, c)
    if (objectives or constraints or "select" in raw) and not (finetune or ood):
        c.add("stages", "expected a finetune or an ood stage for the stage objectives and selection, given none")
    return StagesSpec(tuple(finetune), ood, select, top_k, tuple(objectives), tuple(constraints))


def _parse_finetune(raw, c: Collector) -> list[FinetuneStage]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        c.expected("stages.finetune", STAGES_FIELDS["finetune"].expected, raw)
        return []
    out, seen = [], set()
    for i, item in enumerate(raw):
        path = f"stages.finetune[{i}]"
        if not isinstance(item, Mapping):
            c.expected(path, "a mapping {dataset, path, epochs, lr, ...}", item)
            continue
        c.unknown_keys(path, item, FINETUNE_FIELDS)
        dataset = item.get("dataset")
        if not isinstance(dataset, str) or dataset not in DATASET_INFO:
            c.add(f"{path}.dataset", f"expected {FINETUNE_STAGE_FIELDS['dataset'].expected}, given {show(dataset)}"
                  + (hint(dataset, DATASET_INFO, list_known=False) if isinstance(dataset, str) else ""))
            continue
        if dataset in seen:
            c.add(f"{path}.dataset", f"expected one finetune stage per dataset, given {dataset} twice")
        seen.add(dataset)
        data_path = _path(item.get("path"), DATASET_INFO[dataset].needs_path, f"{path}.path", dataset, c)
        if item.get("epochs") is None:
            c.add(f"{path}.epochs", "required (the epochs of this fine-tuning)")
        recipe = {}
        for name, key in RECIPE_KEYS.items():
            if item.get(name) is not None:
                try:
                    recipe[key.name] = key.check(item[name])
                except Bad as bad:
                    c.expected(f"{path}.{name}", bad.expected or key.check.expected, item[name])
        resources = parse_worker_resources(item.get("resources"), f"{path}.resources", _WORKERS, c)
        out.append(FinetuneStage(dataset, data_path, FrozenMap(recipe), resources))
    return out


def _path(value, needed: bool, where: str, what: str, c: Collector) -> str | None:
    if value is None:
        if needed:
            c.add(where, f"required for {what} (the folder holding its files)")
        return None
    try:
        return TEXT(value)
    except Bad:
        c.expected(where, OOD_SET_FIELDS["path"].expected, value)
        return None


def _parse_ood(raw, finetune_datasets: list[str], c: Collector) -> OODStage | None:
    if not isinstance(raw, Mapping):
        c.expected("stages.ood", STAGES_FIELDS["ood"].expected, raw)
        return None
    c.unknown_keys("stages.ood", raw, OOD_FIELDS)
    ind = raw.get("in_distribution")
    if ind not in finetune_datasets:
        given = ", ".join(finetune_datasets) or "no finetune stage"
        c.add("stages.ood.in_distribution", f"expected the dataset of a finetune stage ({given}), given {show(ind)}")
    score = raw.get("score", OOD_STAGE_FIELDS["score"].default)
    if score not in OOD_SCORES:
        c.expected("stages.ood.score", OOD_STAGE_FIELDS["score"].expected, score)
    sets = raw.get("datasets")
    if not isinstance(sets, list) or not sets:
        c.expected("stages.ood.datasets", OOD_STAGE_FIELDS["datasets"].expected, sets)
        return None
    out = []
    for i, item in enumerate(sets):
        path = f"stages.ood.datasets[{i}]"
        if not isinstance(item, Mapping):
            c.expected(path, "a mapping {name, format, path}", item)
            continue
        c.unknown_keys(path, item, OOD_SET_FIELDS)
        fmt = item.get("format")
        if fmt not in OOD_FORMATS:
            c.expected(f"{path}.format", OOD_SET_FIELDS["format"].expected, fmt)
            continue
        name = item.get("name", fmt)
        if not isinstance(name, str) or not name.strip() or name in [s.name for s in out]:
            c.expected(f"{path}.name", OOD_SET_FIELDS["name"].expected, name)
            continue
        out.append(OODSet(name, fmt, _path(item.get("path"), fmt not in OOD_EMBEDDED, f"{path}.path", fmt, c)))
    resources = parse_worker_resources(raw.get("resources"), "stages.ood.resources", OOD_WORKERS, c)
    return OODStage(str(ind), tuple(out), score, resources)


def _parse_selection(raw: Mapping, c: Collector) -> tuple[str, int | None]:
    fields = STAGES_FIELDS
    select, top_k = raw.get("select", fields["select"].default), raw.get("top_k")
    if select not in SELECTIONS:
        c.expected("stages.select", fields["select"].expected, select)
        return fields["select"].default, None
    if select == "top_k":
        try:
            fields["top_k"].check(top_k)
        except Bad:
            c.expected("stages.top_k", fields["top_k"].expected, top_k)
            return select, None
    elif top_k is not None:
        c.add("stages.top_k", f"expected null unless select is top_k, given {show(top_k)}")
    return select, top_k


def _parse_objectives(raw, finetune, ood, c: Collector) -> list[Objective]:
    datasets = [f.dataset for f in finetune]
    if raw is None:  # default: the stages' headline numbers
        present = {"finetune": bool(finetune), "ood": ood is not None}
        return [Objective(m.name, m.mode) for m in STAGE_METRIC_LIST if m.default and present[m.stage]]
    if not isinstance(raw, list) or not raw:
        c.expected("stages.objectives", STAGES_FIELDS["objectives"].expected, raw)
        return []
    out = []
    for i, item in enumerate(raw):
        path = f"stages.objectives[{i}]"
        item = {"metric": item} if isinstance(item, str) else item
        if not isinstance(item, Mapping):
            c.expected(path, "a mapping {metric, mode} or a metric name", item)
            continue
        c.unknown_keys(path, item, ("metric", "mode"))
        metric = item.get("metric")
        mode = stage_metric_mode(metric, datasets)
        if mode is None:
            known = [*STAGE_METRICS, *(FINETUNE_METRIC + d for d in datasets), *METRICS]
            c.expected(f"{path}.metric", "one of " + ", ".join(known), metric)
            continue
        if problem := _unmeasured(metric, finetune, ood):
            c.add(f"{path}.metric", problem)
            continue
        mode = item.get("mode", mode)
        if mode not in ("max", "min"):
            c.expected(f"{path}.mode", "max or min", mode)
            continue
        if metric in [o.metric for o in out]:
            c.add(f"{path}.metric", f"duplicate objective {show(metric)}")
        out.append(Objective(metric, mode))
    return out


def _parse_constraints(raw, finetune, ood, c: Collector) -> list[Constraint]:
    datasets = [f.dataset for f in finetune]
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        c.expected("stages.constraints", STAGES_FIELDS["constraints"].expected, raw)
        return []
    out = []
    for metric, bound in raw.items():
        path = f"stages.constraints.{metric}"
        if metric in COST_METRICS or stage_metric_mode(metric, datasets) is None or metric in METRICS:
            c.expected(path, "a stage metric (" + ", ".join([*STAGE_METRICS, FINETUNE_METRIC + "<dataset>"])
                       + "; cost bounds go in constraints)", metric)
            continue
        if problem := _unmeasured(metric, finetune, ood):
            c.add(path, problem)
            continue
        if not isinstance(bound, Mapping) or not bound or set(bound) - {"max", "min"} \
                or not all(is_number(v) for v in bound.values()):
            c.expected(path, "{max: number} and/or {min: number}", bound)
            continue
        problems = [(side, p) for side, v in bound.items() if (p := bound_problem(metric, float(v), side))]
        for side, problem in problems:
            c.add(f"{path}.{side}", problem)
        if problems:
            continue
        out.append(Constraint(metric, *(float(bound[k]) if k in bound else None for k in ("max", "min"))))
    return out


def smoke_stages(stages: dict, batch_size: int, steps: int) -> dict:
    """A stages section (StagesSpec.to_dict()) shrunk for a smoke test: every fine-tuning 1 epoch of
    ``steps`` updates of ``batch_size`` images, no warm-up."""
    out = dict(stages)
    out["finetune"] = [{**f, "epochs": 1, "max_steps_per_epoch": steps, "batch_size": batch_size,
                        "batch_per_worker": None, "warmup_epochs": 0} for f in stages.get("finetune", [])]
    return out
