"""A field of a campaign-file section is one row of its table (spaces.fields): given a value other than its default
in a campaign file, every declared field reaches the parsed spec, and the spec's sections made from their tables
hold one attribute per row and write each back."""
from __future__ import annotations

import copy

import pytest

from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.errors import SpecError
from qkvsearch.spaces.measure import MEASURE_FIELDS, MeasureSpec
from qkvsearch.spaces.reference import SECTION_TABLES
from qkvsearch.spaces.search_options import SEARCH_FIELDS, SearchSpec
from qkvsearch.spaces.sections import (
    CHECKPOINTS_FIELDS,
    RESOURCES_FIELDS,
    SCHEDULER_FIELDS,
    CheckpointsSpec,
    ResourcesSpec,
    SchedulerSpec,
)
from qkvsearch.spaces.supernet import SUPERNET_FIELDS, SupernetSpec
from qkvsearch.spaces.targets import TARGET_FIELDS, TargetSpec

BASE = {"name": "f", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"}, "train": {"epochs": 9, "batch_size": 16},
        "space": {"embedding": {"choice": ["sne", "fsne"]}, "hidden_width": {"choice": [0.5, 1.0]}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "random", "num_trials": 8}, "storage": "/tmp"}
ONESHOT = {"supernet": {"train": {"epochs": 1}}}
FINETUNE = {"stages": {"finetune": [{"dataset": "digits_0to8", "epochs": 1}]}}
OOD = {"stages": {"finetune": [{"dataset": "digits_0to8", "epochs": 1}, {"dataset": "digits", "epochs": 1}],
                  "ood": {"in_distribution": "digits_0to8", "datasets": [{"format": "noise"}]}}}
# Each table: where its mapping is in a campaign file (a path of keys; 0: the list's first item), what else the
# file needs for it to apply, and the field that selects what its other fields apply to.
WHERE = {
    "search": (("search",), {}, "algorithm"),
    "scheduler": (("scheduler",), {}, "type"),
    "resources": (("resources",), {}, None),
    "checkpoints": (("checkpoints",), {}, None),
    "measure": (("measure",), {}, None),
    "supernet": (("supernet",), ONESHOT, "retrain"),
    "targets[]": (("targets", 0), {**ONESHOT, "targets": [{"name": "t"}]}, None),
    "stages": (("stages",), FINETUNE, "select"),
    "stages.finetune[]": (("stages", "finetune", 0), FINETUNE, None),
    "stages.ood": (("stages", "ood"), OOD, None),
    "stages.ood.datasets[]": (("stages", "ood", "datasets", 0), OOD, None),
    **{f"tracking.{name}": (("tracking", name), {"tracking": {name: {}}}, None)
       for name in ("mlflow", "wandb", "tensorboard", "optuna")},
}
# What a field's other values need beside them in the file.
NEEDS = {("supernet", "retrain"): {"top_k": 2}}
# Values a check may take, tried in turn for a field without an example. A field that takes words (a list, a
# mapping) declares its example.
TRIED = (True, False, 2, 3, 5, 0.5, 2.0, "results/elsewhere")


def _at(raw: dict, path: tuple, value: dict | None = None) -> dict:
    """The mapping at ``path`` in a campaign file (made where absent); ``value``: set there first."""
    node = raw
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(key, int):
            if not node:
                node.append({})
            if last and value is not None:
                node[key] = value
            node = node[key]
        else:
            if last and value is not None:
                node[key] = value
            node = node.setdefault(key, [] if isinstance(path[i + 1 : i + 2] and path[i + 1], int) else {})
    return node


def _parsed(table: str, fields: dict) -> object:
    path, needs, selector = WHERE[table]
    raw = copy.deepcopy({**BASE, **needs})
    _at(raw, path).update(fields)
    if selector and selector in fields and table == "search" and fields[selector] == "grid":
        raw["search"].pop("num_trials", None)   # a grid's trials are its points
    return load_campaign(raw, check_names=False)


def _candidates(field) -> list:
    if field.example is not None:
        return [field.example]
    options = list(field.check.options) if field.check is not None else []
    return options + list(TRIED)


CASES = [(table, f) for table, fields in SECTION_TABLES.items() for f in fields.values()]


def test_every_table_has_a_place_in_a_campaign_file():
    assert set(SECTION_TABLES) == set(WHERE), "tell WHERE where the new table's mapping is"


@pytest.mark.parametrize(("table", "field"), CASES, ids=[f"{t}.{f.name}" for t, f in CASES])
def test_every_declared_field_given_another_value_reaches_the_parsed_spec(table, field):
    _, _, selector = WHERE[table]
    also = {selector: field.applies[0]} if field.applies and selector else {}
    specs, refused = [], []
    for value in [None, *_candidates(field)]:   # None: the field left out
        given = {} if value is None else {**NEEDS.get((table, field.name), {}), field.name: value}
        try:
            specs.append(_parsed(table, {**also, **given}))
        except SpecError as err:
            refused.append(f"{value!r}: {err.errors}")
    assert len(specs) >= 2, f"{table}.{field.name}: no value other than its default was accepted ({refused})"
    assert any(s != specs[0] for s in specs[1:]), \
        f"{table}.{field.name}: every value the file gave it parsed to the same spec (none reached it)"


SPECS = [(SchedulerSpec, SCHEDULER_FIELDS), (ResourcesSpec, RESOURCES_FIELDS), (CheckpointsSpec, CHECKPOINTS_FIELDS),
         (MeasureSpec, MEASURE_FIELDS), (SupernetSpec, SUPERNET_FIELDS), (SearchSpec, SEARCH_FIELDS),
         (TargetSpec, TARGET_FIELDS)]


@pytest.mark.parametrize(("spec", "fields"), SPECS, ids=[s.__name__ for s, _ in SPECS])
def test_a_spec_made_from_its_table_has_one_attribute_per_row_and_writes_each_back(spec, fields):
    assert list(spec.__dataclass_fields__) == [f.key for f in fields.values()]
    assert all(getattr(spec(), f.key) == f.default for f in fields.values())
    written = set(spec().to_dict())
    assert written == {f.name for f in fields.values() if not f.added_later}   # at their defaults
