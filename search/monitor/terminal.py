"""What a person sees of a running campaign in the terminal: a live block redrawn in place (rich) on a
terminal, plain lines elsewhere (CI, log files, `ray job submit`), and one line per finished trial
in both. Fed `progress.Progress` snapshots by `monitor.CampaignMonitor`."""
from __future__ import annotations

import sys

from qkvsearch.search.monitor.progress import FinishedTrial, Progress, read_progress
from qkvsearch.search.records.layout import FINAL_STATUSES
from qkvsearch.search.records.proposals import count_proposals


class TerminalView:
    """show(progress) after every snapshot; close() when the campaign's driver ends.

    stream: where to write (default stdout); live: redraw in place (default: when stream is a terminal).
    """

    def __init__(self, stream=None, live: bool | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._seen: dict[str, str] = {}  # trial -> terminal status already printed
        self.last_line = ""  # the last summary line printed (plain output)
        self._driver_key: tuple | None = None  # the driver state last printed (plain output)
        self._live = None

    def show(self, progress: Progress) -> None:
        for line in _finished_lines(progress, self._seen):
            self._print(line)
        if self.live:
            self._redraw(progress)
        else:
            driver = driver_line(progress)
            if driver is not None and _driver_key(progress) != self._driver_key:  # a new driver, or it died
                self._print(driver)
                self._driver_key = _driver_key(progress)
            line = progress.summary()
            if line != self.last_line:  # plain output: a line when something changed, no redraw
                self._print(line)
                self.last_line = line

    def skip_finished(self, exp) -> None:
        """Announce no trial that had ended already (a resumed campaign's earlier trials)."""
        _finished_lines(read_progress(exp), self._seen)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _print(self, line: str) -> None:
        if self._live is not None:
            self._live.console.print(line, highlight=False, markup=False)
        else:
            print(line, file=self.stream, flush=True)

    def _redraw(self, progress: Progress) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self.stream), auto_refresh=False, transient=False)
            self._live.start()
        self._live.update(live_block(progress), refresh=True)


def _finished_lines(progress: Progress, seen: dict[str, str]) -> list[str]:
    """One line per trial that reached a final status since the last snapshot."""
    lines = []
    for t in progress.finished:
        if seen.get(t.name) != t.status:
            seen[t.name] = t.status
            lines.append(finished_line(t))
    return lines


def finished_line(t: FinishedTrial) -> str:
    """`trial fsne-h64-c8-shared-00002 completed: 4/4 epochs, top-1 71.20%, 0.052M params, 0.0013 GMACs`"""
    if t.status == "duplicate":
        return f"trial {t.name} duplicate: {t.note}"
    parts = [f"{t.epochs}/{t.planned} epochs"]
    if t.top1 is not None:
        parts.append(f"top-1 {t.top1:.2f}%")
    for key, unit, fmt in (("params_m", "M params", ".3f"), ("gmacs", " GMACs", ".4f")):
        if isinstance(t.cost.get(key), (int, float)):
            parts.append(f"{t.cost[key]:{fmt}}{unit}")
    line = f"trial {t.name} {t.status}: " + ", ".join(parts)
    return f"{line} | {t.note}" if t.note else line


def closing_summary(progress: Progress, exp: str, shown: str = "") -> str:
    """What `launch` and `resume` print at the end: counts, the completed front, the next command.
    shown: the summary line the view printed last (not printed again)."""
    lines = [] if progress.summary() == shown else [progress.summary()]
    if progress.front:
        metrics = [m for m, _ in progress.objectives]
        width = max(len("trial"), *(len(f["trial"]) for f in progress.front))
        lines.append(f"front of the completed trials ({len(progress.front)}):")
        lines.append("  " + "  ".join([f"{'trial':<{width}}", *(f"{m:>10}" for m in metrics)]))
        for f in sorted(progress.front, key=lambda f: [f[m] for m in metrics]):
            lines.append("  " + "  ".join([f"{f['trial']:<{width}}", *(f"{f[m]:>10.4g}" for m in metrics)]))
    proposals = count_proposals(exp)
    if proposals:  # infeasible proposals took no trial slot (search.records.proposals)
        total = proposals + sum(progress.counts.values())
        lines.append(f"infeasible proposals: {proposals} of {total} ({proposals / total:.0%}) broke a cost "
                     "constraint and took no trial slot")
    failed = progress.counts.get("failed", 0)
    if failed:
        lines.append(f"{failed} trial(s) failed; `qkvsearch status {exp}` shows their errors")
    lines.append(f"results: {exp}\nnext: qkvsearch report {exp}")
    return "\n".join(lines)


def all_failed(progress: Progress) -> str | None:
    """The last line of the first failed trial's error when every trial that ended failed (nothing trained to
    a result: the campaign did not do what it was for; `launch` and `resume` then exit non-zero), else None.
    A stopped, diverged, duplicate or infeasible trial is an outcome, not a failure."""
    ended = [t for t in progress.finished if t.status in FINAL_STATUSES]
    if not ended or any(t.status != "failed" for t in ended):
        return None
    first = ended[0]
    return f"{first.name}: {first.note or 'failed without an error message'}"


def live_block(progress: Progress):
    """A rich renderable: progress bars of trials and epochs, the running trials, the front."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    bars = Table.grid(padding=(0, 1))
    if progress.oneshot is not None:  # its trials are the retraining: a bar per phase instead
        bars.add_row("phase", "", progress.oneshot.phase)
        for label, done, total, text in progress.oneshot.bars():
            bars.add_row(label, ProgressBar(total=total, completed=done, width=40), text)
    else:
        bars.add_row("trials", ProgressBar(total=max(progress.trials_planned, 1), completed=progress.trials_done,
                                           width=40), f"{progress.trials_done}/{progress.trials_planned}")
    bars.add_row("epochs", ProgressBar(total=max(progress.epochs_planned, 1), completed=progress.epochs_done,
                                       width=40), f"{progress.epochs_done}/{progress.epochs_planned}")
    running = Table("running trial", "epoch", "top-1 %", "loader wait", box=None, pad_edge=False)
    for t in progress.running:
        running.add_row(t.name, f"{t.epochs}/{t.planned}", "-" if t.top1 is None else f"{t.top1:.2f}",
                        "-" if t.loader_wait is None else f"{t.loader_wait:.0%}")
    hv = "-" if progress.hypervolume is None else f"{progress.hypervolume:.4g}"
    front = f"front: {len(progress.front)} trial(s), hypervolume {hv}" + (
        f" (reference {progress.reference})" if progress.reference else "")
    if progress.best:
        front += "; best " + ", ".join(f"{m} {v:.4g}" for m, v in progress.best.items())
    driver = driver_line(progress)
    return Group(bars, running if progress.running else "no trial running", front, *([driver] if driver else []))


def driver_line(progress: Progress) -> str | None:
    """`driver: live, host ..., pid ..., last heartbeat 4 s ago` (search.records.lease.DriverState.line), or
    None: not read, this process's own hold (a driver's view of itself), an ended campaign without driver."""
    state = progress.driver
    if state is None or (state.holder is not None and state.holder.is_this_process()):
        return None
    if progress.ended and state.holder is None:
        return None
    return state.line()


def _driver_key(progress: Progress) -> tuple:
    """What a plain view reprints on change: live / stale / none and which driver (not its heartbeat age)."""
    state = progress.driver
    holder = state.holder if state else None
    return state.live if state else None, state.stale if state else None, holder and (holder.host, holder.pid)
