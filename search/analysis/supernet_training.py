"""The supernet's own training in a one-shot campaign's report: its epochs, collected from the nested campaign that
trained it (<exp>/supernet/, search.campaign.oneshot) by the rules of epochs.parquet (search.analysis.results.collect),
written beside the report's other tables as supernet_epochs.parquet, and drawn from that table alone:

    supernet_training   per epoch, the validation top-1 of the teacher (the space's largest subnet) and of the
                        smallest subnet (upper panel), and the losses reported (lower panel: the teacher's training
                        and validation loss, the students' mean training loss, the smallest subnet's validation loss)

The supernet trainer (trainers.supernet.training) reports the teacher's metrics under the plain names (top1,
val_loss, train_loss), as any trial does, and the others under their own (top1_smallest, val_loss_smallest,
train_loss_students). A campaign that trained no supernet of its own gets neither table nor figure: an ordinary
campaign, or a one-shot campaign that searched another's trained supernet (``supernet.from``), whose curves are in
that campaign's report.
"""
from __future__ import annotations

import html
import os

import pandas as pd
import pyarrow as pa

from qkvsearch.search.analysis.figures import figure_layout, numbers
from qkvsearch.search.analysis.results import collect, parquet_file
from qkvsearch.search.records.inherited import SUPERNET_DIR
from qkvsearch.search.records.layout import CAMPAIGN_FILE
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.storage import exists, write_bytes

SUPERNET_EPOCHS_FILE = "supernet_epochs.parquet"
FIGURE = "supernet_training"   # the figure's name, that of its static files
TEACHER, SMALLEST, STUDENTS = "#d62728", "#1f77b4", "#2ca02c"
# (column, legend name, colour, dash) of each curve: the upper panel's, then the lower's. Training losses dotted:
# they are means over the epoch's updates (the students' a distillation loss by default), not the validation's.
TOP1_CURVES = (("top1", "teacher (largest subnet) top-1", TEACHER, "solid"),
               ("top1_smallest", "smallest subnet top-1", SMALLEST, "solid"))
LOSS_CURVES = (("val_loss", "teacher validation loss", TEACHER, "solid"),
               ("train_loss", "teacher training loss", TEACHER, "dot"),
               ("val_loss_smallest", "smallest subnet validation loss", SMALLEST, "solid"),
               ("train_loss_students", "students' mean training loss", STUDENTS, "dot"))


def supernet_epochs(exp) -> pa.Table | None:
    """supernet_epochs.parquet's table: the epochs of the nested campaign's trials (normally its one trial) as
    epochs.parquet holds a campaign's; None when the campaign trained no supernet of its own (module docstring)."""
    folder = f"{os.fspath(exp).rstrip('/')}/{SUPERNET_DIR}"
    if not exists(f"{folder}/{CAMPAIGN_FILE}"):
        return None
    # opened: its spec is not needed, the rows come from its trial records alone, and a damaged nested campaign
    # file leaves the rest of the report to be written
    return collect(folder, opened=True)[1]


def _present(df: pd.DataFrame, curves) -> list[tuple]:
    """The curves whose column holds a value in some row."""
    return [c for c in curves if c[0] in df and df[c[0]].notna().any()]


def _trace(g: pd.DataFrame, curve: tuple, suffix: str, axes: tuple[str, str]) -> dict:
    column, name, color, dash = curve
    name = html.escape(name + suffix, quote=False)  # plotly reads names as HTML; quotes need nothing
    return {"type": "scatter", "mode": "lines+markers", "name": name, "legendgroup": column,
            "x": numbers(g[EPOCH]), "y": numbers(g[column]), "xaxis": axes[0], "yaxis": axes[1],
            "line": {"color": color, "dash": dash}, "marker": {"size": 5, "color": color},
            "hovertemplate": f"{name}<br>epoch %{{x}}: %{{y:.4g}}<extra></extra>"}


def supernet_figure(epochs: pd.DataFrame) -> dict | None:
    """supernet_training (module docstring) from supernet_epochs.parquet's rows: every trial's curves (its name in
    the legend when there are several), one point per epoch, a gap where an epoch lacks the metric; None when no
    row holds a top-1 or a loss."""
    top1, losses = _present(epochs, TOP1_CURVES), _present(epochs, LOSS_CURVES)
    if not top1 and not losses:
        return None
    groups = list(epochs.sort_values(["trial_id", EPOCH], kind="stable").groupby("trial_id", sort=True))
    data = []
    for _, g in groups:
        suffix = f" · {g['trial_name'].iloc[0]}" if len(groups) > 1 else ""
        data += [_trace(g, c, suffix, ("x", "y")) for c in top1 if g[c[0]].notna().any()]
        data += [_trace(g, c, suffix, ("x2", "y2") if top1 else ("x", "y")) for c in losses if g[c[0]].notna().any()]
    title = "Supernet training: the teacher (largest subnet) and the smallest subnet per epoch"
    last = groups[-1][1].iloc[-1] if len(groups) == 1 else None
    if last is not None and top1:
        shown = "; ".join(f"{name} {last[column]:.2f} %" for column, name, *_ in top1 if pd.notna(last[column]))
        title += f"<br><sup>epoch {int(last[EPOCH])}: {html.escape(shown, quote=False)}</sup>" if shown else ""
    if not (top1 and losses):  # one panel
        return {"data": data, "layout": figure_layout(title, 440, xaxis="epoch",
                                                      yaxis="top-1 accuracy (%)" if top1 else "loss")}
    out = figure_layout(title, 640, yaxis="top-1 accuracy (%)", xaxis2="epoch", yaxis2="loss")
    # two panels, one above the other, their epochs in step (zooming one zooms both)
    out["xaxis"] = {"anchor": "y"}
    out["yaxis"] |= {"domain": [0.45, 1.0], "anchor": "x"}
    out["xaxis2"] |= {"anchor": "y2", "matches": "x"}
    out["yaxis2"] |= {"domain": [0.0, 0.33], "anchor": "x2"}
    out["legend"] = {"font": {"size": 10}}
    return {"data": data, "layout": out}


def supernet_section(exp, out: str) -> tuple[dict[str, str], dict[str, dict]]:
    """supernet_epochs.parquet written into ``out``, and the figure drawn from it: ({"supernet_epochs": path},
    {FIGURE: figure}, the figure left out when there is nothing to draw); ({}, {}) for a campaign that trained
    no supernet of its own."""
    table = supernet_epochs(exp)
    if table is None:
        return {}, {}
    path = f"{out}/{SUPERNET_EPOCHS_FILE}"
    write_bytes(path, parquet_file(table))
    figure = supernet_figure(table.to_pandas())
    return {"supernet_epochs": path}, ({FIGURE: figure} if figure is not None else {})
