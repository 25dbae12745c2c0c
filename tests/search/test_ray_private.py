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
