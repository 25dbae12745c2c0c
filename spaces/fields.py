"""The fields of a campaign-file section, declared as a table of ``Field`` rows, and what derives from a table.

A section's table is all there is to know of its fields: the section's spec is a frozen dataclass made from it
(``section_spec``: one attribute per row, its default the row's, ``to_dict`` writing each row back under its
name), its parser reads every row (``read_table``: the unknown-key check, each value checked, or read by a
reader the parser names, defaults filled), and the reference of the campaign file (spaces.reference) prints the
same table. A field is one row: no list elsewhere can leave it out. The trial keys of the model, data and train
sections are declared in spaces.keys.KEYS instead (spaces.schema derives their specs the same way).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, make_dataclass
from dataclasses import field as spec_field
from typing import Any

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import POS_INT, Bad, Check
from qkvsearch.spaces.errors import Collector
from qkvsearch.spaces.schema import plain, tagged

OWN = object()   # Field.read's default: the field's own


@dataclass(frozen=True)
class Field:
    """One field of a section. ``takes``: a Check (type and allowed values; its ``expected`` is what an error
    prints), or what the field takes in words where the section's parser checks it itself (a list, a mapping
    of its own fields). ``default``: its value when left out or null; ``default_doc`` says it in words where it
    depends on other fields. ``applies``: the values of the section's selecting field (``search.algorithm``,
    ``scheduler.type``) it applies to; empty: all."""

    name: str
    takes: Check | str
    default: Any
    doc: str
    default_doc: str = ""
    applies: tuple[str, ...] = ()
    required: bool = False
    attr: str = ""               # the spec's attribute where it is not ``name`` (supernet.from: ``source``)
    example: Any = None          # a value other than the default, where ``takes`` is words (a list, a mapping)
    added_later: bool = False    # written back only when set: campaign files written before it read back unchanged

    @property
    def key(self) -> str:
        """The spec's attribute that holds the field's value."""
        return self.attr or self.name

    @property
    def check(self) -> Check | None:
        return self.takes if isinstance(self.takes, Check) else None

    @property
    def expected(self) -> str:
        return self.takes.expected if isinstance(self.takes, Check) else self.takes

    def read(self, raw: Mapping, c: Collector, section: str, default: Any = OWN):
        """The field's value in ``raw`` (its section's mapping), checked; ``default`` (unless given, the field's
        own) when it is absent or null, or after recording the error of a value its check refuses."""
        default = self.default if default is OWN else default
        if raw.get(self.name) is None:
            return default
        value = dimensions.check_value(self.check, raw[self.name], c, f"{section}.{self.name}")
        return default if value is dimensions.ABSENT else value


def table(*rows: Field) -> dict[str, Field]:
    """A section's table: field name -> Field, in the order the reference lists them (and the spec's attributes
    come: ``section_spec``)."""
    return {row.name: row for row in rows}


def read_table(raw: Mapping, fields: dict[str, Field], c: Collector, where: str, **readers: Callable) -> dict[str, Any]:
    """Every field of a section's mapping ``raw``, by its spec attribute (``Field.key``): read by its check, or by
    the reader ``readers`` names for it ((the given value or None, c, its path) -> value: a field whose ``takes``
    is words must have one, and a field a rule of the section reads has one)."""
    out = {}
    for f in fields.values():
        if f.name in readers:
            out[f.key] = readers.pop(f.name)(raw.get(f.name), c, f"{where}.{f.name}")
        elif f.check is None:
            raise TypeError(f"{where}.{f.name}: a field that takes {f.takes} needs a reader of its own")
        else:
            out[f.key] = f.read(raw, c, where)
    if readers:
        raise TypeError(f"{where}: readers of no field: {', '.join(readers)}")
    return out


def section_spec(name: str, fields: dict[str, Field], module: str, doc: str, base: type = object,
                 written: dict[str, Callable] | None = None):
    """The frozen dataclass of a section (module docstring): ``fields`` in order, each row's default (immutable:
    a tuple, a FrozenMap); ``to_dict()``: the section as a campaign file writes it, each value as plain data or
    by ``written`` (field name -> value -> what the file holds: objectives, constraints). ``base``: methods of
    its own."""
    written = written or {}

    def to_dict(self) -> dict:
        return {f.name: written.get(f.name, plain)(getattr(self, f.key)) for f in fields.values()
                if not (f.added_later and tagged(getattr(self, f.key)) == tagged(f.default))}

    cls = make_dataclass(name, [(f.key, Any, spec_field(default=f.default)) for f in fields.values()],
                         bases=(base,), frozen=True, namespace={"to_dict": to_dict, "__doc__": doc})
    cls.__module__ = module   # it pickles (a campaign's tuner.pkl holds its spec) under its module's name
    return cls


def choice(*options: str, text: str | None = None) -> Check:
    """One of ``options``, printed ``a | b | c`` unless ``text`` says otherwise (the sections' own choices; trial
    keys use checks.one_of)."""
    text = text or " | ".join(options)

    def fn(v):
        if v not in options:
            raise Bad
        return v

    return Check(text, f"values among {text}", fn, None, options)


def nonempty(expected: str) -> Check:
    """A non-empty string (a folder, a URI), stripped; ``expected`` says what it names."""

    def fn(v):
        if not isinstance(v, str) or not v.strip():
            raise Bad
        return v.strip()

    return Check(expected, "non-empty strings", fn)


def _positive_or_auto(v):
    if v == "auto":
        return v
    try:
        return POS_INT(v)
    except Bad as bad:
        raise Bad(bad.expected and f'{bad.expected} or "auto"') from None


MODE = choice("max", "min", text="max or min")   # an objective's or a scheduler's
POSITIVE_OR_AUTO = Check('a positive int or "auto"', 'positive ints or "auto"', _positive_or_auto)   # up to MAX_COUNT
