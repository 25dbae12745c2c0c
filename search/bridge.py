"""How a trial of several workers drives its Train run: Train's controller and workers run in processes of
their own, and what rank 0 reports reaches Tune from the trial's own training thread.

Tune's bridge (TuneReportCallback) hands results to the trial's main thread while the training thread
waits in `fit()`; Tune's stop then never reaches the Train run, so a stopped trial would keep its
controller, workers and CPUs, and its process could not serve the next trial (`reuse_actors`). Here
`fit()` runs in a helper thread and the training thread takes each result from a queue and calls
`tune.report` itself. Tune stops a trial inside `tune.report` (a SystemExit there); the trial then kills
its Train run's controller, whose workers go with it and whose placement group Train's cleaner removes,
before it lets the process go:

    trial process            queue (1 slot)                 Train controller          workers
    drive() ──on_report───▶ get ◀── (token, metrics, ──── _Forward.after_report ◀── ray.train.report
       │       (tune.report)         checkpoint, controller)
       └─ Tune's stop: ray.kill(controller) ──────────────────────▶ ✕ (its workers too)

The queue is an actor on the trial's node, made by the process's first Train run and kept for the trials
that reuse the process; each run tags its items with a token of its own, so nothing a stopped run left
behind reaches the next trial. One slot, as in Tune's own bridge: the controller waits until the trial has
taken a result, so a run never gets ahead of the decisions Tune makes on its results.
"""
from __future__ import annotations

import threading
import uuid

import ray
from ray.train import UserCallback

POLL_S = 0.2            # how often the training thread looks at its Train run when no result comes
STOP_WAIT_S = 5.0       # how long a stopped trial waits for fit() to return after killing the controller

_queue = None           # this process's queue (a ray.util.queue.Queue actor), made on first use


def drive(fit, on_report):
    """Run ``fit(callbacks)`` (a TorchTrainer's fit with these Train callbacks added) in a helper thread;
    hand each result of rank 0 to ``on_report(metrics, checkpoint_path | None)``, which calls tune.report,
    in this thread. Returns fit's Result or raises its error; Tune's stop kills the Train run and goes on up."""
    queue, token = _channel(), uuid.uuid4().hex
    outcome: dict = {}
    thread = threading.Thread(target=_fit_into, args=(fit, [_Forward(queue, token)], outcome),
                              name="train-run", daemon=True)
    thread.start()
    controller = None
    try:
        while (item := _next(queue, thread)) is not None:
            sent_by, metrics, checkpoint_path, sender = item
            if sent_by == token:  # else left by a run this process stopped before
                controller = sender
                on_report(metrics, checkpoint_path)
    except BaseException:  # Tune's stop (SystemExit in tune.report), or this process going down
        _stop(controller, thread)
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


def _next(queue, thread: threading.Thread):
    """The next item, or None once fit() has returned and nothing is left. The controller's last put
    completes before its run ends, so an item may still wait after the thread is gone: look once more."""
    from ray.util.queue import Empty

    while True:
        alive = thread.is_alive()
        try:
            return queue.get(block=alive, timeout=POLL_S if alive else None)
        except Empty:
            if not alive:
                return None


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
    global _queue
    if _queue is None:
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        _queue = Queue(maxsize=1, actor_options={"num_cpus": 0, "scheduling_strategy": here})
    return _queue


class _Forward(UserCallback):
    """Runs in Train's controller: each of rank 0's results and its checkpoint's path go to the trial with
    the controller's handle."""

    def __init__(self, queue, token: str):
        self.queue, self.token = queue, token

    def after_report(self, run_context, metrics, checkpoint):
        path = checkpoint.path if checkpoint else None
        self.queue.put((self.token, metrics[0], path, ray.get_runtime_context().current_actor))
