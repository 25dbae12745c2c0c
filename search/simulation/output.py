"""What `qkvsearch simulate` prints and writes: the hypervolume table, simulate.html, simulate.csv.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from qkvsearch.search.simulation.curves import Curves
from qkvsearch.search.simulation.replay import Run


def default_out_dir(source) -> str:
    """Where ``qkvsearch simulate`` writes by default: <campaign>/simulate, or <folder>/<stem>-simulate
    next to a table."""
    text = os.fspath(source).rstrip("/")
    if _is_table(text):
        stem, _ = os.path.splitext(text)
        return f"{stem}-simulate"
    from qkvsearch.search.records.outputs import SIMULATE_DIR

    return f"{text}/{SIMULATE_DIR}"


def checked_out_dir(source, out=None) -> str:
    """``out`` (--out), else default_out_dir(source), once search.records.outputs.check_output_dir accepts
    it: never a file, nothing of a campaign's own (OutputPathError, exit 2). Nothing is created."""
    from qkvsearch.search.records.outputs import check_output_dir

    text = os.fspath(source).rstrip("/")
    return check_output_dir(default_out_dir(text) if out is None else out, "--out",
                            campaign=None if _is_table(text) else text)


def _is_table(text: str) -> bool:
    return text.lower().endswith((".parquet", ".csv"))


# ---------------------------------------------------------------------------------------- output
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


def format_table(curves: Curves, runs: Sequence[Run]) -> str:
    """One line per run: trials, complete, epochs and simulated time spent, and the completed
    front's hypervolume as a fraction of the full grid's at 10/25/50/100% of the grid's epochs."""
    head = ["scheduler", "trials", "complete", "stopped", "epochs", "sim h"]
    head += [f"HV@{int(f * 100)}%" for f in FRACTIONS] + ["HV end", "epochs to 0.95"]
    rows = []
    for r in runs:
        frac = [r.hv_at_epochs(f * curves.grid_epochs) / curves.grid_hv for f in FRACTIONS]
        to95 = r.epochs_to(0.95 * curves.grid_hv)
        rows.append([r.label, str(r.trials), str(r.complete), str(r.stopped), str(r.epochs),
                     f"{r.time_s / 3600:.3g}"] + [f"{x:.3f}" for x in frac]
                    + [f"{r.final_hv / curves.grid_hv:.3f}",
                       "never" if math.isinf(to95) else f"{to95:.0f} ({to95 / curves.grid_epochs:.0%})"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    for row in rows:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _figure(curves: Curves, runs: Sequence[Run]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True,
                        subplot_titles=("against simulated time", "against epochs spent"))
    for i, r in enumerate(runs):
        color = _COLORS[i % len(_COLORS)]
        frac = np.concatenate([[0.0], r.hv / curves.grid_hv])
        hours = np.concatenate([[0.0], r.hv_time_s / 3600, [r.time_s / 3600]])
        epochs = np.concatenate([[0], r.hv_epochs, [r.epochs]])
        y = np.concatenate([frac, frac[-1:]])
        for col, x in ((1, hours), (2, epochs)):
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=r.label, legendgroup=r.label,
                                     showlegend=col == 1, line={"color": color}), row=1, col=col)
    fig.update_xaxes(title_text="simulated time (h)", row=1, col=1)
    fig.update_xaxes(title_text=f"epochs spent (full grid: {curves.grid_epochs})", row=1, col=2)
    fig.update_yaxes(title_text="hypervolume / full grid's", row=1, col=1)
    fig.update_layout(title=f"Completed front's hypervolume, {len(curves)} recorded curves, "
                            f"{', '.join(f'{d} {m}' for m, d in curves.objectives)}",
                      template="plotly_white", height=480)
    return fig


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def write_outputs(curves: Curves, runs: Sequence[Run], out_dir) -> dict[str, str]:
    """simulate.html (the figure, self-contained) and simulate.csv (one row per complete trial of each
    run: scheduler, seed, time_s, epochs, hypervolume, fraction of the grid's) into out_dir."""
    from qkvsearch.storage import write_bytes

    out = os.fspath(out_dir).rstrip("/")
    fig = _figure(curves, runs)
    lines = ["scheduler,seed,time_s,epochs,hypervolume,hv_fraction"]
    for r in runs:
        for t, e, h in zip(r.hv_time_s.tolist(), r.hv_epochs.tolist(), r.hv.tolist()):
            lines.append(f"{r.label},{r.seed},{t:.6g},{e},{h:.8g},{h / curves.grid_hv:.6f}")
    written = {"html": f"{out}/simulate.html", "csv": f"{out}/simulate.csv"}
    write_bytes(written["html"], fig.to_html(include_plotlyjs=True, full_html=True).encode("utf-8"))
    write_bytes(written["csv"], ("\n".join(lines) + "\n").encode("utf-8"))
    return written

