"""The fields of a campaign-file section, declared as a table of ``Field`` rows.

Each section's parser reads its field names (the unknown-key check), defaults and checks from its table, and
the reference of the campaign file (spaces.reference) prints the same table: the two cannot disagree. The
trial keys of the model, data and train sections are declared in spaces.keys.KEYS instead.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import POS_INT, Bad, Check
from qkvsearch.spaces.errors import Collector

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
    """A section's table: field name -> Field, in the order the reference lists them."""
    return {row.name: row for row in rows}


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
