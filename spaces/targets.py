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
``accelerator`` a target measures on the device the trials use, as a campaign of trials does. A target's measurements are cached apart from the other targets' (<measure.cache>/targets/<name>).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from qkvsearch.spaces.blocks import base_key
from qkvsearch.spaces.checks import FLAG
from qkvsearch.spaces.choices import FULL_PRECISION, PRECISION_CHOICES
from qkvsearch.spaces.errors import Collector, show
from qkvsearch.spaces.fields import Field, table
from qkvsearch.spaces.keys import QUANT_KEYS
from qkvsearch.spaces.measure import ray_resources
from qkvsearch.spaces.schema import Constraint, FrozenMap, Objective, added_up, plain
from qkvsearch.spaces.sections import parse_constraints, parse_objectives
from qkvsearch.spaces.supernet import check_served

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")   # a folder name on every filesystem and bucket
ACCELERATOR = "accelerator_type:"   # + the type: the resource Ray gives a node of that accelerator
ACCELERATOR_SHARE = 0.001           # what a measurement asks of it: a mark of the node, not a device
DEVICE_RESOURCES = ("CPU", "GPU")   # Ray's own; every other name is a custom resource or an accelerator type
TARGET_FIELDS = table(
    Field("name", "a name of lower-case letters, digits, _ and - (48 at most)", None,
          "the target's name: its folder under <campaign>/targets/", required=True),
    Field("resources", "a mapping {Ray resource: amount}", {},
          "the Ray resources of the node its measurements run on (GPU: 1 measures on a GPU)",
          default_doc="{} (the trials' device)"),
    Field("accelerator", "an accelerator type (a string, e.g. A100)", None,
          "a node of that accelerator type (Ray's accelerator_type resource)"),
    Field("precisions", f"a list of precisions ({', '.join(PRECISION_CHOICES)})", [],
          "the quantization precisions it runs: the space's quantization keys are cut to these",
          default_doc="[] (every one the space has)"),
    Field("constraints", "a mapping {cost metric: {max: x} or {min: x}}", {},
          "its constraints, added to the campaign's: on a metric both bound, the tighter bound wins"),
    Field("objectives", "a list of {metric, mode}", [], "its objectives", default_doc="the campaign's"),
    Field("retrain", FLAG, False, "its chosen subnets train on their own (the supernet section's retrain, "
                                  "top_k and control)"),
)


@dataclass(frozen=True)
class TargetSpec:
    """One deployment target (module docstring)."""

    name: str
    resources: FrozenMap = FrozenMap()          # Ray resource -> amount; CPU and GPU among them
    precisions: tuple[str, ...] = ()            # (): every precision of the space
    constraints: tuple[Constraint, ...] = ()    # added to the campaign's (spaces.schema.added_up)
    objectives: tuple[Objective, ...] = ()      # (): the campaign's
    retrain: bool = False

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.resources:
            out["resources"] = plain(self.resources)
        if self.precisions:
            out["precisions"] = list(self.precisions)
        if self.constraints:
            out["constraints"] = {c.metric: c.to_dict() for c in self.constraints}
        if self.objectives:
            out["objectives"] = [{"metric": o.metric, "mode": o.mode} for o in self.objectives]
        if self.retrain:
            out["retrain"] = True
        return out


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
        name = item.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            c.expected(f"{where}.name", TARGET_FIELDS["name"].expected, name)
        elif name in names:
            c.add(f"{where}.name", f"expected a name no other target has, given {show(name)} twice")
        names.add(name)
        # left out or null: the campaign's; anything else is the target's own (an empty list is refused)
        objectives = tuple(_within(where, c, parse_objectives, item["objectives"])) \
            if item.get("objectives") is not None else ()
        _within(where, c, lambda objs, sub: check_served(objs, None, sub), objectives)
        out.append(TargetSpec(
            str(name), _resources(item, where, c), _precisions(item.get("precisions"), f"{where}.precisions", c),
            tuple(_within(where, c, parse_constraints, item.get("constraints") or {})), objectives,
            TARGET_FIELDS["retrain"].read(item, c, where)))
    return tuple(out)


def _within(where: str, c: Collector, parse, raw):
    """A campaign section's parser run on a target's field: its messages named under the target."""
    sub = Collector()
    value = parse(raw, sub)
    c.errors += [f"{where}.{e}" for e in sub.errors]
    c.warnings += [f"{where}.{w}" for w in sub.warnings]
    return value


def _resources(item: dict, where: str, c: Collector) -> FrozenMap:
    out = dict(ray_resources(item.get("resources"), f"{where}.resources", c))
    accelerator = item.get("accelerator")
    if accelerator is not None:
        if not isinstance(accelerator, str) or not accelerator.strip():
            c.expected(f"{where}.accelerator", TARGET_FIELDS["accelerator"].expected, accelerator)
        else:
            out[ACCELERATOR + accelerator.strip()] = ACCELERATOR_SHARE
    return FrozenMap(out)


def _precisions(raw, where: str, c: Collector) -> tuple[str, ...]:
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
                                                  f"({', '.join(map(str, values))}), given {', '.join(target.precisions)}")
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
