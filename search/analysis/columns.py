"""Which columns a report table shows, in what order, and which it folds into one "fixed settings" line: the one
rule pareto.html's trial tables and report.md's front table follow (search.analysis.report renders them).

    name | status (when it varies) | searched keys | objectives and constraints | the rest that varies
    fixed settings (the same in every row): key: value; ...

The searched keys are those the campaign's space varies (spaces.schema.Space.keys: its dimensions and the keys
its variants set), each with its per-block columns and the columns solved from it (``width`` from
``hidden_width``); a space that names none of the table's columns (an older or partial spec) falls back to the
configuration columns that vary over the table. A column empty in every row is left out; one of the rest that
holds one value in every row is folded into the fixed-settings line, so the reader sees what was searched before
scrolling sideways. Searched keys and objectives stay columns even when constant over the table: they are what
the table is read for. pareto.csv is not laid out by this rule: it keeps every column.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.results import CONFIG_PREFIX
from qkvsearch.spaces.blocks import is_block_key_of
from qkvsearch.spaces.keys import WIDTH

NAME, STATUS = "trial_name", "status"
FIXED_TITLE = "fixed settings (the same in every row)"
# Columns a searched key decides without being searched itself: the solved width follows the requested one.
SOLVED_FROM = {"hidden_width": (WIDTH.name,)}


@dataclass(frozen=True)
class TableLayout:
    columns: list[str]               # shown, in order
    searched: tuple[str, ...]        # the shown columns that are searched keys
    fixed: list[tuple[str, str]]     # (column, its one value as text), folded into the fixed-settings line


def cell_text(v) -> str:
    """A cell as text: floats with 4 significant digits, missing -> ""."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def header(column: str) -> str:
    """A column's heading: a trial key's column by the key's name."""
    return column.removeprefix(CONFIG_PREFIX)


def searched_columns(columns, space_keys) -> list[str]:
    """The columns of ``columns`` holding the space's keys, in the space's order: each key's own, its per-block
    ones, then those solved from it (SOLVED_FROM)."""
    out = []
    for key in space_keys:
        out.append(CONFIG_PREFIX + key)
        out += [c for c in columns if is_block_key_of(c.removeprefix(CONFIG_PREFIX), key)]
        out += [CONFIG_PREFIX + solved for solved in SOLVED_FROM.get(key, ())]
    return [c for c in dict.fromkeys(out) if c in columns]


def _state(s: pd.Series) -> str:
    """"empty" (no value in any row), "constant" (one value, a missing one counted as a value) or "varies"."""
    present = s.dropna()
    texts = not pd.api.types.is_numeric_dtype(present) and not pd.api.types.is_bool_dtype(present)
    if present.empty or (texts and bool((present.astype(str) == "").all())):
        return "empty"
    return "constant" if s.nunique(dropna=False) == 1 else "varies"


def table_layout(df: pd.DataFrame, space_keys, measures, rest) -> TableLayout:
    """The layout (module docstring) of a table of ``df``'s rows. space_keys: the campaign's searched keys;
    measures: the objective and constraint columns; rest: every other column the table may show."""
    searched = searched_columns(list(df.columns), space_keys)
    candidates = [c for c in dict.fromkeys([NAME, STATUS, *searched, *measures, *rest]) if c in df]
    state = {c: _state(df[c]) for c in candidates}
    searched = [c for c in searched if state[c] != "empty"]
    if not searched:  # the space names none of these columns (an older or partial spec): what varies
        searched = [c for c in candidates if c.startswith(CONFIG_PREFIX) and state[c] == "varies"]
    placed = {NAME, STATUS, *searched}
    shown_measures = [c for c in dict.fromkeys(measures) if c in df and c not in placed and state[c] != "empty"]
    others = [c for c in candidates if c not in placed and c not in shown_measures]
    status = [STATUS] if state.get(STATUS) == "varies" else []  # leads when it varies (a table of every trial)
    columns = ([NAME] if NAME in df else []) + status + searched + shown_measures \
        + [c for c in others if state[c] == "varies"]
    fixed = [(c, cell_text(df[c].iloc[0])) for c in [STATUS, *others] if state.get(c) == "constant"]
    return TableLayout(columns, tuple(searched), fixed)


def fixed_line(layout: TableLayout) -> str:
    """The fixed-settings line as text ("" when nothing is fixed)."""
    return "; ".join(f"{header(c)}: {v}" for c, v in layout.fixed)
