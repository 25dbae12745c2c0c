"""The validated campaign spec: frozen dataclasses, built only by spaces.loader.

Every section keeps what the YAML said after normalisation (defaults filled in, ints given for
float keys turned into floats, conditions the loader implies made explicit), so
``load_campaign(spec.to_dict()) == spec``. Values compare by type as well as value where it
matters: ``hidden_width: 1`` (one unit) and ``hidden_width: 1.0`` (the token dim) differ.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any

from qkvsearch.spaces.checks import NONNEG_NUM, POS_INT, POS_NUM
from qkvsearch.spaces.keys import section_keys


class FrozenMap(Mapping):
    """A read-only dict that pickles (Ray ships specs between processes) and hashes."""

    __slots__ = ("_data",)

    def __init__(self, data=()):
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self) -> Iterator:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name, value):
        raise AttributeError("FrozenMap is read-only")

    def __reduce__(self):
        return (FrozenMap, (self._data,))

    def __hash__(self):
        return hash(tuple(sorted((k, tagged(v)) for k, v in self._data.items())))

    def __eq__(self, other):
        if not isinstance(other, Mapping) or set(self) != set(other):
            return False
        return all(tagged(self[k]) == tagged(other[k]) for k in self)

    def __repr__(self):
        return f"FrozenMap({self._data!r})"


def tagged(value):
    """A comparison key that tells 1 from 1.0 and True from 1 (both matter for hidden_width & co)."""
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(tagged(v) for v in value))
    return (type(value).__name__, value)


def plain(value):
    """Tuples and FrozenMaps -> lists and dicts, for JSON."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _section_dataclass(section: str, doc: str):
    """A frozen dataclass with one field per key of a campaign-file section (spaces.keys.KEYS)."""

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in section_keys(section)}

    cls = make_dataclass(
        f"{section.capitalize()}Spec",
        [(name, Any, field(default=key.default)) for name, key in section_keys(section).items()],
        frozen=True, namespace={"as_dict": as_dict, "__doc__": doc})
    cls.__module__ = __name__   # so it pickles (make_dataclass takes module= only from Python 3.12)
    return cls


# One field per key of the section; defaults filled by the loader (img_size and num_classes from the data).
ModelSpec = _section_dataclass("model", "The model section: model keys of spaces.keys.KEYS.")
DataSpec = _section_dataclass("data", "The data section: data keys of spaces.keys.KEYS.")
TrainSpec = _section_dataclass("train", "The train section: training keys of spaces.keys.KEYS.")


@dataclass(frozen=True)
class Dimension:
    """One searched key. kind: choice | grid (values) or int | float (low..high, log-uniform if log)."""

    key: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    when: FrozenMap = field(default_factory=FrozenMap)   # key -> tuple of values that switch this key on

    @property
    def enumerable(self) -> bool:
        return self.kind in ("choice", "grid")

    def active(self, config: Mapping) -> bool:
        """Whether this key takes a value given the keys decided so far (absent keys switch it off)."""
        for key, allowed in self.when.items():
            if key not in config or tagged(config[key]) not in {tagged(a) for a in allowed}:
                return False
        return True

    def to_dict(self) -> dict:
        if self.enumerable:
            out: dict = {self.kind: list(self.values)}
        else:
            out = {self.kind: [self.low, self.high]}
            if self.log:
                out["log"] = True
        if self.when:
            out["when"] = {k: list(v) for k, v in self.when.items()}
        return out


@dataclass(frozen=True)
class Space:
    """Searched keys. A trial takes one variant (a dict of fixed keys; one empty variant when none are
    given) and one value per active dimension; dimensions come after the keys their conditions name."""

    dimensions: tuple[Dimension, ...] = ()
    variants: tuple[FrozenMap, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        seen = [k for v in self.variants for k in v] + [d.key for d in self.dimensions]
        return tuple(dict.fromkeys(seen))

    @property
    def enumerable(self) -> bool:
        return all(d.enumerable for d in self.dimensions)

    def dimension(self, key: str) -> Dimension | None:
        return next((d for d in self.dimensions if d.key == key), None)

    def to_dict(self) -> dict:
        out: dict = {d.key: d.to_dict() for d in self.dimensions}
        if self.variants:
            out["variants"] = [dict(v) for v in self.variants]
        return out


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str                           # max | min


DEFAULT_OBJECTIVES = (Objective("top1", "max"),)   # a spec without objectives maximises top-1


@dataclass(frozen=True)
class Constraint:
    """A bound on a cost metric, checked from the config alone before a trial trains."""

    metric: str
    max: float | None = None
    min: float | None = None

    def violation(self, value: float) -> str | None:
        if self.max is not None and value > self.max:
            return f"{self.metric} {value:g} > max {self.max:g}"
        if self.min is not None and value < self.min:
            return f"{self.metric} {value:g} < min {self.min:g}"
        return None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("max", "min") if getattr(self, k) is not None}


def added_up(*groups) -> tuple[Constraint, ...]:
    """Every bound of every group of constraints, one Constraint per metric (in the order the metrics first
    come): where several bound a metric, the tighter bound of each side wins (the least max, the greatest
    min), so a group added to another can narrow it, never widen it."""
    out: dict[str, Constraint] = {}
    for c in (c for group in groups for c in group):
        was = out.get(c.metric)
        if was is None:
            out[c.metric] = c
            continue
        maxes = [v for v in (was.max, c.max) if v is not None]
        mins = [v for v in (was.min, c.min) if v is not None]
        out[c.metric] = Constraint(c.metric, min(maxes) if maxes else None, max(mins) if mins else None)
    return tuple(out.values())


@dataclass(frozen=True)
class SearchSpec:
    algorithm: str                      # grid | random | tpe | nsga2 | gp | ehvi
    num_trials: int                     # grid: grid size x repeats
    seed: int = 0
    population_size: int | None = None  # nsga2 only
    repeats: int = 1                    # each configuration runs this many times (seeds seed, seed + 1, ...)
    n_startup_trials: int | None = None  # gp, ehvi: random trials before the Gaussian process leads
    warm_start: str | None = None       # an earlier campaign folder (or URI) whose results the searcher learns first
    front_repeats: int = 1              # once the search ends, runs of each configuration on its front

    def to_dict(self) -> dict:
        out = vars_of(self)
        for key, default in (("repeats", 1 if self.algorithm != "grid" else None), ("front_repeats", 1),
                             ("population_size", None), ("n_startup_trials", None), ("warm_start", None)):
            if out[key] == default:
                out.pop(key)
        return out


@dataclass(frozen=True)
class SchedulerSpec:
    type: str = "fifo"                  # fifo | asha | moasha
    grace_epochs: int = 1
    reduction_factor: int = 3
    metric: str | None = None           # asha: the metric it stops on (default: first objective)
    mode: str | None = None
    brackets: int | None = None         # asha/moasha: Hyperband brackets; None: the default (bracket_count)

    # Not fields (no annotation): the defaults of ``brackets``, see bracket_count.
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
        bracket s rf**(2 s) shares of the trials, see search/scheduling/moasha.py and benchmarks/README.md). At half the full grid's
        epochs, MO-ASHA with 3 brackets keeps 0.98 / 0.99 of the grid's hypervolume when curves keep
        their order and 0.97 / 0.97 when larger models learn slower and overtake, where 1 bracket keeps
        0.97 / 0.99 and 0.70 / 0.81, and 2 brackets 0.99 / 1.00 and 0.85 / 0.93. On curves that keep
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


# What one Train run asks of Ray: a trial's, and a stage's that sets its own (spaces.stages).
WORKER_RESOURCES = (("workers_per_trial", POS_INT), ("cpus_per_worker", POS_NUM), ("gpus_per_worker", NONNEG_NUM))


@dataclass(frozen=True)
class ResourcesSpec:
    workers_per_trial: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_concurrent_trials: int | str = "auto"
    placement_strategy: str = "PACK"
    max_failures: int = 3               # recoveries of a trial from a lost process (worker, trial driver)


# What an ended trial keeps of its checkpoints (search.campaign.retention). front: the weights, without
# optimizer or scheduler state, of the completed trials on the Pareto front of the objectives, nothing for
# the rest; all: every checkpoint as training left it (resumable); none: nothing. A trial that may still run
# (running, interrupted, one Tune may restart) keeps what resuming it needs under every policy.
KEEP_POLICIES = ("front", "all", "none")


@dataclass(frozen=True)
class CheckpointsSpec:
    keep: str = "front"                 # one of KEEP_POLICIES



@dataclass(frozen=True)
class MeasureSpec:
    """The campaign file's ``measure`` section (spaces.measure parses it): how measured cost is measured."""

    batch: int = 64                     # images a forward for throughput
    latency_batch: int = 1              # images a forward for latency_ms
    metrics: tuple[str, ...] = ()       # measured metrics recorded besides those objectives and constraints name
    cache: str | None = None            # folder or URI of measurements; None: <campaign folder>/qs_measurements
    max_s: float = 10.0                 # seconds of timing one metric may take (caps the ±1 % rule)
    resources: FrozenMap = FrozenMap()  # Ray resources of the node measurements run on ({}: the trials' kind)
    predict_after: int | None = None    # shapes measured before a fitted model predicts the rest (one-shot)

    def to_dict(self) -> dict:  # the fields added later only when set: earlier campaign files read back unchanged
        return {k: v for k, v in vars_of(self).items() if v or k not in ("resources", "predict_after")}


SECTIONS = ("name", "description", "model", "data", "train", "space", "objectives", "constraints",
            "search", "scheduler", "resources", "checkpoints", "storage", "tracking", "stages", "measure",
            "supernet", "targets")


@dataclass(frozen=True)
class SupernetSpec:
    """The campaign file's ``supernet`` section (spaces.supernet parses it): one-shot search. Empty (falsy):
    a campaign that trains every configuration it proposes."""

    recipe: FrozenMap = FrozenMap()     # train keys of the supernet's training (its epochs at least)
    random_subnets: int = 2             # random subnets per update besides the sandwich
    distill: bool = True                # in-place distillation from the largest subnet
    bn_batches: int = 2                 # training batches a subnet's BatchNorm is recalibrated on
    retrain: str = "front"              # front | top_k: which evaluated subnets train on their own
    top_k: int | None = None
    control: int = 16                   # configurations drawn from the space, retrained twice: the ranking's check
    source: str | None = None           # ``from``: a campaign folder whose trained supernet is searched
    retrain_from: str = "scratch"       # scratch | inherited: where the chosen subnets' training starts
    resources: FrozenMap = FrozenMap()  # WORKER_RESOURCES name -> value: the supernet's run's, replacing the campaign's

    def __bool__(self) -> bool:
        return bool(self.recipe) or self.source is not None

    def to_dict(self) -> dict:
        out = {"train": plain(self.recipe), "random_subnets": self.random_subnets, "distill": self.distill,
               "bn_batches": self.bn_batches, "retrain": self.retrain, "control": self.control}
        if self.top_k is not None:
            out["top_k"] = self.top_k
        if self.retrain_from != "scratch":  # campaign files written before the setting read back unchanged
            out["retrain_from"] = self.retrain_from
        if self.source is not None:
            out["from"] = self.source
        if self.resources:
            out["resources"] = plain(self.resources)
        return out


# ---------------------------------------------------------------- the stages after training (spaces.stages)
@dataclass(frozen=True)
class FinetuneStage:
    dataset: str
    path: str | None
    recipe: FrozenMap                    # trial key -> value: what replaces the trial's own keys
    resources: FrozenMap = FrozenMap()   # WORKER_RESOURCES name -> value: what replaces the campaign's

    @property
    def name(self) -> str:
        return f"finetune@{self.dataset}"

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, **({"path": self.path} if self.path else {}), **plain(self.recipe),
                **({"resources": plain(self.resources)} if self.resources else {})}


@dataclass(frozen=True)
class OODSet:
    name: str
    format: str
    path: str | None = None


@dataclass(frozen=True)
class OODStage:
    in_distribution: str
    datasets: tuple[OODSet, ...]
    score: str = "msp"
    resources: FrozenMap = FrozenMap()   # cpus_per_worker, gpus_per_worker of its one task
    name = "ood"

    def to_dict(self) -> dict:
        return {"in_distribution": self.in_distribution, "score": self.score,
                "datasets": [{k: v for k, v in vars(s).items() if v is not None} for s in self.datasets],
                **({"resources": plain(self.resources)} if self.resources else {})}


@dataclass(frozen=True)
class StagesSpec:
    finetune: tuple[FinetuneStage, ...] = ()
    ood: OODStage | None = None
    select: str = "front"
    top_k: int | None = None
    objectives: tuple[Objective, ...] = ()
    constraints: tuple[Constraint, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.finetune or self.ood)

    def to_dict(self) -> dict:
        out: dict = {"finetune": [f.to_dict() for f in self.finetune], "select": self.select,
                     "objectives": [vars(o) for o in self.objectives],
                     "constraints": {c.metric: c.to_dict() for c in self.constraints}}
        if self.ood is not None:
            out["ood"] = self.ood.to_dict()
        if self.top_k is not None:
            out["top_k"] = self.top_k
        return out


@dataclass(frozen=True)
class CampaignSpec:
    name: str
    model: ModelSpec
    data: DataSpec
    train: Any                          # TrainSpec
    space: Space
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...] = ()
    search: SearchSpec = field(default_factory=lambda: SearchSpec("random", 1))
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    storage: str = "results/"
    description: str = ""
    source: str | None = field(default=None, compare=False)   # the file it came from, for messages
    checkpoints: CheckpointsSpec = field(default_factory=CheckpointsSpec)
    tracking: FrozenMap = field(default_factory=FrozenMap)  # tracker -> its settings (spaces.tracking.TRACKERS)
    stages: StagesSpec = field(default_factory=StagesSpec)  # empty: none (spaces.stages parses it)
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    supernet: SupernetSpec = field(default_factory=SupernetSpec)
    targets: tuple = ()                 # spaces.targets.TargetSpec: the deployment targets a supernet serves

    def to_dict(self) -> dict:
        """Plain JSON-able dict in the YAML grammar; load_campaign(spec.to_dict()) == spec."""
        return {
            "name": self.name,
            "description": self.description,
            "model": self.model.as_dict(),
            "data": self.data.as_dict(),
            "train": self.train.as_dict(),
            "space": self.space.to_dict(),
            "objectives": [vars_of(o) for o in self.objectives],
            "constraints": {c.metric: c.to_dict() for c in self.constraints},
            "search": self.search.to_dict(),
            "scheduler": vars_of(self.scheduler),
            "resources": vars_of(self.resources),
            "checkpoints": vars_of(self.checkpoints),
            "storage": self.storage,
            **({"tracking": plain(self.tracking)} if self.tracking else {}),
            **({"measure": self.measure.to_dict()} if self.measure != MeasureSpec() else {}),
            **({"stages": self.stages.to_dict()} if self.stages else {}),
            **({"supernet": self.supernet.to_dict()} if self.supernet else {}),
            **({"targets": [t.to_dict() for t in self.targets]} if self.targets else {}),
        }

    def violations(self, cost: Mapping[str, float]) -> list[str]:
        """Constraint violations of one trial's cost (trainers.model.cost.model_cost output); [] = feasible."""
        return violations(self.constraints, cost)


def violations(constraints, cost: Mapping[str, float]) -> list[str]:
    """The messages of the constraints a cost (trainers.model.cost.model_cost output) breaks; [] = feasible.
    A metric the cost lacks is not judged yet: a measured one (spaces.metrics.MEASURED) is known only once
    the trial's device has measured it (trainers.deploy.measure), and is checked there, before training."""
    found = (c.violation(float(cost[c.metric])) for c in constraints if c.metric in cost)
    return [v for v in found if v]


def vars_of(obj) -> dict:
    return {k: plain(v) for k, v in vars(obj).items()}
