"""Ctrl-C and SIGTERM during `launch` / `resume`: stop the campaign the way Tune stops on Ctrl-C (trials
stopped, experiment state saved), then let the caller know it was stopped rather than finished.

Tune installs its own SIGINT handler when `fit()` starts and, after the first signal, puts back the one it
found; it returns from `fit()` normally either way, and never handles SIGTERM (Python's default ends the
process at once, leaving trials `running` and Ray's processes behind). `StopSignals` is a Tune callback:
its `setup`, which Tune calls after installing that handler, wraps it so that SIGINT and SIGTERM are
both recorded and handed to Tune. A second signal raises KeyboardInterrupt: stop now.
"""
from __future__ import annotations

import signal
import threading

from ray.tune import Callback

CAUGHT = (signal.SIGINT, signal.SIGTERM)


class StopSignals(Callback):
    """with StopSignals() as stop: ... tune.RunConfig(callbacks=[stop, ...]) ...

    `received`: the name of the first stop signal ("SIGINT", "SIGTERM"), or None. Until Tune's setup, a
    SIGTERM raises KeyboardInterrupt like Ctrl-C does, so Ray is still shut down by the caller's finally.
    """

    def __init__(self):
        self.received: str | None = None
        self._before: dict[int, object] = {}

    def __enter__(self):
        if _main_thread():
            self._before = {sig: signal.getsignal(sig) for sig in CAUGHT}
            signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __getstate__(self) -> dict:
        """Pickled with Tune's run config (tuner.pkl): the handlers it holds stay in this process (one may be
        an earlier Tune run's, closing over its locks)."""
        return {**self.__dict__, "_before": {}}

    def __exit__(self, *exc):
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        self._before = {}
        return False

    def setup(self, **info) -> None:
        if not self._before:
            return  # not entered, or not the main thread: signals stay as they are
        tune_handler = signal.getsignal(signal.SIGINT)

        def on_signal(signum, frame):
            if self.received is not None:
                raise KeyboardInterrupt
            self.received = signal.Signals(signum).name
            if callable(tune_handler):
                tune_handler(signal.SIGINT, frame)

        for sig in CAUGHT:
            signal.signal(sig, on_signal)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # only it can set signal handlers


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class CampaignInterrupted(KeyboardInterrupt):
    """The campaign's driver was stopped by a signal before the campaign ended; str(): what to do next."""

    def __init__(self, exp: str, signal_name: str, trials: list[str]):
        self.exp, self.signal_name, self.trials = exp, signal_name, trials
        stopped = f"; {len(trials)} running trial(s) marked interrupted" if trials else ""
        super().__init__(f"stopped by {signal_name}{stopped}; `qkvsearch resume {exp}` continues the campaign")

    def __str__(self) -> str:
        return str(self.args[0])
