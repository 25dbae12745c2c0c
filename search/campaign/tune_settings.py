"""The Ray Tune settings a campaign's driver applies to its Tune run, and why (search.campaign.run reads them).

Measured with benchmarks/bench_scale.py (benchmarks/README.md, "Driver scale"): over 300 trivial trials Tune,
left at its defaults, kept in the driver per trial its ``Trial`` (config, last result, per-metric statistics
and two deques of recent values per numeric result key, the trial's JSON for the experiment state) and its
logger callbacks' state, and wrote per trial ``progress.csv``, ``result.json``, ``params.json``,
``params.pkl`` and a TensorBoard events file into its trial folder: 9.7 KB a trial that every experiment-state
save copies again, with the state, from Tune's staging folder to the campaign folder.

- ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``: no CSV, JSON or TensorBoard logger callback. qkvsearch's own
  records (``qs_trials/``: every epoch of every trial) are what its reports, ``status``, ``watch`` and resume
  read; ``--track tensorboard`` writes TensorBoard files for those who want them. Tune's loggers also keep
  state per trial that they never drop (``JsonLoggerCallback`` a trial's config, ``CSVLoggerCallback`` a
  flag, the TensorBoard logger a closed writer per trial), and the TensorBoard logger imports tensorboardX.

What no public Tune setting changes (the measured share of Tune that stays): the controller keeps every
``Trial`` until the run ends, with its last result, ``metric_analysis`` (max, min, mean, last, last-5 and
last-10 means) and ``metric_n_steps`` (a 5- and a 10-long deque) for every numeric key of the last result,
and its cached JSON; every experiment-state save writes all trials' JSON (about 33 KB a trial here).

Without its loggers' files, Tune's ``ExperimentAnalysis`` (built when a run ends and when a run is restored;
qkvsearch reads neither) finds no metrics to load and warns once per trial: that warning is dropped while the
settings apply, and only it.

``QKVSEARCH_TUNE_DEFAULTS=1`` in the driver's environment gives Tune's defaults back (its loggers' files in
each trial folder, for a tool that reads them); ``benchmarks/bench_scale.py --compare`` measures both.

    with applied():      # around Tuner(...) / Tuner.restore(...) and fit()
        ...
"""
from __future__ import annotations

import contextlib
import logging
import os

DEFAULTS_ENV = "QKVSEARCH_TUNE_DEFAULTS"  # "1": Tune's own defaults, none of the settings below

# Environment variables Tune reads in the driver (set only while `applied()` runs: search.campaign.run).
TUNE_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # ray.tune.utils.callback._create_default_callbacks
}


def tune_defaults() -> bool:
    """Whether the driver runs Tune with its own defaults (``QKVSEARCH_TUNE_DEFAULTS=1``)."""
    return os.environ.get(DEFAULTS_ENV, "").strip() == "1"


def tune_env() -> dict[str, str]:
    """The environment variables to set while Tune runs the campaign ({} under QKVSEARCH_TUNE_DEFAULTS=1)."""
    return {} if tune_defaults() else dict(TUNE_ENV)


ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"
MISSING_METRICS = "Failed to fetch metrics for"  # its warning when trial folders hold no logger files


class _DropMissingMetrics(logging.Filter):
    """Drops ExperimentAnalysis's warning that trial folders hold no result.json or progress.csv."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(MISSING_METRICS)


@contextlib.contextmanager
def applied():
    """The settings, for as long as the block runs: ``tune_env()`` in the environment (what was there before
    is put back after) and, with Tune's loggers off, their missing files not reported. Under
    QKVSEARCH_TUNE_DEFAULTS=1: nothing."""
    env = tune_env()
    analysis, dropping = logging.getLogger(ANALYSIS_LOGGER), _DropMissingMetrics()
    if env.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS") == "1":
        analysis.addFilter(dropping)
    try:
        with environment(env):
            yield
    finally:
        analysis.removeFilter(dropping)


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """``env`` in the process environment for as long as the block runs; what was there before is put back."""
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


__all__ = ["DEFAULTS_ENV", "TUNE_ENV", "applied", "environment", "tune_defaults", "tune_env"]
