"""What a validated campaign spec (spaces.spec.CampaignSpec) is made of: frozen values (FrozenMap), the specs of
the sections of trial keys (from spaces.keys.KEYS), the space, objectives and constraints, and the stages'
specs. The sections of fields have their specs beside their tables (spaces.fields.section_spec: spaces.sections,
spaces.search_options, spaces.measure, spaces.supernet, spaces.targets).

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


def constraints_file(constraints) -> dict:
    """Constraints as a campaign file writes them: {metric: {max: x, min: y}}."""
    return {c.metric: c.to_dict() for c in constraints}


def objectives_file(objectives) -> list[dict]:
    """Objectives as a campaign file writes them: [{metric, mode}, ...]."""
    return [{"metric": o.metric, "mode": o.mode} for o in objectives]


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


# What one Train run asks of Ray: a trial's, and a stage's that sets its own (spaces.stages).
WORKER_RESOURCES = (("workers_per_trial", POS_INT), ("cpus_per_worker", POS_NUM), ("gpus_per_worker", NONNEG_NUM))


# What an ended trial keeps of its checkpoints (search.campaign.retention). front: the weights, without
# optimizer or scheduler state, of the completed trials on the Pareto front of the objectives, nothing for
# the rest; all: every checkpoint as training left it (resumable); none: nothing. A trial that may still run
# (running, interrupted, one Tune may restart) keeps what resuming it needs under every policy.
KEEP_POLICIES = ("front", "all", "none")


SECTIONS = ("name", "description", "model", "data", "train", "space", "objectives", "constraints",
            "search", "scheduler", "resources", "checkpoints", "storage", "tracking", "stages", "measure",
            "supernet", "targets")


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


def violations(constraints, cost: Mapping[str, float]) -> list[str]:
    """The messages of the constraints a cost (trainers.model.cost.model_cost output) breaks; [] = feasible.
    A metric the cost lacks is not judged yet: a measured one (spaces.metrics.MEASURED) is known only once
    the trial's device has measured it (trainers.deploy.measure), and is checked there, before training."""
    found = (c.violation(float(cost[c.metric])) for c in constraints if c.metric in cost)
    return [v for v in found if v]


def vars_of(obj) -> dict:
    return {k: plain(v) for k, v in vars(obj).items()}


# Declared since where their tables are (and CampaignSpec in spaces.spec): the names earlier versions pickled
# (a campaign's tuner.pkl holds its spec) and earlier scripts import from here.
_MOVED = {"CampaignSpec": "spec", "SearchSpec": "search_options", "SchedulerSpec": "sections",
          "ResourcesSpec": "sections", "CheckpointsSpec": "sections", "MeasureSpec": "measure",
          "SupernetSpec": "supernet"}


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"qkvsearch.spaces.{_MOVED[name]}"), name)
