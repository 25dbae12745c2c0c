"""png + svg of the report's figures through plotly's image exporter, kaleido, in a child process with a time
limit.

kaleido drives a Chromium and waits on its answers with no time limit of its own: a browser that stops
answering (seen on a loaded machine) would hang the report for good. A child that overruns `EXPORT_TIMEOUT_S`
is stopped with every process it started, the browser among them; the report then goes on without the static
figures, saying why, as it does when no browser is installed.

    python -m qkvsearch.search.analysis.static_export FOLDER   # FOLDER/<name>.json -> <name>.png, <name>.svg
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qkvsearch.spaces.errors import reason
from qkvsearch.storage import write_bytes

logger = logging.getLogger("qkvsearch.search.analysis.report")  # the report's warnings, under one name

EXPORT_TIMEOUT_S = 120   # every figure of a report renders in seconds; a browser that hangs never does
STOP_WAIT_S = 30         # SIGKILL takes effect at once on an idle machine, within a second on a loaded one
FORMATS = ("png", "svg")
WIDTH, HEIGHT = 1100, 650
SKIPPED = "static png/svg figures skipped"
REASON_MARK = "qkvsearch-static-export: "  # the child's last word on why it wrote nothing


def export_static(figures: dict, out: str) -> dict[str, str]:
    """Write every figure of ``figures`` (name -> plotly figure or figure dict) as out/<name>.png and .svg; returns
    {"<name>_png": path, ...}, or {} with one warning line saying why none was written."""
    import plotly.io as pio

    with tempfile.TemporaryDirectory(prefix="qs-static-") as tmp:
        for name, fig in figures.items():  # a figure or its dict: plotly's JSON either way
            Path(tmp, f"{name}.json").write_text(pio.to_json(fig, validate=False))
        why = _run_child(tmp)
        if why:
            logger.warning("%s: %s; pareto.html has every figure", SKIPPED, why)
            return {}
        written = {}
        for name in figures:
            for ext in FORMATS:
                write_bytes(f"{out}/{name}.{ext}", Path(tmp, f"{name}.{ext}").read_bytes())
                written[f"{name}_{ext}"] = f"{out}/{name}.{ext}"
        return written


def _run_child(folder: str) -> str | None:
    """Run the exporter on ``folder``; None once it wrote every file, else why not."""
    proc = subprocess.Popen([sys.executable, "-m", __name__, folder], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=EXPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        left = _stop(proc)
        stopped = "it was stopped with its browser" if not left else \
            f"processes {left} it started were still running {STOP_WAIT_S} s after SIGKILL"
        return f"plotly's image exporter (kaleido) did not finish within {EXPORT_TIMEOUT_S} s; {stopped}"
    finally:
        if proc.poll() is None:  # interrupted while waiting (Ctrl-C, SIGTERM): the browser goes too
            if left := _stop(proc):
                logger.warning("processes %s of the image exporter were still running %s s after SIGKILL",
                               left, STOP_WAIT_S)
    if proc.returncode == 0:
        return None
    marked = [line[len(REASON_MARK):] for line in err.splitlines() if line.startswith(REASON_MARK)]
    tail = err.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
    return marked[-1] if marked else f"the image exporter failed ({tail[0][:300]})"


def _stop(proc: subprocess.Popen) -> list[int]:
    """SIGKILL the child and every process it started: its own process group, and the browser kaleido starts
    in a session of its own (found by parentage, before the child is gone). Returns once each is gone (ended:
    reaped, or a zombie left for its parent), within `STOP_WAIT_S`; the pids still running then, which the
    caller names."""
    # Stopped first, then killed: a stopped process starts no other, so the tree found is the whole tree.
    tree = new = [proc.pid]
    while new:
        _signal(new, signal.SIGSTOP)
        new = [p for p in _descendants(proc.pid) if p not in tree]
        tree = tree + new
    _signal(tree, signal.SIGKILL)
    end = time.monotonic() + STOP_WAIT_S
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    return [pid for pid in tree if not _ended(pid, end - time.monotonic())]


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        for kill in (os.killpg, os.kill):  # the group it leads, if it leads one; the process itself
            try:
                kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def _ended(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` ends within ``timeout_s``: a pidfd turns readable when its process exits (Linux >= 5.3),
    whoever its parent is; elsewhere its /proc entry is read until it is gone or a zombie."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfds here
        end = time.monotonic() + max(timeout_s, 0)
        while process_running(pid):
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True
    try:
        return bool(select.select([fd], [], [], max(timeout_s, 0))[0])
    finally:
        os.close(fd)


def process_running(pid: int) -> bool:
    """Whether ``pid`` still runs: a killed process that is not the caller's child has ended once it is a zombie
    (its parent, or init, reaps it later) or gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command's name
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, theirs, ...), from `ps`."""
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def missing(exc: BaseException) -> str:
    """What the static export lacks, said so the user can fix it. Without a browser plotly raises a
    RuntimeError whose text opens with blank lines; kaleido's ChromeNotFoundError under it says more."""
    cause = exc
    while cause is not None and type(cause).__name__ != "ChromeNotFoundError":  # choreographer's, kaleido >= 1
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return f"{reason(exc)}; they need the kaleido package and a Chromium browser (e.g. apt-get install chromium)"
    return ("kaleido (plotly's image exporter) found no Chromium or Chrome executable: it runs the one "
            "BROWSER_PATH names, else chromium, chromium-browser or google-chrome from PATH or /usr/bin "
            f"({reason(cause)}); install one, e.g. apt-get install chromium")


def _child(folder: str) -> int:
    try:
        import plotly.io as pio

        sources = sorted(Path(folder).glob("*.json"))
        figs = [json.loads(p.read_text()) for p in sources for _ in FORMATS]
        paths = [str(p.with_suffix(f".{ext}")) for p in sources for ext in FORMATS]
        pio.write_images(figs, paths, width=WIDTH, height=HEIGHT, validate=False)
    except Exception as exc:  # any exporter failure: the HTML report stands on its own
        print(REASON_MARK + " ".join(missing(exc).split()), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
