"""Campaign YAML -> validated CampaignSpec; flat trial configs; smoke-test copies.

Every problem in a file is collected and raised together as one SpecError (a ValueError), each
message naming the field path, e.g. ``search.algorithm: expected one of grid, random, tpe, nsga2,
given "bayes" (did you mean "tpe"?)``.
"""
from __future__ import annotations

import copy
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.errors import Collector, SpecError, clip, hint, show
from qkvsearch.spaces.keys import (
    CHECK_NAMES,
    COST_METRICS,
    COUNTED_METRICS,
    FINETUNE_METRIC,
    KEYS,
    METRICS,
    NONNEG_INT,
    POS_INT,
    REQUIRED_TRAIN_KEYS,
    SCHEDULER_METRICS,
    STAGE_METRICS,
    ConfigError,
    batch_plan,
    fill_from_dataset,
    flatten,
    integer,
    is_number,
    one_of,
    section_keys,
)
from qkvsearch.spaces.measure import parse_measure
from qkvsearch.spaces.schema import (
    DEFAULT_OBJECTIVES,
    KEEP_POLICIES,
    SECTIONS,
    WORKER_RESOURCES,
    CampaignSpec,
    CheckpointsSpec,
    Constraint,
    DataSpec,
    ModelSpec,
    Objective,
    ResourcesSpec,
    SchedulerSpec,
    SearchSpec,
    Space,
    TrainSpec,
)
from qkvsearch.spaces.stages import parse_stages
from qkvsearch.spaces.tracking import parse_tracking

PRESET_DIR = Path(__file__).parent / "presets"
ALGORITHMS = ("grid", "random", "tpe", "nsga2", "gp", "ehvi")
# What `qkvsearch simulate --searcher` offers: the campaign's algorithms but grid, and shuffle (every
# recorded curve once, in an order drawn from the seed).
SIMULATED_SEARCHERS = ("shuffle", *(a for a in ALGORITHMS if a != "grid"))
GP_STARTUP_TRIALS = 10  # gp: random trials before the Gaussian process leads (Optuna's default)
TRIAL_SCHEDULERS = ("fifo", "asha", "moasha")   # not the learning-rate schedules (spaces.keys.LR_SCHEDULES)
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs")
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MISSING = object()
MAX_FILE_BYTES = 1 << 20   # a campaign file is a few KB; this bounds reading and parsing time
MAX_DEPTH = 100            # nesting levels (a spec needs about 6)
MAX_NODES = 100_000        # values in a spec, counted as if every alias were copied out

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- YAML


class _TooBig(yaml.MarkedYAMLError):
    """A file past MAX_DEPTH or MAX_NODES: refused while composing, before PyYAML recurses or builds it."""


class _Loader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys and reads 5e-4 as a float (YAML 1.1 reads it as a string).

    It also refuses nesting deeper than MAX_DEPTH (PyYAML composes recursively and would raise
    RecursionError) and more than MAX_NODES nodes. Merge keys (<<) are not supported: a key's
    constructor runs before PyYAML would flatten merges, and the merge tag has none.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooBig(problem=f"expected YAML nested at most {MAX_DEPTH} levels deep, given nesting "
                                      f"deeper than {MAX_DEPTH} levels", problem_mark=self.peek_event().start_mark)
            if self._nodes > MAX_NODES:
                raise _TooBig(problem=f"expected at most {MAX_NODES} values, given more",
                              problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {show(key)} (first at line {seen[key]})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:   # unhashable key: let PyYAML report it
                pass
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str):
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except _TooBig as exc:
        mark = exc.problem_mark
        raise SpecError([f"{source}: {exc.problem} (line {mark.line + 1})"], source) from None
    except RecursionError:  # only under a recursion limit too low for MAX_DEPTH levels
        raise SpecError([f"{source}: expected YAML nested at most {MAX_DEPTH} levels deep, given nesting "
                         f"deeper than Python can parse"], source) from None
    except yaml.reader.ReaderError as exc:
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        raise SpecError([f"{source}: expected printable text, given the control character #x{code:04x} "
                         f"at character {exc.position}"], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        detail = f"{problem} ({context})" if context else problem
        line = f" (line {mark.line + 1})" if mark else ""
        raise SpecError([f"{where}: YAML syntax error{line}: {clip(detail)}"], source) from None
    except ValueError as exc:  # a scalar PyYAML cannot convert, e.g. an int past Python's digit limit
        raise SpecError([f"{source}: expected YAML values Python can read, given one it cannot "
                         f"({clip(exc)})"], source) from None


def check_size(data, source: str | None) -> None:
    """Refuse data with more than MAX_NODES values once shared references (YAML aliases) are counted
    as copies, nesting past MAX_DEPTH, or a value that contains itself. Counting is memoised on id(),
    so it costs one visit per distinct object however far the aliases would expand."""
    problem = _size_problem(data)
    if problem:
        raise SpecError([f"{source or 'the spec'}: {problem}"], source)


def _size_problem(data) -> str | None:
    try:
        count, depth = _size(data)
    except _Cycle:
        return "expected a tree of values, given a value that contains itself (an alias inside its own anchor)"
    if count > MAX_NODES:
        return f"expected at most {MAX_NODES} values after expanding aliases (*name), given more than {MAX_NODES}"
    if depth > MAX_DEPTH:
        return f"expected nesting at most {MAX_DEPTH} levels deep, given {depth} levels"
    return None


class _Cycle(Exception):
    pass


def _size(root) -> tuple[int, int]:
    """(values, depth) of a tree of dicts/lists as if every shared reference were copied out.

    Iterative post-order walk with memo[id] = (count, depth); counts saturate just past MAX_NODES.
    """
    memo: dict[int, tuple[int, int]] = {}   # ids of live containers only: scalars never collide
    active: set[int] = set()                 # the containers on the path from the root
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            count, depth = 1, 0
            for child in _children(node):
                c_count, c_depth = memo.get(id(child), (1, 0))
                count = min(count + c_count, MAX_NODES + 1)
                depth = max(depth, c_depth)
            memo[key] = (count, depth + 1)
            continue
        if key in memo or not _is_container(node):
            continue
        if key in active:
            raise _Cycle
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if _is_container(child))
    return memo.get(id(root), (1, 0))


def _is_container(node) -> bool:
    return isinstance(node, (Mapping, list, tuple, set, frozenset))


def _children(node) -> list:
    if isinstance(node, Mapping):
        return [*node.keys(), *node.values()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return list(node)
    return []


# ---------------------------------------------------------------- presets and files


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise SpecError([f"unknown preset {show(name)}" + hint(name, list_presets())])
    return path


def _read(path_like) -> tuple[object, str, str]:
    """(raw YAML data, source text for messages, default campaign name). A bare preset name works too."""
    path = Path(os.fspath(path_like))
    if not path.exists() and path.suffix == "" and (PRESET_DIR / f"{path.name}.yaml").is_file():
        path = PRESET_DIR / f"{path.name}.yaml"
    source = clip(str(path))
    data = parse_yaml(_read_text(path, source), source)
    check_size(data, source)
    return data, source, path.stem


def _read_text(path: Path, source: str) -> str:
    """The file's text: a regular file of at most MAX_FILE_BYTES bytes of UTF-8, else SpecError."""
    def refuse(given: str, expected: str = "a campaign YAML file"):
        raise SpecError([f"{source}: expected {expected}, given {given}"], source)

    try:
        info = path.stat()
    except FileNotFoundError:
        raise SpecError([f"campaign file not found: {source} (expected a campaign YAML file or a preset "
                         f"name: {', '.join(list_presets())})"], source) from None
    except OSError as err:   # a parent that is a file, no permission to look inside a folder, ...
        refuse(f"a path that cannot be read ({err.strerror or err})")
    if stat.S_ISDIR(info.st_mode):
        refuse("a directory")
    if not stat.S_ISREG(info.st_mode):   # a FIFO or a device would block or never end
        refuse("a special file (not a regular file)")
    if info.st_size > MAX_FILE_BYTES:
        refuse(f"{info.st_size} bytes", f"a campaign YAML file of at most {MAX_FILE_BYTES} bytes")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        refuse(f"a file that cannot be read ({err.strerror or err})")
    if len(data) > MAX_FILE_BYTES:
        refuse(f"more than {MAX_FILE_BYTES} bytes", f"a campaign YAML file of at most {MAX_FILE_BYTES} bytes")
    return _decode(data, refuse)


def _decode(data: bytes, refuse) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        refuse("UTF-16 text (save it as UTF-8)", "UTF-8 YAML text")
    nul = data.find(b"\0")
    if nul >= 0:
        refuse(f"binary data (a NUL byte at offset {nul})", "UTF-8 YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        refuse(f"bytes that are not UTF-8 (0x{data[err.start]:02x} at offset {err.start})", "UTF-8 YAML text")


# ---------------------------------------------------------------- overrides


def apply_overrides(raw: dict, overrides: Sequence[str], c: Collector) -> None:
    """Apply "a.b=value" strings in place; the value is a YAML scalar or flow collection."""
    for text in overrides:
        label = f"override {show(text)}"
        key_path, sep, value_text = str(text).partition("=")
        segments = key_path.strip().split(".")
        if not sep or not all(s.strip() for s in segments):
            c.add(label, "expected key.path=value, e.g. train.epochs=10")
            continue
        try:
            value = yaml.load(value_text, Loader=_Loader) if value_text.strip() else None  # noqa: S506
        except yaml.YAMLError as exc:
            c.add(label, f"the value is not valid YAML: {clip(getattr(exc, 'problem', None) or exc)}")
            continue
        except (RecursionError, ValueError) as exc:
            c.add(label, f"the value cannot be read: {clip(type(exc).__name__)}")
            continue
        too_big = _size_problem(value)
        if too_big:
            c.add(label, too_big)
            continue
        if segments[0] not in SECTIONS:
            c.add(label, f"unknown section {show(segments[0])}" + hint(segments[0], SECTIONS))
            continue
        problem = _set_path(raw, [s.strip() for s in segments], value)
        if problem:
            c.add(label, problem)


def _set_path(node, segments: list[str], value) -> str | None:
    for depth, seg in enumerate(segments):
        last = depth == len(segments) - 1
        here = ".".join(segments[:depth]) or "the spec"
        if isinstance(node, list):
            if not seg.isdigit() or int(seg) >= len(node):
                return f"{here} is a list of {len(node)}: expected an index below {len(node)}, given {show(seg)}"
            seg = int(seg)
        elif not isinstance(node, dict):
            return f"{here} is {show(node)}, not a mapping"
        if last:
            node[seg] = value
        else:
            if isinstance(node, dict) and node.get(seg) is None:
                if segments[depth + 1].isdigit():
                    return f"{'.'.join(segments[:depth + 1])} is not set, so it has no item {segments[depth + 1]}"
                node[seg] = {}
            node = node[seg]
    return None


# ---------------------------------------------------------------- public entry point


def load_campaign(source, overrides: Sequence[str] = (), *, check_names: bool = True) -> CampaignSpec:
    """A campaign YAML path (or preset name, or an already-parsed dict) -> validated, frozen CampaignSpec.

    overrides: "key.path=value" strings applied before validation (values parsed as YAML).
    check_names=False takes timm model and optimizer names as given (a spec read back from a campaign that
    was checked at launch): validation then imports neither timm nor torch.
    Raises SpecError listing every problem found.
    """
    token = CHECK_NAMES.set(check_names)
    try:
        return _load_campaign(source, overrides)
    finally:
        CHECK_NAMES.reset(token)


def read_stored_spec(raw: Mapping) -> tuple[CampaignSpec, tuple[str, ...]]:
    """A spec as a campaign file stores it (``spec.to_dict()``), read by load_campaign's rules as far as it
    goes, names taken as given: (the spec, the problems found). Where a file is partial or another version
    of qkvsearch wrote it, each key with a problem holds its default, and the problems name the keys
    (``_section_failed`` tells which sections have one); a valid spec reads as load_campaign reads it."""
    if not isinstance(raw, Mapping):
        raw = {}
    c = Collector()
    token = CHECK_NAMES.set(False)
    try:
        problem = _size_problem(raw)
        raw = {} if problem else copy.deepcopy(dict(raw))
        spec = _build(raw, c, None, partial=True)
    finally:
        CHECK_NAMES.reset(token)
    return spec, tuple(([problem] if problem else []) + list(c.errors))


def section_failed(problems: Sequence[str], section: str) -> bool:
    """Whether one of ``problems`` (as read_stored_spec returns them) concerns ``section``."""
    return any(e == section or e.startswith((f"{section}.", f"{section}:", f"{section}[")) for e in problems)


def _load_campaign(source, overrides: Sequence[str]) -> CampaignSpec:
    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(source, Mapping):
        check_size(source, None)   # before deepcopy, which recurses and copies
        raw, where, default_name = copy.deepcopy(dict(source)), None, None
    else:
        raw, where, default_name = _read(source)
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
    name = _parse_name(raw.get("name", MISSING), c)
    description = raw.get("description") or ""
    if not isinstance(description, str):
        c.expected("description", "a string", description)
    model = _parse_model(raw.get("model"), c)
    data = _parse_data(raw.get("data"), c)
    train = _parse_train(raw.get("train"), c)
    space = dimensions.parse_space(raw.get("space"), c)
    objectives = _parse_objectives(raw.get("objectives"), c)
    constraints = _parse_constraints(raw.get("constraints"), c)
    search = _parse_search(raw.get("search"), space, c, objectives)
    scheduler = _parse_scheduler(raw.get("scheduler"), objectives, train, c)
    resources = _parse_resources(raw.get("resources"), c)
    checkpoints = _parse_checkpoints(raw.get("checkpoints"), c)
    storage = _parse_storage(raw.get("storage", "results/"), c)
    tracking = parse_tracking(raw.get("tracking"), storage, c)
    measure = parse_measure(raw.get("measure"), c)
    stages = parse_stages(raw.get("stages"), c)
    given_name = isinstance(raw.get("model"), Mapping) and raw["model"].get("name") is not None
    if model.name is None and not given_name and "model" not in space.keys:
        c.add("model.name", "required (a timm model name, e.g. xcit_nano_12_p16_224)")
    model = _dataset_defaults(model, data, train, c)  # also with errors elsewhere: it reads only these sections
    if partial:
        return CampaignSpec(name, model, data, train, space, tuple(objectives), tuple(constraints), search,
                            scheduler, resources, storage, description if isinstance(description, str) else "",
                            checkpoints=checkpoints, tracking=tracking, measure=measure, stages=stages)
    if c.errors:
        return None
    _cross_check(train, space, resources, c)
    if c.errors:
        return None
    return CampaignSpec(name, model, data, train, space, tuple(objectives), tuple(constraints), search,
                        scheduler, resources, storage, description, source, checkpoints, tracking, stages, measure=measure)


# ---------------------------------------------------------------- sections


def _mapping(raw, c: Collector, path: str, what: str) -> dict | None:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        c.expected(path, what, raw)
        return None
    return dict(raw)


def _parse_section(raw: dict, section: str, c: Collector) -> dict:
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


def _parse_name(raw, c: Collector) -> str:
    if raw is MISSING:
        c.add("name", "required (it names the experiment folder under storage)")
    elif not isinstance(raw, str) or not NAME_RE.match(raw):
        c.expected("name", "letters, digits, '.', '_' or '-' (it names the experiment folder)", raw)
    return raw if isinstance(raw, str) else ""


def _parse_model(raw, c: Collector) -> ModelSpec:
    raw = _mapping(raw, c, "model", "a mapping (name, img_size, num_classes, ...)")
    if raw is None:
        return ModelSpec(None)
    return ModelSpec(**_parse_section(raw, "model", c))


def _parse_data(raw, c: Collector) -> DataSpec:
    raw = _mapping(raw, c, "data", "a mapping (dataset, path, val_fraction)")
    if raw is None:
        return DataSpec()
    return DataSpec(**_parse_section(raw, "data", c))


def _parse_train(raw, c: Collector):
    raw = _mapping(raw, c, "train", "a mapping of training keys (epochs, batch_size, lr, ...)")
    if raw is None:
        return TrainSpec()
    for key in REQUIRED_TRAIN_KEYS:
        if raw.get(key) is None:
            c.add(f"train.{key}", "required (the number of epochs every trial trains for)")
    return TrainSpec(**_parse_section(raw, "train", c))


def _parse_objectives(raw, c: Collector) -> list[Objective]:
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


def _parse_constraints(raw, c: Collector) -> list[Constraint]:
    raw = _mapping(raw, c, "constraints", "a mapping {cost metric: {max: x} or {min: x}}")
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
                if is_number(bound[side]):
                    values[side] = float(bound[side])
                else:
                    c.expected(f"{path}.{side}", "a number", bound[side])
        if "max" in values and "min" in values and values["min"] > values["max"]:
            c.add(path, f"expected min <= max, given min {values['min']:g} > max {values['max']:g}")
        if values:
            out.append(Constraint(metric, values.get("max"), values.get("min")))
    return out


def ehvi_problem(metrics, costs=COUNTED_METRICS) -> str | None:
    """Why search.algorithm ehvi (search.campaign.known_cost) cannot serve objectives of these metrics, or
    None: it needs one training objective and one or two cost objectives (``costs``: metrics known before
    training, a campaign's counted ones by default)."""
    metrics = list(metrics)
    known = [m for m in metrics if m in costs]
    if len(metrics) - len(known) == 1 and 1 <= len(known) <= 2:
        return None
    return (f"ehvi expects one training objective and one or two objectives counted before training "
            f"({', '.join(costs)}), given {', '.join(metrics)}")


def _parse_search(raw, space: Space, c: Collector, objectives=()) -> SearchSpec:
    raw = _mapping(raw, c, "search", "a mapping (algorithm, num_trials, seed, ...)")
    if raw is None:
        raw = {}
    c.unknown_keys("search", raw, ("algorithm", "num_trials", "seed", "population_size", "repeats", "n_startup_trials",
                                   "warm_start"))
    # A space with errors lost dimensions: its size and default algorithm would contradict the user.
    space_ok = not _section_failed(c, "space")
    # A space of ranges, several objectives: ehvi where it applies, else GP (benchmarks/README.md, "Searchers
    # compared": on NAS-Bench-201 CIFAR-10 and CIFAR-100, ehvi holds the most hypervolume at 50 trained
    # configurations, then GP); random for one objective.
    known_cost = ehvi_problem(o.metric for o in objectives)
    several = ("ehvi" if known_cost is None else "gp") if len(objectives) > 1 else "random"
    default_algorithm = "grid" if space.enumerable else several
    algorithm = dimensions.check_value(one_of(*ALGORITHMS), raw.get("algorithm", default_algorithm),
                                       c, "search.algorithm")
    seed = _opt(raw, "seed", integer(0), 0, c, "search")
    # A key that does not apply to the algorithm is reported as such, without also judging its value.
    repeats = _only_for(raw, "repeats", POS_INT, "grid", algorithm, c, " (use num_trials)")
    population = _only_for(raw, "population_size", integer(2), "nsga2", algorithm, c)
    startup = _only_for(raw, "n_startup_trials", POS_INT, ("gp", "ehvi"), algorithm, c)
    warm = raw.get("warm_start")
    if warm is not None and not (isinstance(warm, str) and warm.strip()):
        c.expected("search.warm_start", "a campaign folder or URI (a string)", warm)
        warm = None
    num_trials = _opt(raw, "num_trials", POS_INT, None, c, "search")
    if algorithm is dimensions.ABSENT:
        return SearchSpec("random", num_trials or 1, seed)
    if algorithm != "grid" and ("algorithm" in raw or space_ok):
        ranges = [d.key for d in space.dimensions if not d.enumerable]
        why = (f"given {algorithm}" if "algorithm" in raw
               else f"the default is {default_algorithm} because space.{ranges[0]} is a range" if ranges else "")
        for dim in space.dimensions:
            if dim.kind == "grid":
                c.add(f"space.{dim.key}.grid", f"grid values are enumerated, which only search.algorithm grid "
                                               f"does ({why}); use choice")
    if algorithm == "grid":
        if raw.get("repeats") is not None and repeats is None:
            return SearchSpec("grid", num_trials or 1, seed)   # no size to compare num_trials with
        grid = _grid_search(space, num_trials, seed, repeats or 1, c, space_ok)
        return replace(grid, warm_start=warm.strip()) if warm else grid
    if num_trials is None:
        if raw.get("num_trials") is None:
            c.add("search.num_trials", f"required for algorithm {algorithm} (how many trials to run)")
        num_trials = 1
    elif num_trials > 1 and space_ok and space.enumerable and dimensions.count(space) == 1:
        c.warn("search.num_trials", f"the space holds one configuration, so all {num_trials} trials would train "
                                    "the same one (add space dimensions, or set num_trials: 1)")
    if algorithm == "nsga2" and population is None:
        population = max(2, min(50, num_trials // 2))   # Optuna's default (50) when the budget allows
    if algorithm == "ehvi" and known_cost:
        c.add("search.algorithm", known_cost)
    if algorithm in ("gp", "ehvi") and startup is None:
        startup = max(1, min(GP_STARTUP_TRIALS, num_trials // 4))   # Optuna's default (10) when the budget allows
    return SearchSpec(algorithm, num_trials, seed, population, 1, startup, warm.strip() if warm else None)


def _grid_search(space: Space, num_trials, seed, repeats, c: Collector, space_ok: bool = True) -> SearchSpec:
    ranges = [d.key for d in space.dimensions if not d.enumerable]
    if ranges:
        c.add("search.algorithm", "grid needs every dimension to be choice/grid, but "
                                  + ", ".join(f"space.{k}" for k in ranges) + " is a range")
        return SearchSpec("grid", num_trials or 1, seed, None, repeats)
    points = dimensions.count(space)   # counted, not enumerated: a grid may hold 10^8 points
    size = points * repeats
    if not space_ok:
        return SearchSpec("grid", size, seed, None, repeats)
    if num_trials is not None and num_trials != size:
        c.add("search.num_trials", f"grid runs every grid point x repeats = {size} trials, given {num_trials} "
                                   "(leave num_trials out)")
    elif points == 1 and repeats > 1:
        c.warn("search.repeats", f"the space holds one configuration, so all {repeats} repeats would train "
                                 "the same one (add space dimensions, or leave repeats out)")
    return SearchSpec("grid", size, seed, None, repeats)


def _only_for(raw: dict, key: str, check, needed: str | tuple, algorithm, c: Collector, advice: str = ""):
    """The value of a search key that only some algorithms read; None when absent, invalid or not applicable."""
    if raw.get(key) is None:
        return None
    needed = (needed,) if isinstance(needed, str) else needed
    if algorithm is not dimensions.ABSENT and algorithm not in needed:
        c.add(f"search.{key}", f"applies to algorithm {', '.join(needed)} only, not {algorithm}{advice}")
        return None
    return _opt(raw, key, check, None, c, "search")


def _section_failed(c: Collector, section: str) -> bool:
    """Whether an error was recorded under a section ("space", "space.x", "space[0]")."""
    return section_failed(c.errors, section)


def _opt(raw: dict, key: str, check, default, c: Collector, section: str):
    if raw.get(key) is None:
        return default
    value = dimensions.check_value(check, raw[key], c, f"{section}.{key}")
    return default if value is dimensions.ABSENT else value


def _parse_scheduler(raw, objectives: list[Objective], train, c: Collector) -> SchedulerSpec:
    """The scheduler section. ``brackets`` (asha, moasha): Hyperband brackets, bracket s judging
    trials first at grace_epochs * reduction_factor**s; at most one per rung that fits below
    train.epochs. Left out (stored as None) it takes SchedulerSpec.bracket_count's default: 3 for
    moasha (see there: measured with benchmarks/bench_search.py), 1 for asha (Ray's). None rather than
    the number keeps a spec that shrinks train.epochs (smoke_test) valid."""
    raw = _mapping(raw, c, "scheduler", "a mapping (type, grace_epochs, reduction_factor, brackets)")
    if raw is None:
        return SchedulerSpec()
    c.unknown_keys("scheduler", raw, ("type", "grace_epochs", "reduction_factor", "brackets", "metric", "mode"))
    kind = dimensions.check_value(one_of(*TRIAL_SCHEDULERS), raw.get("type", "fifo"), c, "scheduler.type")
    grace = _opt(raw, "grace_epochs", POS_INT, 1, c, "scheduler")
    factor = _opt(raw, "reduction_factor", integer(2), 3, c, "scheduler")
    brackets = _opt(raw, "brackets", POS_INT, None, c, "scheduler")
    epochs = train.epochs
    if kind in ("asha", "moasha") and epochs is not None and grace > epochs:
        c.add("scheduler.grace_epochs", f"expected at most train.epochs ({epochs}), given {grace}")
    if brackets is not None and kind not in ("asha", "moasha"):
        if kind is not dimensions.ABSENT:  # an invalid type has its own message
            c.add("scheduler.brackets", f"expected no brackets for type {kind} (they apply to asha and "
                                        f"moasha), given {brackets}")
        brackets = None
    elif brackets is not None and epochs is not None and grace <= epochs:
        rungs = SchedulerSpec.rung_epochs(grace, factor, epochs)
        if brackets > max(1, len(rungs)):
            listed = ", ".join(map(str, rungs)) or "none"
            c.add("scheduler.brackets", f"expected at most {max(1, len(rungs))} (one per rung below train.epochs "
                                        f"{epochs}: epochs {listed}), given {brackets}")
    metric, mode = raw.get("metric"), raw.get("mode")
    if kind != "asha":
        for key in ("metric", "mode"):
            if raw.get(key) is not None:
                c.add(f"scheduler.{key}", f"applies to type asha only ({kind} uses the objectives)")
        if kind == "moasha" and objectives and not any(o.metric in SCHEDULER_METRICS for o in objectives):
            c.add("scheduler.type", "moasha stops trials on training metrics, but every objective is known "
                                    "before training; add e.g. {metric: top1, mode: max} or use fifo")
        return SchedulerSpec(kind if kind is not dimensions.ABSENT else "fifo", grace, factor, brackets=brackets)
    metric, mode = _asha_target(metric, mode, objectives, c)
    return SchedulerSpec("asha", grace, factor, metric, mode, brackets)


def _asha_target(metric, mode, objectives, c: Collector):
    if metric is None:
        if not objectives:
            return None, None
        metric = objectives[0].metric
        if metric not in SCHEDULER_METRICS:
            c.add("scheduler.metric", f"asha stops trials on a training metric; the first objective {metric} "
                                      f"is known before training (set scheduler.metric)")
            return None, None
        mode = mode or objectives[0].mode
    elif metric not in SCHEDULER_METRICS:
        c.add("scheduler.metric", f"expected one of {', '.join(SCHEDULER_METRICS)}, given {show(metric)}"
              + (hint(metric, SCHEDULER_METRICS, list_known=False) if isinstance(metric, str) else ""))
        return None, None
    mode = mode or METRICS[metric]
    if mode not in ("max", "min"):
        c.expected("scheduler.mode", "max or min", mode)
    return metric, mode


def _parse_resources(raw, c: Collector) -> ResourcesSpec:
    raw = _mapping(raw, c, "resources", "a mapping (workers_per_trial, cpus_per_worker, ...)")
    if raw is None:
        return ResourcesSpec()
    keys = ("workers_per_trial", "cpus_per_worker", "gpus_per_worker", "max_concurrent_trials",
            "placement_strategy", "max_failures")
    c.unknown_keys("resources", raw, keys)
    defaults = ResourcesSpec()
    workers, cpus, gpus = (_opt(raw, name, check, getattr(defaults, name), c, "resources")
                           for name, check in WORKER_RESOURCES)
    placement = _opt(raw, "placement_strategy", one_of(*PLACEMENTS), "PACK", c, "resources")
    failures = _opt(raw, "max_failures", NONNEG_INT, ResourcesSpec.max_failures, c, "resources")
    concurrent = raw.get("max_concurrent_trials", "auto")
    if concurrent != "auto" and not (isinstance(concurrent, int) and not isinstance(concurrent, bool)
                                     and concurrent >= 1):
        c.expected("resources.max_concurrent_trials", 'a positive int or "auto"', concurrent)
        concurrent = "auto"
    return ResourcesSpec(workers, cpus, gpus, concurrent, placement, failures)


def _parse_checkpoints(raw, c: Collector) -> CheckpointsSpec:
    """What ended trials keep of their checkpoints (spaces.schema.KEEP_POLICIES; search.campaign.retention)."""
    raw = _mapping(raw, c, "checkpoints", "a mapping (keep: " + " | ".join(KEEP_POLICIES) + ")")
    if raw is None:
        return CheckpointsSpec()
    c.unknown_keys("checkpoints", raw, ("keep",))
    return CheckpointsSpec(_opt(raw, "keep", one_of(*KEEP_POLICIES), CheckpointsSpec.keep, c, "checkpoints"))


def _parse_storage(raw, c: Collector) -> str:
    if not isinstance(raw, str) or not raw.strip():
        c.expected("storage", "a local path or a URI (s3://, gs://, file://)", raw)
        return "results/"
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", raw)
    if scheme and scheme.group(1).lower() not in STORAGE_SCHEMES:
        c.expected("storage", "a local path or a URI with scheme " + ", ".join(f"{s}://" for s in STORAGE_SCHEMES),
                   raw)
    return raw


def _dataset_defaults(model: ModelSpec, data: DataSpec, train, c: Collector) -> ModelSpec:
    """img_size / num_classes from the dataset, and the rules that tie model keys to the data
    (spaces.keys.fill_from_dataset, the rule every trial config goes through)."""
    flat = {**flatten("model", model.as_dict()), **flatten("data", data.as_dict()),
            "augment": train.augment, "randaugment": train.randaugment}
    try:
        fill_from_dataset(flat)
    except ConfigError as err:
        c.add("", section_path(str(err)))
        return model
    return replace(model, img_size=flat["img_size"], num_classes=flat.get("num_classes"))


def _cross_check(train, space: Space, resources: ResourcesSpec, c: Collector) -> None:
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
