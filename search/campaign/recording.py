"""The trial recorder as a Ray Tune callback: Tune calls it in the campaign's driver process."""
from __future__ import annotations

from ray.tune import Callback

from qkvsearch.search.records.recorder import Recorder


class TrialRecorder(Recorder, Callback):
    __doc__ = Recorder.__doc__
