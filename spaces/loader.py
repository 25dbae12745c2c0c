"""Campaign YAML -> validated CampaignSpec: the file read (spaces.reading), each section checked
(spaces.sections, spaces.search_options, spaces.dimensions, spaces.stages, spaces.tracking, spaces.measure),
then the checks across sections.

Every problem in a file is collected and raised together as one SpecError (a ValueError), each
message naming the field path, e.g. ``search.algorithm: expected one of grid, random, tpe, nsga2,
given "bayes" (did you mean "tpe"?)``.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import names_as_given
from qkvsearch.spaces.errors import Collector, SpecError, show
from qkvsearch.spaces.measure import parse_measure
from qkvsearch.spaces.reading import apply_overrides, check_size, read_spec_file, size_problem
from qkvsearch.spaces.schema import SECTIONS
from qkvsearch.spaces.search_options import parse_search
from qkvsearch.spaces.sections import (
    MISSING,
    cross_check,
    dataset_defaults,
    parse_checkpoints,
    parse_constraints,
    parse_data,
    parse_model,
    parse_name,
    parse_objectives,
    parse_resources,
    parse_scheduler,
    parse_storage,
    parse_train,
)
from qkvsearch.spaces.spec import CampaignSpec
from qkvsearch.spaces.stages import parse_stages
from qkvsearch.spaces.supernet import check_served, check_shareable, parse_supernet
from qkvsearch.spaces.targets import check_targets, parse_targets
from qkvsearch.spaces.tracking import parse_tracking

log = logging.getLogger(__name__)


def load_campaign(source, overrides: Sequence[str] = (), *, check_names: bool = True) -> CampaignSpec:
    """A campaign YAML path (or preset name, or an already-parsed dict) -> validated, frozen CampaignSpec.

    overrides: "key.path=value" strings applied before validation (values parsed as YAML).
    check_names=False takes timm model and optimizer names as given (a spec read back from a campaign that
    was checked at launch): validation then imports neither timm nor torch.
    Raises SpecError listing every problem found.
    """
    with names_as_given(not check_names):
        return _load_campaign(source, overrides)


def read_stored_spec(raw: Mapping) -> tuple[CampaignSpec, tuple[str, ...]]:
    """A spec as a campaign file stores it (``spec.to_dict()``), read by load_campaign's rules as far as it
    goes, names taken as given: (the spec, the problems found). Where a file is partial or another version
    of qkvsearch wrote it, each key with a problem holds its default, and the problems name the keys
    (``_section_failed`` tells which sections have one); a valid spec reads as load_campaign reads it."""
    if not isinstance(raw, Mapping):
        raw = {}
    c = Collector()
    with names_as_given():
        problem = size_problem(raw)
        raw = {} if problem else copy.deepcopy(dict(raw))
        spec = _build(raw, c, None, partial=True)
    return spec, tuple(([problem] if problem else []) + list(c.errors))


def _load_campaign(source, overrides: Sequence[str]) -> CampaignSpec:
    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(source, Mapping):
        check_size(source, None)   # before deepcopy, which recurses and copies
        raw, where, default_name = copy.deepcopy(dict(source)), None, None
    else:
        raw, where, default_name = read_spec_file(source)
    c = Collector()
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError([f"{where or 'the spec'}: expected a mapping of sections ({', '.join(SECTIONS)}), "
                         f"given {show(raw)}"], where)
    apply_overrides(raw, overrides, c)
    if "name" not in raw and default_name:
        raw["name"] = default_name
    spec = _build(raw, c, where)
    c.raise_if_any(where)
    for warning in c.warnings:
        log.warning("%s", f"{where}: {warning}" if where else warning)
    return spec


def _build(raw: dict, c: Collector, source, partial: bool = False) -> CampaignSpec | None:
    """The spec, or None when ``c`` holds errors; ``partial``: the spec as far as it reads, errors or not."""
    c.unknown_keys("", raw, SECTIONS)
    name = parse_name(raw.get("name", MISSING), c)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        c.expected("description", "a string", description)
    model = parse_model(raw.get("model"), c)
    data = parse_data(raw.get("data"), c)
    train = parse_train(raw.get("train"), c)
    space = dimensions.parse_space(raw.get("space"), c)
    objectives = parse_objectives(raw.get("objectives"), c)
    constraints = parse_constraints(raw.get("constraints"), c)
    search = parse_search(raw.get("search"), space, c, objectives)
    scheduler = parse_scheduler(raw.get("scheduler"), objectives, train, c)
    resources = parse_resources(raw.get("resources"), c)
    checkpoints = parse_checkpoints(raw.get("checkpoints"), c)
    storage = parse_storage(raw.get("storage", "results/"), c)
    tracking = parse_tracking(raw.get("tracking"), storage, c)
    measure = parse_measure(raw.get("measure"), c)
    stages = parse_stages(raw.get("stages"), c)
    supernet = parse_supernet(raw.get("supernet"), c)
    targets = parse_targets(raw.get("targets"), c)
    if targets and not supernet:
        c.add("targets", "only with a supernet section (one supernet serves the targets; a campaign of trials "
                         "measures on the trials' device)")
    check_targets(targets, space, constraints, c)
    if supernet:
        check_shareable(space, c)
        check_served(objectives, raw.get("scheduler"), c)
        for section, present in (("stages", bool(stages)), ("search.warm_start", bool(search.warm_start))):
            if present:
                c.add(section, "not with a supernet (one-shot search scores subnets, then retrains the chosen)")
        for section, value in (("search.repeats", search.repeats), ("search.front_repeats", search.front_repeats)):
            if value > 1:
                c.add(section, "not with a supernet: a subnet's inherited score does not depend on the seed (one-shot "
                               "search retrains its control subnets under two seeds: supernet.control)")
    given_name = isinstance(raw.get("model"), Mapping) and raw["model"].get("name") is not None
    if model.name is None and not given_name and "model" not in space.keys:
        c.add("model.name", "required (a timm model name, e.g. xcit_nano_12_p16_224)")
    model = dataset_defaults(model, data, train, c)  # also with errors elsewhere: it reads only these sections
    if partial:
        return CampaignSpec(name, model, data, train, space, tuple(objectives), tuple(constraints), search,
                            scheduler, resources, storage, description if isinstance(description, str) else "",
                            checkpoints=checkpoints, tracking=tracking, measure=measure, stages=stages,
                            supernet=supernet, targets=targets)
    if c.errors:
        return None
    cross_check(train, space, resources, c)
    if c.errors:
        return None
    return CampaignSpec(name, model, data, train, space, tuple(objectives), tuple(constraints), search,
                        scheduler, resources, storage, description, source, checkpoints, tracking, stages,
                        measure=measure, supernet=supernet, targets=targets)

