"""How a trial of several workers drives its Train run: Train's controller and workers run in processes of
their own, and what rank 0 reports reaches Tune from the trial's own training thread.

Tune's bridge (TuneReportCallback) hands results to the trial's main thread while the training thread
waits in `fit()`; Tune's stop then never reaches the Train run, so a stopped trial would keep its
controller, workers and CPUs, and its process could not serve the next trial (`reuse_actors`). Here
`fit()` runs in a helper thread and the training thread takes each result from a channel and calls
`tune.report` itself. Tune stops a trial inside `tune.report` (a SystemExit there); the trial then kills
its Train run's controller, whose workers go with it and whose placement group Train's cleaner removes,
before it lets the process go:

    trial process                    _Channel actor                 Train controller          workers
    drive() ◀── take ──── (token, metrics, checkpoint, ◀── hand_over ── _Forward.after_report ◀── report
       │ on_report (tune.report)    controller)                 (returns on the ack)
       ├─ Tune goes on: ack(token) ──────▶ releases hand_over
       └─ Tune's stop: ray.kill(controller) ─────────────────────────────────▶ ✕ (its workers too)

The controller waits in each report until Tune has decided on it: a run never gets ahead of the decisions
Tune makes on its results, so it registers no checkpoint past the epoch Tune stopped it at, and Train's
`num_to_keep` never removes the checkpoint of the epoch a stopped trial's record ends with.

The channel is an actor on the trial's node, made by the process's first Train run and kept for the trials
that reuse the process. Everything in it is keyed by its run's token: an item a stopped run left behind
reaches no later run, and a killed controller's wait for an acknowledgement takes none meant for another.
"""
from __future__ import annotations

import asyncio
import threading
import uuid

import ray
from ray.train import UserCallback

POLL_S = 0.2            # how often the training thread looks at its Train run when no result comes
STOP_WAIT_S = 5.0       # how long a stopped trial waits for fit() to return after killing the controller

_process_channel = None  # this process's _Channel actor, made on first use


def drive(fit, on_report):
    """Run ``fit(callbacks)`` (a TorchTrainer's fit with these Train callbacks added) in a helper thread;
    hand each result of rank 0 to ``on_report(metrics, checkpoint_path | None)``, which calls tune.report,
    in this thread. Returns fit's Result or raises its error; Tune's stop kills the Train run and goes on up."""
    channel, token = _channel(), uuid.uuid4().hex
    outcome: dict = {}
    thread = threading.Thread(target=_fit_into, args=(fit, [_Forward(channel, token)], outcome),
                              name="train-run", daemon=True)
    thread.start()
    controller = None
    try:
        while (item := _next(channel, thread)) is not None:
            sent_by, metrics, checkpoint_path, sender = item
            if sent_by == token:  # else left by a run this process stopped before
                controller = sender
                on_report(metrics, checkpoint_path)
                channel.ack.remote(token)
    except BaseException:  # Tune's stop (SystemExit in tune.report), or this process going down
        _stop(controller, thread)
        channel.forget.remote(token)
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _fit_into(fit, callbacks, outcome: dict) -> None:
    try:
        outcome["result"] = fit(callbacks)
    except BaseException as exc:  # noqa: BLE001  (handed to the training thread)
        outcome["error"] = exc


def _next(channel, thread: threading.Thread):
    """The next item, or None once fit() has returned and nothing is left. The controller's last hand-over
    is taken before its run ends, but the thread may end before this one looks: look once more."""
    while True:
        alive = thread.is_alive()
        item = ray.get(channel.take.remote(POLL_S if alive else 0))
        if item is not None or not alive:
            return item


def _stop(controller, thread: threading.Thread) -> None:
    """Kill the Train run's controller (its workers die with it; Train's cleaner removes its placement
    group) and let fit() return."""
    if controller is not None:
        try:
            ray.kill(controller, no_restart=True)
        except Exception:  # noqa: BLE001  (already gone)
            pass
    thread.join(STOP_WAIT_S)


def _channel():
    global _process_channel
    if _process_channel is None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        _process_channel = ray.remote(num_cpus=0)(_Channel).options(scheduling_strategy=here).remote()
    return _process_channel


class _Channel:
    """Results from Train runs' controllers to their trial, one run at a time (an async actor)."""

    def __init__(self):
        self._items = asyncio.Queue()
        self._waiting: dict[str, asyncio.Event] = {}  # token -> released when the trial acknowledges

    async def hand_over(self, token: str, item) -> None:
        """From a controller: returns once the trial has acknowledged the item (or forgotten the run)."""
        self._waiting[token] = done = asyncio.Event()
        await self._items.put((token, *item))
        await done.wait()

    async def take(self, timeout_s: float):
        """From the trial: the next item, or None within timeout_s."""
        try:
            return await asyncio.wait_for(self._items.get(), timeout_s) if timeout_s else self._items.get_nowait()
        except (asyncio.TimeoutError, asyncio.QueueEmpty):
            return None

    def ack(self, token: str) -> None:
        """From the trial: Tune decided on the run's item and lets it go on."""
        done = self._waiting.pop(token, None)
        if done is not None:
            done.set()

    def forget(self, token: str) -> None:
        """From the trial that stopped the run: release the wait its killed controller left."""
        self.ack(token)


class _Forward(UserCallback):
    """Runs in Train's controller: each of rank 0's results and its checkpoint's path go to the trial with
    the controller's handle; the controller goes on once the trial acknowledges it (Tune let it go on)."""

    def __init__(self, channel, token: str):
        self.channel, self.token = channel, token

    def after_report(self, run_context, metrics, checkpoint):
        path = checkpoint.path if checkpoint else None
        ray.get(self.channel.hand_over.remote(
            self.token, (metrics[0], path, ray.get_runtime_context().current_actor)))
