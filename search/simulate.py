"""Replay a campaign's searcher and scheduler on recorded learning curves: no training, no Ray actors.

    from qkvsearch.search.simulate import Setting, compare, load_source
    curves = load_source("results/quickstart")          # a campaign folder, or a .parquet / .csv table
    runs = compare(curves, [Setting.parse("fifo"), Setting.parse("moasha:brackets=2")], concurrency=4)
    for run in runs:
        print(run.label, run.hv_at_epochs(0.5 * curves.grid_epochs) / curves.grid_hv)

The schedulers are the very classes a campaign builds (``search.campaign._scheduler``):
``MOASHAScheduler``, Ray's ``ASHAScheduler`` and ``FIFOScheduler``, driven through Tune's callbacks
(``on_trial_add``, ``on_trial_result``, ``on_trial_complete``) with stand-in trials that carry only a
``trial_id``. Nothing here re-implements a scheduling rule.

Sources
-------
A campaign folder (``qs_campaign.json`` + ``qs_trials/``), read through ``search.results.collect``: one
curve per recorded trial that reported an epoch, its ``epochs.parquet`` rows with the trial's cost
columns (``params_m``, ``gmacs``, ``params``, ``embed_params``) added to every epoch, as the
campaign's results carry them.
The campaign's spec gives the objectives, the planned epochs (``train.epochs``), the scheduler's
grace, reduction factor and brackets, and the concurrency (``resources.max_concurrent_trials`` when
a number). The default start-up per trial is the median over its trials of (ended_at - started_at
- sum of epoch_s).

A tabular benchmark file (``.parquet`` or ``.csv``), one row per (curve, epoch):

=================  ==========================================================================
column             meaning
=================  ==========================================================================
``config_<key>``   the configuration (any type). Rows with equal config columns are one curve.
``trial_id``       optional: names the curve instead (several curves may share a configuration)
``epoch``          1, 2, ... (int); a curve is its rows of epochs 1..n without a gap
``<metric>``       every other numeric column: reported to the scheduler as a result key. Training
                   metrics (``top1``, ``val_loss``, ...) change per epoch; cost metrics
                   (``params_m``, ``gmacs``) are repeated on every row
``epoch_s``        optional: seconds the epoch took. Missing values: the curve's median, else the
                   file's, else 1 s
=================  ==========================================================================

The planned epochs (the schedulers' ``max_t``) are the longest curve's; a shorter curve is a trial that
stopped or failed. Objectives: ``objectives=[("top1", "max"), ...]``, by default those of
top1 (max), gmacs (min) and params_m (min) that are columns. Start-up per trial: 0 s by default.

Simulation
----------
One simulated clock and ``concurrency`` slots. A free slot asks the searcher for a trial, spends
``startup_s``, then each recorded epoch's ``epoch_s``. The events (a trial finishing an epoch) sit
in a heap ordered by (time, sequence number), so simultaneous events resolve in a fixed order. Each
epoch's result (the curve's row, with ``epoch``) goes to ``on_trial_result`` as Tune passes it; a STOP,
or the curve's last recorded epoch, ends the trial (``on_trial_complete`` on the scheduler and the
searcher) and frees the slot. A trial whose curve ends before the planned epochs ends there without
being complete: what it would have done next was never recorded.

Searcher: ``ShuffledCurves`` suggests every curve once, in an order drawn from the seed (a new order
for each further pass when more trials than curves are asked for). Ray's ASHA draws its brackets from
numpy's global generator: it is seeded from the same seed for the run and restored afterwards. A
seed therefore fixes the whole run.

Scoring: a trial is complete when it trained for the planned epochs; its objectives are its last
epoch's values. The hypervolume of the completed trials' front (``search.pareto``) is measured
against one reference point per source (``reference_point`` of every complete curve's final values)
and compared with the full grid's (every complete curve trained to the end), against simulated time
and against epochs spent (``grid_epochs``: the epochs of every recorded curve, what FIFO over all of
them spends).
"""
from __future__ import annotations

import heapq
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qkvsearch.search.pareto import hypervolume, hypervolume_trace, reference_point
from qkvsearch.search.schedulers import as_float
from qkvsearch.spaces.errors import BadInput

__all__ = ["Curves", "Run", "Setting", "ShuffledCurves", "SimTrial", "compare", "curves_from_frame",
           "default_out_dir", "default_settings", "format_table", "load_source", "load_table",
           "parse_objectives", "parse_settings", "simulate", "write_outputs"]

log = logging.getLogger(__name__)

TIME_ATTR = "epoch"  # the progress key a campaign's results carry (search.driver.TIME_ATTR)
CONFIG_PREFIX = "config_"
DEFAULT_OBJECTIVES = (("top1", "max"), ("gmacs", "min"), ("params_m", "min"))
COST_COLUMNS = ("params_m", "gmacs", "params", "embed_params")
DEFAULT_CONCURRENCY = 4
SCHEDULER_TYPES = ("fifo", "asha", "moasha")
TRAINING_METRICS = ("top1", "top5", "val_loss", "train_loss")  # spaces.keys.SCHEDULER_METRICS


# ---------------------------------------------------------------------------------------- sources
@dataclass
class Curves:
    """Recorded learning curves, one per candidate trial.

    results[c][e]: the result dict of curve c's epoch e + 1; epoch_s[c]: (E_c,) seconds per epoch;
    finals: (n, k) objective values at the planned epoch, NaN rows for curves shorter than max_t."""

    name: str
    ids: list[str]
    configs: list[dict]
    results: list[list[dict]]
    epoch_s: list[np.ndarray]
    max_t: int
    objectives: tuple[tuple[str, str], ...]
    startup_s: float = 0.0
    concurrency: int | None = None
    scheduler: dict = field(default_factory=dict)  # the campaign's: type, grace_epochs, reduction_factor, brackets
    finals: np.ndarray = field(init=False)
    reference: np.ndarray = field(init=False)
    grid_hv: float = field(init=False)
    grid_epochs: int = field(init=False)

    def __post_init__(self):
        k = len(self.objectives)
        self.finals = np.full((len(self.ids), k), np.nan)
        for c, rows in enumerate(self.results):
            if len(rows) >= self.max_t:
                self.finals[c] = [as_float(rows[self.max_t - 1].get(m)) for m, _ in self.objectives]
        ok = ~np.isnan(self.finals).any(axis=1)
        if not ok.any():
            raise BadInput(f"{self.name}: expected at least one curve trained for the planned {self.max_t} "
                           f"epochs with every objective ({', '.join(self.metrics)}), given none")
        self.reference = reference_point(self.finals[ok], self.directions)
        self.grid_hv = hypervolume(self.finals[ok], self.directions, self.reference)
        self.grid_epochs = int(sum(len(r) for r in self.results))

    @property
    def metrics(self) -> list[str]:
        return [m for m, _ in self.objectives]

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]

    def __len__(self) -> int:
        return len(self.ids)


def load_source(source, objectives: Sequence[tuple[str, str]] | None = None) -> Curves:
    """A campaign folder or a tabular file (see the module doc) -> Curves. BadInput when unreadable."""
    text = os.fspath(source)
    lower = text.lower()
    if lower.endswith((".parquet", ".csv")):
        return load_table(text, objectives)
    if "://" not in text and not os.path.isdir(text):
        raise BadInput(f"source: expected a campaign folder or a .parquet/.csv file, given {text}")
    return _load_campaign(text, objectives)


def load_table(path, objectives: Sequence[tuple[str, str]] | None = None) -> Curves:
    """A tabular benchmark file (Parquet or CSV) -> Curves."""
    import pandas as pd

    text = os.fspath(path)
    try:
        if text.lower().endswith(".csv"):
            df = pd.read_csv(text)
        else:
            import pyarrow.parquet as pq

            df = pq.read_table(text).to_pandas()
    except (OSError, ValueError) as err:
        raise BadInput(f"{text}: expected a readable {'CSV' if text.lower().endswith('.csv') else 'Parquet'} "
                       f"file, given one that fails to read ({err})") from None
    return curves_from_frame(df, text, objectives)


def curves_from_frame(df, name: str, objectives=None, *, max_t: int | None = None, startup_s: float = 0.0,
                      concurrency: int | None = None, scheduler: dict | None = None) -> Curves:
    """A pandas DataFrame in the tabular format -> Curves."""
    import pandas as pd

    if "epoch" not in df.columns:
        raise BadInput(f"{name}: expected an 'epoch' column, given columns {', '.join(map(str, df.columns))}")
    epoch = pd.to_numeric(df["epoch"], errors="coerce")
    bad = epoch.isna() | (epoch < 1) | (epoch != epoch.round())
    if bad.any():
        raise BadInput(f"{name}: epoch: expected ints >= 1, given {df['epoch'][bad].iloc[0]!r}")
    df = df.assign(epoch=epoch.astype("int64"))
    config_cols = [c for c in df.columns if str(c).startswith(CONFIG_PREFIX)]
    if "trial_id" in df.columns:
        keys = ["trial_id"]
    elif config_cols:
        keys = config_cols
    else:
        raise BadInput(f"{name}: expected config_<key> columns (or a trial_id column) naming each curve, "
                       f"given columns {', '.join(map(str, df.columns))}")
    skip = {"epoch", "epoch_s", "trial_id", "trial_name", *config_cols}
    metric_cols = [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
                   and not pd.api.types.is_bool_dtype(df[c])]
    objectives = _check_objectives(objectives, metric_cols, name)
    secs = pd.to_numeric(df["epoch_s"], errors="coerce") if "epoch_s" in df.columns else pd.Series(np.nan, df.index)
    secs = secs.where(secs > 0)
    overall = float(secs.median()) if secs.notna().any() else 1.0
    values = df[metric_cols].astype("float64").to_numpy()  # (rows, M)
    epochs = df["epoch"].to_numpy()
    seconds = secs.to_numpy()
    config_values = {c[len(CONFIG_PREFIX):]: df[c].to_numpy() for c in config_cols}
    ids, configs, results, epoch_s = [], [], [], []
    dropped = 0
    for i, (key, idx) in enumerate(df.groupby(keys, dropna=False, sort=False).indices.items()):
        idx = idx[np.argsort(epochs[idx], kind="stable")]
        ep = epochs[idx]
        run = 0  # length of the gapless prefix 1..run (a repeated epoch keeps its last row)
        keep = []
        for j, e in enumerate(ep):
            if e == run:
                keep[-1] = idx[j]
            elif e == run + 1:
                run += 1
                keep.append(idx[j])
            else:
                break
        dropped += len(idx) - len(keep)
        rows = []
        for r in keep:
            res = {m: v for m, v in zip(metric_cols, values[r].tolist()) if v == v}  # NaN: not reported
            res[TIME_ATTR] = int(epochs[r])
            rows.append(res)
        s = seconds[keep] if keep else np.zeros(0)
        own = np.nanmedian(s) if s.size and not np.isnan(s).all() else overall
        epoch_s.append(np.where(np.isnan(s), own, s))
        first = keep[0] if keep else idx[0]
        name_key = key[0] if isinstance(key, tuple) else key
        ids.append(str(name_key) if keys == ["trial_id"] else f"c{i:05d}")
        configs.append({k: v[first] for k, v in config_values.items()})
        results.append(rows)
    if dropped:
        log.warning(f"{name}: left out {dropped} row(s) after a gap or before epoch 1 in their curve")
    planned = max(len(r) for r in results) if max_t is None else int(max_t)
    return Curves(name, ids, configs, results, epoch_s, planned, objectives, startup_s, concurrency,
                  dict(scheduler or {}))


def _check_objectives(objectives, columns: list[str], name: str) -> tuple[tuple[str, str], ...]:
    if objectives is None:
        chosen = tuple(o for o in DEFAULT_OBJECTIVES if o[0] in columns)
        if not chosen:
            raise BadInput(f"{name}: expected a column for an objective (top1, gmacs or params_m; or pass "
                           f"objectives), given columns {', '.join(columns) or '(no numeric column)'}")
        return chosen
    out = []
    for metric, mode in objectives:
        if mode not in ("min", "max"):
            raise BadInput(f"objectives: expected METRIC:min or METRIC:max, given {metric}:{mode}")
        if metric not in columns:
            raise BadInput(f"objectives: expected numeric columns of {name} ({', '.join(columns)}), given {metric}")
        out.append((metric, mode))
    if not out:
        raise BadInput("objectives: expected at least one METRIC:MODE, given none")
    return tuple(out)


def _load_campaign(exp: str, objectives) -> Curves:
    import pyarrow.compute as pc

    from qkvsearch.search.results import collect, load_campaign_record

    spec = load_campaign_record(exp).get("spec") or {}
    trials, epochs = collect(exp)
    if trials.num_rows == 0 or epochs.num_rows == 0:
        raise BadInput(f"{exp}: expected a campaign with recorded epochs, given none")
    if objectives is None:
        raw = spec.get("objectives") or [{"metric": "top1", "mode": "max"}]
        objectives = [(o.get("metric"), o.get("mode")) for o in raw if isinstance(o, dict)]
    cols = ["trial_id"] + [c for c in trials.column_names if c.startswith(CONFIG_PREFIX)]
    cols += [c for c in COST_COLUMNS if c in trials.column_names]
    frame = epochs.drop_columns([c for c in ("trial_name",) + COST_COLUMNS if c in epochs.column_names])
    df = frame.to_pandas().merge(trials.select(cols).to_pandas(), on="trial_id", how="left")
    if df["epoch"].isna().any():  # an epoch record without its number: it cannot be placed
        log.warning(f"{exp}: left out {int(df['epoch'].isna().sum())} epoch row(s) without an epoch number")
        df = df[df["epoch"].notna()]
    train = spec.get("train") if isinstance(spec.get("train"), dict) else {}
    max_t = train.get("epochs")
    if not (isinstance(max_t, int) and max_t >= 1):
        planned = pc.max(trials["epochs_planned"]).as_py()
        max_t = planned if planned else int(df["epoch"].max())
    resources = spec.get("resources") if isinstance(spec.get("resources"), dict) else {}
    conc = resources.get("max_concurrent_trials")
    sched = spec.get("scheduler") if isinstance(spec.get("scheduler"), dict) else {}
    return curves_from_frame(df, exp, objectives, max_t=max_t, startup_s=_startup_estimate(trials, epochs),
                             concurrency=conc if isinstance(conc, int) and conc >= 1 else None,
                             scheduler=sched)


def _startup_estimate(trials, epochs) -> float:
    """Median over trials of (ended_at - started_at - sum of epoch_s): what a trial spends not training."""
    t = trials.select(["trial_id", "started_at", "ended_at"]).to_pandas()
    if "epoch_s" not in epochs.column_names:
        return 0.0
    spent = epochs.select(["trial_id", "epoch_s"]).to_pandas().groupby("trial_id")["epoch_s"].sum()
    wall = (t["ended_at"] - t["started_at"]).dt.total_seconds()
    extra = (wall.to_numpy() - spent.reindex(t["trial_id"]).to_numpy())
    extra = extra[np.isfinite(extra)]
    return float(max(0.0, np.median(extra))) if extra.size else 0.0


# ---------------------------------------------------------------------------------------- settings
_SETTING_RE = re.compile(r"^(?P<type>[a-z]+)(?::(?P<opts>.*))?$")


@dataclass(frozen=True)
class Setting:
    """One scheduler configuration: ``fifo``, ``asha`` or ``moasha`` with grace, rf and brackets.

    shares (moasha, Python only: a campaign always uses the default): the share of trials each bracket
    takes, e.g. (1, 1, 1) for equal shares; None is MOASHAScheduler's default (rf**(2 s) for bracket s)."""

    type: str
    grace: int = 1
    rf: int = 3
    brackets: int = 1
    metric: str | None = None  # asha: the metric it stops on (default: the first training objective)
    shares: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        if self.type == "fifo":
            return "fifo"
        text = f"{self.type} g{self.grace} rf{self.rf}"
        if self.brackets > 1:
            text += f" b{self.brackets}"
        if self.shares is not None:
            text += " shares " + ":".join(f"{x:g}" for x in self.shares)
        return text + (f" {self.metric}" if self.metric else "")

    @classmethod
    def parse(cls, text: str, grace: int = 1, rf: int = 3) -> Setting:
        """``TYPE[:key=value,...]`` with keys grace, rf, brackets (and metric for asha), e.g.
        ``moasha:grace=1,rf=3,brackets=2``; grace and rf default to the given ones."""
        m = _SETTING_RE.match(text.strip())
        expected = "TYPE[:grace=G,rf=R,brackets=B] with TYPE fifo, asha or moasha"
        if not m or m["type"] not in SCHEDULER_TYPES:
            raise BadInput(f"schedulers: expected {expected}, given {text!r}")
        opts: dict = {"grace": grace, "rf": rf, "brackets": 1, "metric": None}
        for part in filter(None, (m["opts"] or "").split(",")):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in opts:
                raise BadInput(f"schedulers: expected {expected}, given {text!r}")
            if key == "metric":
                opts[key] = value.strip()
                continue
            try:
                opts[key] = int(value)
            except ValueError:
                raise BadInput(f"schedulers: expected an int for {key} in {text!r}, given {value!r}") from None
        if opts["grace"] < 1 or opts["brackets"] < 1 or opts["rf"] < 2:
            raise BadInput(f"schedulers: expected grace >= 1, rf >= 2 and brackets >= 1, given {text!r}")
        if m["type"] == "fifo":
            return cls("fifo")
        return cls(m["type"], opts["grace"], opts["rf"], opts["brackets"],
                   opts["metric"] if m["type"] == "asha" else None)


def _rungs(grace: float, rf: float, max_t: float) -> int:
    """How many MO-ASHA rungs (grace * rf**k < max_t) fit."""
    n, m = 0, grace
    while m < max_t:
        n, m = n + 1, m * rf
    return n


def default_settings(curves: Curves) -> list[Setting]:
    """fifo, asha, and moasha with 1, 2, 3 brackets (as many as fit), at the campaign's grace and
    reduction factor (1 and 3 for a table)."""
    sched = curves.scheduler
    grace = sched.get("grace_epochs") if isinstance(sched.get("grace_epochs"), int) else 1
    rf = sched.get("reduction_factor") if isinstance(sched.get("reduction_factor"), int) else 3
    grace = min(grace, curves.max_t)
    fit = max(1, _rungs(grace, rf, curves.max_t))
    out = [Setting("fifo")]
    if any(m in TRAINING_METRICS for m in curves.metrics):
        out.append(Setting("asha", grace, rf))
    out += [Setting("moasha", grace, rf, b) for b in range(1, min(3, fit) + 1)]
    return out


def build_scheduler(setting: Setting, curves: Curves):
    """The scheduler class a campaign would build for this setting (search.campaign._scheduler)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from qkvsearch.search.schedulers import MOASHAScheduler

    if setting.type == "fifo":
        return FIFOScheduler()
    if setting.grace > curves.max_t:
        raise BadInput(f"schedulers: expected grace <= the planned epochs ({curves.max_t}), given {setting.label}")
    common = dict(time_attr=TIME_ATTR, grace_period=setting.grace, reduction_factor=setting.rf,
                  max_t=curves.max_t, brackets=setting.brackets)
    fit = max(1, _rungs(setting.grace, setting.rf, curves.max_t))
    if setting.shares is not None and (setting.type != "moasha" or len(setting.shares) != setting.brackets):
        raise BadInput(f"schedulers: expected shares for moasha only, one per bracket, given {setting.label}")
    if setting.brackets > fit:
        raise BadInput(f"schedulers: expected at most {fit} bracket(s) (the rungs below {curves.max_t} epochs "
                       f"at grace {setting.grace}, rf {setting.rf}), given {setting.label}")
    if setting.type == "asha":
        metric = setting.metric or next((m for m in curves.metrics if m in TRAINING_METRICS), None)
        modes = dict(curves.objectives)
        if metric is None:
            raise BadInput(f"schedulers: expected a training metric ({', '.join(TRAINING_METRICS)}) among the "
                           f"objectives for asha, given {', '.join(curves.metrics)}")
        mode = modes.get(metric) or ("min" if metric.endswith("loss") else "max")
        return ASHAScheduler(metric=metric, mode=mode, **common)
    return MOASHAScheduler(metrics=curves.metrics, modes=curves.directions, bracket_shares=setting.shares, **common)


# ---------------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class SimTrial:
    """What a scheduler reads of a Tune trial: its id (and the config, for a searcher's sake)."""

    trial_id: str
    config: dict


class ShuffledCurves:
    """Searcher over recorded curves: each curve once per pass, in an order drawn from the seed.

    Speaks Tune's Searcher protocol (suggest / on_trial_result / on_trial_complete); a suggestion is
    ``{"curve": index}``, and ``None`` once ``num_trials`` were suggested (Searcher.FINISHED)."""

    def __init__(self, n_curves: int, seed: int, num_trials: int | None = None):
        self.n = n_curves
        self.num_trials = n_curves if num_trials is None else num_trials
        self.rng = np.random.default_rng(seed)
        self.order: list[int] = []
        self.suggested = 0

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials:
            return None
        if not self.order:
            self.order = self.rng.permutation(self.n).tolist()[::-1]  # popped from the end
        self.suggested += 1
        return {"curve": self.order.pop()}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pass


@dataclass
class Run:
    """One simulated campaign. end_*: (T,) per trial end, in time order: time_s, epochs (spent by
    then, all trials), curve, complete. hv: (C,) the completed front's hypervolume after each complete
    trial, at hv_time_s / hv_epochs (C = complete trials)."""

    setting: Setting
    seed: int
    trials: int
    complete: int
    stopped: int
    truncated: int
    epochs: int
    time_s: float
    end_time_s: np.ndarray
    end_epochs: np.ndarray
    end_curve: np.ndarray
    end_complete: np.ndarray
    hv: np.ndarray
    hv_time_s: np.ndarray
    hv_epochs: np.ndarray
    scheduler: object = field(default=None, repr=False, compare=False)  # as the run left it

    @property
    def label(self) -> str:
        return self.setting.label

    @property
    def final_hv(self) -> float:
        return float(self.hv[-1]) if self.hv.size else 0.0

    def hv_at_epochs(self, budget: float) -> float:
        """Hypervolume of the trials completed by the time ``budget`` epochs were spent."""
        i = np.searchsorted(self.hv_epochs, budget, side="right")
        return float(self.hv[i - 1]) if i else 0.0

    def hv_at_time(self, seconds: float) -> float:
        i = np.searchsorted(self.hv_time_s, seconds, side="right")
        return float(self.hv[i - 1]) if i else 0.0

    def epochs_to(self, hv: float) -> float:
        """Epochs spent when the hypervolume first reached ``hv`` (inf if never)."""
        i = np.flatnonzero(self.hv >= hv)
        return float(self.hv_epochs[i[0]]) if i.size else math.inf

    def completed_curves(self) -> np.ndarray:
        return self.end_curve[self.end_complete]


def simulate(curves: Curves, setting: Setting, *, concurrency: int = DEFAULT_CONCURRENCY,
             startup_s: float | None = None, seed: int = 0, num_trials: int | None = None) -> Run:
    """Replay one scheduler setting on the curves (see the module doc)."""
    from ray.tune.schedulers import TrialScheduler

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BadInput(f"concurrency: expected an int >= 1, given {concurrency!r}")
    startup = curves.startup_s if startup_s is None else float(startup_s)
    if not (math.isfinite(startup) and startup >= 0):
        raise BadInput(f"startup_s: expected a number >= 0, given {startup_s!r}")
    scheduler = build_scheduler(setting, curves)
    searcher = ShuffledCurves(len(curves), seed, num_trials)
    max_t = curves.max_t
    stop = TrialScheduler.STOP

    events: list[tuple[float, int, int, int]] = []  # (time, seq, trial number, epoch reached)
    trials: list[SimTrial] = []
    curve_of: list[int] = []
    ends: list[tuple[float, int, int, bool]] = []  # (time, epochs spent, curve, complete)
    seq = 0
    spent = 0
    stopped = truncated = 0
    finished = False

    def start(now: float) -> None:
        nonlocal seq, finished
        if finished:
            return
        k = len(trials)
        trial_id = f"sim_{k:05d}"
        suggestion = searcher.suggest(trial_id)
        if suggestion is None:
            finished = True
            return
        c = suggestion["curve"]
        trial = SimTrial(trial_id, suggestion)
        trials.append(trial)
        curve_of.append(c)
        scheduler.on_trial_add(None, trial)
        if not curves.results[c]:  # nothing recorded: it ends at once
            ends.append((now + startup, spent, c, False))
            searcher.on_trial_complete(trial_id, None)
            start(now + startup)
            return
        heapq.heappush(events, (now + startup + float(curves.epoch_s[c][0]), seq, k, 1))
        seq += 1

    saved = np.random.get_state()  # Ray's ASHA draws brackets from numpy's global generator
    np.random.seed(seed)
    try:
        for _ in range(concurrency):
            start(0.0)
        while events:
            now, _, k, epoch = heapq.heappop(events)
            trial, c = trials[k], curve_of[k]
            spent += 1
            result = dict(curves.results[c][epoch - 1])
            decision = scheduler.on_trial_result(None, trial, result)
            last = epoch >= len(curves.results[c]) or epoch >= max_t
            if decision != stop and not last:
                searcher.on_trial_result(trial.trial_id, result)
                heapq.heappush(events, (now + float(curves.epoch_s[c][epoch]), seq, k, epoch + 1))
                seq += 1
                continue
            complete = epoch >= max_t
            if not complete:
                if decision == stop:
                    stopped += 1
                else:
                    truncated += 1
            scheduler.on_trial_complete(None, trial, result)
            searcher.on_trial_complete(trial.trial_id, result)
            ends.append((now, spent, c, complete))
            start(now)
    finally:
        np.random.set_state(saved)

    end = np.array(ends, dtype=[("t", "f8"), ("e", "i8"), ("c", "i8"), ("done", "?")]) if ends else None
    if end is None:
        end = np.zeros(0, dtype=[("t", "f8"), ("e", "i8"), ("c", "i8"), ("done", "?")])
    order = np.argsort(end["t"], kind="stable")  # trials without epochs may end out of order
    end = end[order]
    done = end["done"]
    hv = (hypervolume_trace(curves.finals, curves.directions, curves.reference, order=end["c"][done])
          if done.any() else np.zeros(0))
    return Run(setting, seed, len(trials), int(done.sum()), stopped, truncated, spent,
               float(end["t"].max()) if end.size else 0.0, end["t"], end["e"], end["c"], done,
               hv, end["t"][done], end["e"][done], scheduler)


def compare(curves: Curves, settings: Sequence[Setting], *, concurrency: int | None = None,
            startup_s: float | None = None, seed: int = 0, num_trials: int | None = None) -> list[Run]:
    """``simulate`` for each setting on the same curves, searcher order and seed."""
    conc = concurrency or curves.concurrency or DEFAULT_CONCURRENCY
    return [simulate(curves, s, concurrency=conc, startup_s=startup_s, seed=seed, num_trials=num_trials)
            for s in settings]


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """``"top1:max,params_m:min"`` -> [("top1", "max"), ("params_m", "min")]."""
    out = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        metric, sep, mode = part.partition(":")
        if not sep or not metric or mode not in ("min", "max"):
            raise BadInput(f"objectives: expected METRIC:min or METRIC:max, comma-separated, given {text!r}")
        out.append((metric, mode))
    if not out:
        raise BadInput(f"objectives: expected METRIC:min or METRIC:max, comma-separated, given {text!r}")
    return out


def parse_settings(texts: Sequence[str] | None, curves: Curves) -> list[Setting]:
    """Setting strings (``Setting.parse``; grace and rf default to the campaign's, else 1 and 3), or
    ``default_settings`` when none are given."""
    if not texts:
        return default_settings(curves)
    sched = curves.scheduler
    grace = sched.get("grace_epochs") if isinstance(sched.get("grace_epochs"), int) else 1
    rf = sched.get("reduction_factor") if isinstance(sched.get("reduction_factor"), int) else 3
    return [Setting.parse(t, min(grace, curves.max_t), rf) for t in texts]


def default_out_dir(source) -> str:
    """Where ``qkvsearch simulate`` writes by default: <campaign>/simulate, or <folder>/<stem>-simulate
    next to a table."""
    text = os.fspath(source).rstrip("/")
    if text.lower().endswith((".parquet", ".csv")):
        stem, _ = os.path.splitext(text)
        return f"{stem}-simulate"
    from qkvsearch.search.results import resolve_out_dir

    return resolve_out_dir(text, None, "simulate")


# ---------------------------------------------------------------------------------------- output
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


def format_table(curves: Curves, runs: Sequence[Run]) -> str:
    """One line per run: trials, complete, epochs and simulated time spent, and the completed
    front's hypervolume as a fraction of the full grid's at 10/25/50/100% of the grid's epochs."""
    head = ["scheduler", "trials", "complete", "stopped", "epochs", "sim h"]
    head += [f"HV@{int(f * 100)}%" for f in FRACTIONS] + ["HV end", "epochs to 0.95"]
    rows = []
    for r in runs:
        frac = [r.hv_at_epochs(f * curves.grid_epochs) / curves.grid_hv for f in FRACTIONS]
        to95 = r.epochs_to(0.95 * curves.grid_hv)
        rows.append([r.label, str(r.trials), str(r.complete), str(r.stopped), str(r.epochs),
                     f"{r.time_s / 3600:.3g}"] + [f"{x:.3f}" for x in frac]
                    + [f"{r.final_hv / curves.grid_hv:.3f}",
                       "never" if math.isinf(to95) else f"{to95:.0f} ({to95 / curves.grid_epochs:.0%})"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    for row in rows:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _figure(curves: Curves, runs: Sequence[Run]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True,
                        subplot_titles=("against simulated time", "against epochs spent"))
    for i, r in enumerate(runs):
        color = _COLORS[i % len(_COLORS)]
        frac = np.concatenate([[0.0], r.hv / curves.grid_hv])
        hours = np.concatenate([[0.0], r.hv_time_s / 3600, [r.time_s / 3600]])
        epochs = np.concatenate([[0], r.hv_epochs, [r.epochs]])
        y = np.concatenate([frac, frac[-1:]])
        for col, x in ((1, hours), (2, epochs)):
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=r.label, legendgroup=r.label,
                                     showlegend=col == 1, line={"color": color}), row=1, col=col)
    fig.update_xaxes(title_text="simulated time (h)", row=1, col=1)
    fig.update_xaxes(title_text=f"epochs spent (full grid: {curves.grid_epochs})", row=1, col=2)
    fig.update_yaxes(title_text="hypervolume / full grid's", row=1, col=1)
    fig.update_layout(title=f"Completed front's hypervolume, {len(curves)} recorded curves, "
                            f"{', '.join(f'{d} {m}' for m, d in curves.objectives)}",
                      template="plotly_white", height=480)
    return fig


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def write_outputs(curves: Curves, runs: Sequence[Run], out_dir) -> dict[str, str]:
    """simulate.html (the figure, self-contained) and simulate.csv (one row per complete trial of each
    run: scheduler, seed, time_s, epochs, hypervolume, fraction of the grid's) into out_dir."""
    from qkvsearch.search.storage import write_bytes

    out = os.fspath(out_dir).rstrip("/")
    fig = _figure(curves, runs)
    lines = ["scheduler,seed,time_s,epochs,hypervolume,hv_fraction"]
    for r in runs:
        for t, e, h in zip(r.hv_time_s.tolist(), r.hv_epochs.tolist(), r.hv.tolist()):
            lines.append(f"{r.label},{r.seed},{t:.6g},{e},{h:.8g},{h / curves.grid_hv:.6f}")
    written = {"html": f"{out}/simulate.html", "csv": f"{out}/simulate.csv"}
    write_bytes(written["html"], fig.to_html(include_plotlyjs=True, full_html=True).encode("utf-8"))
    write_bytes(written["csv"], ("\n".join(lines) + "\n").encode("utf-8"))
    return written
