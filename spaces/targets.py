"""The campaign file's ``targets`` section: the deployment targets one supernet serves (one-shot search). The
supernet is trained once (or taken with ``supernet.from``); each target then has its own scoring and search
under its own constraints and objectives, its measured costs measured where it runs, its own chosen subnets,
exported, and optionally retrained (search.campaign.oneshot.targets).

    targets:
      - name: phone                     # its folder: <campaign>/targets/phone
        resources: {arm_node: 1}        # Ray resources of the node its measurements run on (custom resources
                                        # as `ray start --resources` declares them; GPU: 1 measures on a GPU)
        accelerator: A100               # or: a node of that accelerator type (Ray's accelerator_type)
        precisions: [fp, int8_dynamic]  # the quantization precisions it runs (spaces.choices.PRECISION_CHOICES)
        constraints: {latency_ms: {max: 5}}         # added to the campaign's, which every target keeps
        objectives: [top1, latency_ms]  # default: the campaign's
        retrain: true                   # its chosen subnets train on their own (supernet.retrain, top_k, control)

A target's constraints add up with the campaign's (spaces.schema.added_up): on a metric both bound, the tighter
bound wins, so a target can narrow the campaign's bounds, never widen them. Without ``resources`` or
``accelerator`` a target measures on the device the trials use, as a campaign of trials does. A target's
measurements are cached apart from the other targets' (<measure.cache>/targets/<name>).
"""
from __future__ import annotations

import re
from dataclasses import replace

from qkvsearch.spaces.blocks import base_key
from qkvsearch.spaces.checks import FLAG
from qkvsearch.spaces.choices import FULL_PRECISION, PRECISION_CHOICES
from qkvsearch.spaces.errors import Collector, show
from qkvsearch.spaces.fields import Field, read_table, section_spec, table
from qkvsearch.spaces.keys import QUANT_KEYS
from qkvsearch.spaces.measure import ray_resources
from qkvsearch.spaces.schema import FrozenMap, added_up, constraints_file, objectives_file
from qkvsearch.spaces.sections import parse_constraints, parse_objectives
from qkvsearch.spaces.supernet import check_served

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")   # a folder name on every filesystem and bucket
ACCELERATOR = "accelerator_type:"   # + the type: the resource Ray gives a node of that accelerator
ACCELERATOR_SHARE = 0.001           # what a measurement asks of it: a mark of the node, not a device
DEVICE_RESOURCES = ("CPU", "GPU")   # Ray's own; every other name is a custom resource or an accelerator type
# The fields of a target (spaces.fields), and its spec made of them; all but its name written back only when set.
TARGET_FIELDS = table(
    Field("name", "a name of lower-case letters, digits, _ and - (48 at most)", None,
          "the target's name: its folder under <campaign>/targets/", required=True, example="edge"),
    Field("resources", "a mapping {Ray resource: amount}", FrozenMap(),
          "the Ray resources of the node its measurements run on (GPU: 1 measures on a GPU)",
          default_doc="{} (the trials' device)", example={"edge_node": 1}, added_later=True),
    Field("accelerator", "an accelerator type (a string, e.g. A100)", None,
          "a node of that accelerator type (Ray's accelerator_type resource)", example="A100", added_later=True),
    Field("precisions", f"a list of precisions ({', '.join(PRECISION_CHOICES)})", (),
          "the quantization precisions it runs: the space's quantization keys are cut to these",
          default_doc="[] (every one the space has)", example=["fp"], added_later=True),
    Field("constraints", "a mapping {cost metric: {max: x} or {min: x}}", (),
          "its constraints, added to the campaign's: on a metric both bound, the tighter bound wins",
          default_doc="{}", example={"params_m": {"max": 5.0}}, added_later=True),
    Field("objectives", "a list of {metric, mode}", (), "its objectives", default_doc="the campaign's",
          example=[{"metric": "top1", "mode": "max"}, {"metric": "params_m", "mode": "min"}], added_later=True),
    Field("retrain", FLAG, False, "its chosen subnets train on their own (the supernet section's retrain, "
                                  "top_k and control)", added_later=True),
)


class _Placed:
    def node_resources(self) -> dict[str, float]:
        """What a node its measurements run on must have: its ``resources``, and a mark of its accelerator."""
        return {**self.resources, **({ACCELERATOR + self.accelerator: ACCELERATOR_SHARE} if self.accelerator else {})}


TargetSpec = section_spec("TargetSpec", TARGET_FIELDS, __name__, "One deployment target (module docstring).",
                          _Placed, written={"constraints": constraints_file, "objectives": objectives_file})


def parse_targets(raw, c: Collector) -> tuple[TargetSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        c.expected("targets", "a non-empty list of targets (each a mapping with a name)", raw)
        return ()
    out, names = [], set()
    for i, item in enumerate(raw):
        where = f"targets[{i}]"
        item = c.section(where, item, TARGET_FIELDS, f"a mapping ({', '.join(TARGET_FIELDS)})")
        if item is None:
            continue

        def name(given, c: Collector, path: str) -> str:
            if not isinstance(given, str) or not NAME.match(given):
                c.expected(path, TARGET_FIELDS["name"].expected, given)
            elif given in names:
                c.add(path, f"expected a name no other target has, given {show(given)} twice")
            names.add(given)
            return str(given)

        def objectives(given, c: Collector, path: str, where=where) -> tuple:
            # left out or null: the campaign's; anything else is the target's own (an empty list is refused)
            found = tuple(_within(where, c, parse_objectives, given)) if given is not None else ()
            _within(where, c, lambda objs, sub: check_served(objs, None, sub), found)
            return found

        out.append(TargetSpec(**read_table(
            item, TARGET_FIELDS, c, where, name=name, resources=ray_resources, accelerator=_accelerator,
            precisions=_precisions, objectives=objectives,
            constraints=lambda given, c, path, where=where: tuple(_within(where, c, parse_constraints, given or {})))))
    return tuple(out)


def _within(where: str, c: Collector, parse, raw):
    """A campaign section's parser run on a target's field: its messages named under the target."""
    sub = Collector()
    value = parse(raw, sub)
    c.errors += [f"{where}.{e}" for e in sub.errors]
    c.warnings += [f"{where}.{w}" for w in sub.warnings]
    return value


def _accelerator(given, c: Collector, path: str) -> str | None:
    if given is None:
        return None
    if not isinstance(given, str) or not given.strip():
        c.expected(path, TARGET_FIELDS["accelerator"].expected, given)
        return None
    return given.strip()


def _precisions(raw, c: Collector, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        c.expected(where, TARGET_FIELDS["precisions"].expected, raw)
        return ()
    for i, p in enumerate(raw):
        if p not in PRECISION_CHOICES:
            c.expected(f"{where}[{i}]", f"one of {', '.join(PRECISION_CHOICES)}", p)
    return tuple(dict.fromkeys(p for p in raw if p in PRECISION_CHOICES))


def check_targets(targets, space, constraints, c: Collector) -> None:
    """Each target's precisions leave its space a subnet: every quantization key the space sets keeps a value;
    its constraints, added to the campaign's, leave each metric a value (no min above its max)."""
    for i, target in enumerate(targets):
        for both in added_up(constraints, target.constraints):
            if both.max is not None and both.min is not None and both.min > both.max:
                c.add(f"targets[{i}].constraints.{both.metric}",
                      f"expected bounds that, added to the campaign's, leave {both.metric} a value, given "
                      f"min {both.min:g} > max {both.max:g} (the tighter bound of each side wins)")
        if not target.precisions:
            continue
        for key, values in _quant_values(space).items():
            if not set(values) & set(target.precisions):
                c.add(f"targets[{i}].precisions", f"expected precisions the space's {key} takes "
                                                  f"({', '.join(map(str, values))}), "
                                                  f"given {', '.join(target.precisions)}")
        if not _quant_values(space) and FULL_PRECISION not in target.precisions:
            c.add(f"targets[{i}].precisions", f"expected {FULL_PRECISION} among them: the space searches no "
                                              f"precision, so its subnets run in {FULL_PRECISION}")


def _quant_values(space) -> dict[str, tuple]:
    """Quantization key -> the values the space gives it (its dimensions' and its variants')."""
    out: dict[str, list] = {}
    for d in space.dimensions:
        if base_key(d.key) in QUANT_KEYS:
            out.setdefault(d.key, []).extend(d.values)
    for v in space.variants:
        for k, value in v.items():
            if base_key(k) in QUANT_KEYS:
                out.setdefault(k, []).append(value)
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


def target_space(space, precisions: tuple[str, ...]):
    """The space cut to a target's precisions (all of it when the target names none)."""
    if not precisions:
        return space
    dims = tuple(replace(d, values=tuple(v for v in d.values if v in precisions))
                 if base_key(d.key) in QUANT_KEYS else d for d in space.dimensions)
    variants = tuple(v for v in space.variants
                     if all(value in precisions for k, value in v.items() if base_key(k) in QUANT_KEYS))
    return replace(space, dimensions=dims, variants=variants)
