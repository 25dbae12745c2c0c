"""The campaign file's reference, generated from its declarations: the trial keys each section sets
(spaces.keys.KEYS) and the field tables of the other sections (spaces.fields). The documentation site renders
these tables when it is built (docs/hooks.py), so a page cannot disagree with the parser.

``render("keys train")``, ``render("fields scheduler")``, ``render("space")``, ``render("metrics")``: one
Markdown table each.
"""
from __future__ import annotations

from collections.abc import Mapping

from qkvsearch.spaces.datasets import DATASET_INFO
from qkvsearch.spaces.fields import Field
from qkvsearch.spaces.keys import KEYS, Key
from qkvsearch.spaces.measure import MEASURE_FIELDS
from qkvsearch.spaces.metrics import COST_METRICS, MEASURED, METRICS, SCHEDULER_METRICS, STAGE_METRIC_LIST
from qkvsearch.spaces.search_options import SEARCH_FIELDS
from qkvsearch.spaces.sections import CHECKPOINTS_FIELDS, RESOURCES_FIELDS, SCHEDULER_FIELDS
from qkvsearch.spaces.stages import FINETUNE_STAGE_FIELDS, OOD_SET_FIELDS, OOD_STAGE_FIELDS, STAGES_FIELDS
from qkvsearch.spaces.supernet import SUPERNET_FIELDS
from qkvsearch.spaces.targets import TARGET_FIELDS
from qkvsearch.spaces.tracking import TRACKERS

KEY_SECTIONS = ("model", "data", "train")   # the sections whose fields are trial keys
# Each declared table, by the path of the mapping it checks ("[]": each item of a list).
SECTION_TABLES: dict[str, dict[str, Field]] = {
    "search": SEARCH_FIELDS,
    "scheduler": SCHEDULER_FIELDS,
    "resources": RESOURCES_FIELDS,
    "checkpoints": CHECKPOINTS_FIELDS,
    "measure": MEASURE_FIELDS,
    "supernet": SUPERNET_FIELDS,
    "targets[]": TARGET_FIELDS,
    "stages": STAGES_FIELDS,
    "stages.finetune[]": FINETUNE_STAGE_FIELDS,
    "stages.ood": OOD_STAGE_FIELDS,
    "stages.ood.datasets[]": OOD_SET_FIELDS,
    **{f"tracking.{name}": info.fields for name, info in TRACKERS.items()},
}


def yaml_value(value) -> str:
    """A default as a campaign file writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, no line breaks, and outside code spans ``<`` escaped (it
    would open an HTML tag: ``<campaign folder>``)."""
    parts = str(text).replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def key_default(key: Key) -> str:
    return "required" if key.required else yaml_value(key.default)


def field_default(field: Field) -> str:
    if field.required:
        return "required"
    return field.default_doc or yaml_value(field.default)


def takes(check) -> str:
    """What a check takes, in words, with its bound where it has one of its own ("a positive int, up to 1000")."""
    return f"{check.expected}, {check.limit}" if check.limit else check.expected


def key_table(section: str) -> str:
    """The trial keys a section sets: its name there, what it takes, its default, unit and meaning."""
    rows = [(f"`{k.section_key or k.name}`", takes(k.check), f"`{key_default(k)}`", k.unit,
             k.doc + ("" if (k.section_key or k.name) == k.name else f" (trial key `{k.name}`)"))
            for k in KEYS.values() if k.section == section]
    return _table(("key", "takes", "default", "unit", "meaning"), rows)


def space_table() -> str:
    """The trial keys only a space sets (no section): the architecture, the embedding, the quantization policy."""
    rows = []
    for k in KEYS.values():
        if k.section is None and k.searchable:
            applies = f"; applies when {k.applies_key} is {' or '.join(k.applies_to)}" if k.applies_to else ""
            rows.append((f"`{k.name}`", k.group, takes(k.check), f"`{key_default(k)}`", k.unit, k.doc + applies))
    return _table(("key", "group", "takes", "default", "unit", "meaning"), rows)


def field_table(name: str) -> str:
    """One declared section table (SECTION_TABLES)."""
    if not SECTION_TABLES[name]:
        return "No fields: `{}` (or null) turns it on.\n"
    rows = []
    for f in SECTION_TABLES[name].values():
        applies = f" ({', '.join(f.applies)} only)" if f.applies else ""
        default = f"`{field_default(f)}`" if not f.default_doc or f.required else field_default(f)
        rows.append((f"`{f.name}`", takes(f.check) if f.check else f.expected, default, f.doc + applies))
    return _table(("field", "takes", "default", "meaning"), rows)


def metrics_table() -> str:
    """The metrics objectives and constraints may name, with their natural mode and when they are known."""
    measured = set(MEASURED)
    rows = []
    for name, mode in METRICS.items():
        if name in measured:
            when = f"measured before training ({MEASURED[name][1]}): {MEASURED[name][2]}"
        elif name in COST_METRICS:
            when = "counted from the config, before training"
        elif name in SCHEDULER_METRICS:
            when = "per epoch; schedulers can stop trials on it"
        else:
            when = "reported by training"
        rows.append((f"`{name}`", mode, "yes" if name in COST_METRICS else "", when))
    return _table(("metric", "mode", "constraint", "when it is known"), rows)


def stage_metrics_table() -> str:
    rows = [(f"`{m.name}`", m.mode, m.stage, "yes" if m.default else "") for m in STAGE_METRIC_LIST]
    return _table(("stage metric", "mode", "stage", "a default objective"), rows)


def datasets_table() -> str:
    """Each dataset's facts (spaces.datasets.DATASET_INFO)."""
    rows = [(f"`{name}`", "from the class folders" if d.classes is None and name == "imagefolder"
             else "model.num_classes" if d.classes is None else d.classes, d.img_size,
             "yes" if d.needs_path else "", "yes" if d.rgb else "") for name, d in DATASET_INFO.items()]
    return _table(("dataset", "classes", "default img_size (px)", "needs data.path", "RGB (in_chans 3)"), rows)


def trackers_table() -> str:
    rows = [(f"`{t.name}`", ", ".join(f"`{s}`" for s in t.fields) or "none", f"`pip install 'qkvsearch[{t.extra}]'`",
             t.doc) for t in TRACKERS.values()]
    return _table(("tracker", "settings", "install", "where it writes by default"), rows)


def render(what: str) -> str:
    """The Markdown table ``what`` names: ``keys <section>``, ``fields <table>``, ``space``, ``metrics``,
    ``stage-metrics``, ``trackers``, ``datasets``. KeyError for any other name."""
    kind, _, arg = what.strip().partition(" ")
    if kind == "keys" and arg in KEY_SECTIONS:
        return key_table(arg)
    if kind == "fields":
        return field_table(arg)
    simple = {"space": space_table, "metrics": metrics_table, "stage-metrics": stage_metrics_table,
              "trackers": trackers_table, "datasets": datasets_table}
    return simple[kind]()
