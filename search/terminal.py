"""What a person sees of a running campaign in the terminal: a live block redrawn in place (rich) on a
terminal, plain lines elsewhere (CI, log files, `ray job submit`), and one line per finished trial
in both. Fed `progress.Progress` snapshots by `monitor.CampaignMonitor`."""
from __future__ import annotations

import sys

from qkvsearch.search.progress import TERMINAL, Progress


class TerminalView:
    """show(progress) after every snapshot; close() when the campaign's driver ends.

    stream: where to write (default stdout); live: redraw in place (default: when stream is a terminal).
    """

    def __init__(self, stream=None, live: bool | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._seen: dict[str, str] = {}  # trial -> terminal status already printed
        self._last_line = ""
        self._live = None

    def show(self, progress: Progress) -> None:
        for line in _finished_lines(progress, self._seen):
            self._print(line)
        if self.live:
            self._redraw(progress)
        else:
            line = progress.summary()
            if line != self._last_line:  # plain output: a line when something changed, no redraw
                self._print(line)
                self._last_line = line

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
    for name, status, epochs, top1 in progress.finished:
        if seen.get(name) != status and status in TERMINAL:
            seen[name] = status
            if status == "duplicate":
                lines.append(f"trial {name} duplicate: an earlier trial trained its configuration")
                continue
            top = "" if top1 is None else f", top-1 {top1:.2f}%"
            lines.append(f"trial {name} {status} after {epochs} epoch(s){top}")
    return lines


def live_block(progress: Progress):
    """A rich renderable: progress bars of trials and epochs, the running trials, the front."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    bars = Table.grid(padding=(0, 1))
    bars.add_row("trials", ProgressBar(total=max(progress.trials_planned, 1), completed=progress.trials_done,
                                       width=40), f"{progress.trials_done}/{progress.trials_planned}")
    bars.add_row("epochs", ProgressBar(total=max(progress.epochs_planned, 1), completed=progress.epochs_done,
                                       width=40), f"{progress.epochs_done}/{progress.epochs_planned}")
    running = Table("running trial", "epoch", "top-1 %", box=None, pad_edge=False)
    for t in progress.running:
        running.add_row(t.name, f"{t.epochs}/{t.planned}", "-" if t.top1 is None else f"{t.top1:.2f}")
    hv = "-" if progress.hypervolume is None else f"{progress.hypervolume:.4g}"
    front = f"front: {len(progress.front)} trial(s), hypervolume {hv}"
    if progress.best:
        front += "; best " + ", ".join(f"{m} {v:.4g}" for m, v in progress.best.items())
    return Group(bars, running if progress.running else "no trial running", front)
