"""What qkvsearch changes in Ray through its private API keeps Ray's behaviour and only saves its cost."""
from __future__ import annotations

import json
import subprocess
import sys

COUNT = """
import json, sys
from ray.air._internal import usage
from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback, LoggerCallback
from qkvsearch import ray_private

class MLflowLoggerCallback(LoggerCallback):   # a built-in integration's name: counted under it
    pass

class Tracker(LoggerCallback):
    pass

callbacks = [Callback(), Callback(), Tracker(), CSVLoggerCallback(), MLflowLoggerCallback(), object()]
tune_count = usage._count_callbacks
ray_private.count_callbacks_by_name()
first = usage._count_callbacks
ray_private.count_callbacks_by_name()   # a second driver run in the same process: replaced once
ours = dict(usage._count_callbacks(callbacks))
loaded = sorted(m for m in ("mlflow", "wandb", "comet_ml", "aim") if m in sys.modules)
print(json.dumps({"ours": ours, "tune": dict(tune_count(callbacks)), "loaded": loaded,
                  "once": usage._count_callbacks is first and first is not tune_count}))
"""


def test_tune_usage_tag_counts_callbacks_as_tune_does_without_importing_the_trackers():
    out = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, check=True, cwd="/")
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == []          # counted before Tune's own count imported the integrations
    assert seen["ours"] == seen["tune"] == {"CustomCallback": 2, "CustomLoggerCallback": 1,
                                            "CSVLoggerCallback": 1, "MLflowLoggerCallback": 1}
    assert seen["once"] is True


def test_an_ended_trials_result_statistics_are_dropped_and_its_last_result_kept():
    """Tune keeps statistics of every numeric key a trial reported; an ended trial's are dropped (and so
    neither kept in the driver nor written at each experiment-state save), its last result is not."""
    from ray.tune.experiment import Trial

    from qkvsearch import ray_private

    trial = Trial("fn", config={"x": 1}, stub=True)
    trial.update_last_result({"top1": 50.0, "epoch": 1.0, "training_iteration": 1})
    trial.update_last_result({"top1": 60.0, "epoch": 2.0, "training_iteration": 2})
    before = len(trial.run_metadata.get_json_state())
    assert trial.metric_analysis["top1"]["max"] == 60.0 and trial.metric_n_steps["top1"]["5"]
    ray_private.drop_result_statistics(trial)
    assert trial.metric_analysis == {} and trial.metric_n_steps == {}
    assert trial.last_result["top1"] == 60.0
    assert len(trial.run_metadata.get_json_state()) < before   # the cached JSON was dropped with them

