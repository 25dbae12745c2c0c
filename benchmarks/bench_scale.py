"""Driver scale: what one campaign's driver keeps per trial, in memory and on disk, over N trivial trials.

Runs ``qkvsearch launch`` on a campaign of N trivial trials (xcit_nano_12_p8_224 cut to one block at 16 px,
digits, 1 epoch of 1 step, 1 worker, 2 trials at a time, random search over a learning-rate range so that
every trial is a distinct configuration, FIFO, ``checkpoints: {keep: none}``) in a subprocess with a local
Ray of its own (its own RAY_TMPDIR), and samples every half second the driver's RSS and the RSS of that
Ray's GCS (``gcs_server``, found by the temp folder in its command line). Reports, as a Markdown table:

- driver and GCS memory when 10 % and 100 % of the trials had ended, and the growth per trial between;
- bytes on disk per trial besides kept weights (``train_runs/``, ``qs_weights/``), and which files;
- Tune's experiment-state saves: how many, the size of the last one, and the bytes they wrote (the files
  Tune writes at each save, and the staging folder Tune copies to the campaign folder after each);
- seconds per trial over the first and the last fifth of the trials (a cost growing with N shows there).

``--compare`` runs the campaign twice in one run, with Tune's defaults (``QKVSEARCH_TUNE_DEFAULTS=1``,
read by search.campaign.tune_settings) and with the campaign's Tune settings, and prints the ratios.
``--trace`` starts tracemalloc in the driver when 10 % of the trials have ended and prints, when all have,
the allocations still alive by traceback (what the driver keeps per trial), with the object counts by type
that grew; tracemalloc's own memory inflates the RSS of a traced run. ``--tree DIR`` runs the driver from
another checkout of the repository (a package shim for DIR goes first on the driver's PYTHONPATH, which Ray's
processes inherit); ``--against DIR`` runs the campaign with the driver from DIR and from this tree, one after
the other in one run, and prints the ratios. ``--plain`` runs the same shape of campaign in Ray Tune alone,
without qkvsearch (a function trainable reporting one result of ``--plain-keys`` numeric keys, the same forced
saves): Tune's own share, with its loggers on and off under ``--compare``. Whatever happens (success, failure,
Ctrl-C, SIGTERM), the driver and every process of its Ray are stopped before this script exits.

    python benchmarks/bench_scale.py [--trials 300] [--concurrency 2] [--compare] [--trace] [--tree DIR]
                                     [--against DIR]
                                     [--keep DIR] [--label TEXT] [--plain [--plain-keys 26]]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
from make_earlier_campaigns import package_shim  # noqa: E402  (a checkout as the installed package)

REPO = Path(__file__).resolve().parent.parent
FINAL = {"completed", "stopped_early", "diverged", "failed", "infeasible", "duplicate", "interrupted"}
SAMPLE_S = 0.5
STOP_GRACE_S = 60  # a stopped driver saves Tune's state and stops its Ray: on 2 busy cores, tens of seconds
WEIGHTS_DIRS = ("train_runs", "qs_weights")
MARK_10, MARK_100 = signal.SIGRTMIN + 1, signal.SIGRTMIN + 2  # to the driver's probe (PROBE)

# Runs in the driver process before the command line: counts Tune's experiment-state saves (wrapping
# TuneController.save_to_dir, Ray 2.60; without it the counts stay empty) and answers the benchmark's
# signals (real-time ones: Tune takes SIGUSR1 as a stop): MARK_10 at 10 % of the trials (modules and object
# counts; tracemalloc starts), MARK_100 at 100 % (object counts; the tracemalloc snapshot). Imports Ray the way
# `launch` does (local_ray first).
PROBE = r'''
import gc, json, os, signal, sys, runpy
out = os.environ["QKVSEARCH_BENCH_OUT"]
trace = os.environ.get("QKVSEARCH_BENCH_TRACE") == "1"
saves = {"count": 0, "state_bytes": 0, "staged_bytes": 0, "last_state_bytes": 0, "last_experiment_state": 0}

def _dump(name, data):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        json.dump(data, f)
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))

def _types():
    counts = {}
    for o in gc.get_objects():
        t = type(o)
        key = str(t.__dict__.get("__module__", "?")) + "." + str(getattr(t, "__qualname__", t.__name__))
        counts[key] = counts.get(key, 0) + 1
    return counts

def _mark(signum, frame):
    try:  # an exception here would surface inside whatever the driver was doing
        _marked(signum)
    except BaseException as err:
        _dump("error.json", {"error": repr(err)})

def _marked(signum):
    import tracemalloc
    tag = "10" if signum == signal.SIGRTMIN + 1 else "100"
    data = {"types": _types(), "modules": sorted(sys.modules)}
    if trace and tag == "10":
        tracemalloc.start(30)
    if trace and tag == "100" and tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(os.path.join(out, "trace.snapshot"))
        tracemalloc.stop()
    _dump("mark" + tag + ".json", data)

signal.signal(signal.SIGRTMIN + 1, _mark)
signal.signal(signal.SIGRTMIN + 2, _mark)

plain = os.environ.get("QKVSEARCH_BENCH_PLAIN")
if not plain:
    import qkvsearch.search.cluster.local_ray  # noqa: F401  (sets Ray's environment before Ray is imported)
try:
    from ray.tune.execution.tune_controller import TuneController
except ImportError:
    TuneController = None

if TuneController is not None and hasattr(TuneController, "save_to_dir"):
    _save = TuneController.save_to_dir

    def save_to_dir(self):
        _save(self)
        staging = self._storage.experiment_driver_staging_path
        top = [e for e in os.scandir(staging) if e.is_file()]
        state = sum(e.stat().st_size for e in top)
        tree = 0
        for root, _, files in os.walk(staging):
            tree += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        saves["count"] += 1
        saves["state_bytes"] += state
        saves["staged_bytes"] += tree
        saves["last_state_bytes"] = state
        saves["last_experiment_state"] = sum(e.stat().st_size for e in top if e.name.startswith("experiment_state"))
        _dump("saves.json", saves)

    TuneController.save_to_dir = save_to_dir

if plain:
    sys.argv = [plain, *sys.argv[1:]]
    runpy.run_path(plain, run_name="__main__")
else:
    sys.argv = ["qkvsearch", *sys.argv[1:]]
    runpy.run_module("qkvsearch.search.cli", run_name="__main__", alter_sys=True)
'''

# --plain: the same shape of campaign in Ray Tune alone (no qkvsearch): a function trainable reporting one result
# of KEYS numeric keys, a config of 60 plain keys beside a sampled lr, 1 CPU a trial, reuse_actors, and (as
# qkvsearch's schedulers do, search.scheduling.forced_saves.CheckpointsTrialChanges) a save of the experiment
# state whenever trials were added or ended. Each ended trial leaves ended/<trial_id>.json for the benchmark.
PLAIN = r'''
import json, os, sys, time
import ray
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import FIFOScheduler

trials, concurrency, keys, save_each, storage, ended = sys.argv[1:7]
trials, concurrency, keys = int(trials), int(concurrency), int(keys)
os.makedirs(ended, exist_ok=True)


def trainable(config):
    tune.report({"epoch": 1.0, **{f"metric_{i}": config["lr"] * i for i in range(keys - 1)}})


class SaveOnTrialChanges(FIFOScheduler):
    changed = False

    def on_trial_add(self, controller, trial):
        self.changed = True
        super().on_trial_add(controller, trial)

    def on_trial_complete(self, controller, trial, result):
        self.changed = True
        super().on_trial_complete(controller, trial, result)

    def choose_trial_to_run(self, controller):
        if self.changed:
            getattr(controller, "_tune_controller", controller).checkpoint(force=True, wait=True)
            self.changed = False
        return super().choose_trial_to_run(controller)


class Ended(Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        trial.bench_started = time.time()

    def on_trial_complete(self, iteration, trials, trial, **info):
        with open(os.path.join(ended, trial.trial_id + ".json"), "w") as f:
            json.dump({"status": "completed", "started_at": getattr(trial, "bench_started", None),
                       "ended_at": time.time()}, f)


ray.init(num_cpus=concurrency, include_dashboard=False, log_to_driver=False)
space = {"lr": tune.loguniform(1e-4, 1e-2), **{f"key_{i}": i for i in range(60)}}
tuner = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 1}), param_space=space,
    tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=concurrency, reuse_actors=True,
                                scheduler=SaveOnTrialChanges() if save_each == "1" else None),
    run_config=tune.RunConfig(name="plain", storage_path=storage, verbose=0, callbacks=[Ended()]))
tuner.fit()
ray.shutdown()
'''


def campaign_spec(storage: Path, trials: int, concurrency: int) -> dict:
    return {
        "name": "scale",
        "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 32, "lr": 2e-3, "warmup_epochs": 0, "max_steps_per_epoch": 1,
                  "seed": 0},
        # one block, and an lr range: every trial is a distinct configuration (a repeat would not train)
        "space": {"depth": {"choice": [1]}, "lr": {"float": [1e-4, 1e-2], "log": True}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "random", "num_trials": trials, "seed": 0},
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": concurrency},
        "checkpoints": {"keep": "none"},
        "storage": str(storage),
    }


# ------------------------------------------------------------------------------------------- processes
def rss_kb(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def gcs_pid(ray_tmp: str) -> int | None:
    """The gcs_server of the Ray whose temp folder is ray_tmp (its --log_dir lies there)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            args = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"gcs_server") and any(ray_tmp.encode() in a for a in args):
            return int(entry.name)
    return None


def ray_pids(ray_tmp: str) -> list[int]:
    """Processes of the Ray whose temp folder is ray_tmp, found by that folder in their command line,
    environment or open files (Ray's agents rename themselves but keep their session's logs open)."""
    found, key = [], ray_tmp.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if key in Path(entry.path, "cmdline").read_bytes() or key in Path(entry.path, "environ").read_bytes():
                found.append(int(entry.name))
                continue
            for fd in os.scandir(Path(entry.path, "fd")):
                try:
                    if os.readlink(fd.path).startswith(ray_tmp):
                        found.append(int(entry.name))
                        break
                except OSError:
                    continue
        except OSError:  # gone, or not ours to read
            continue
    return found


def stop_everything(proc: subprocess.Popen | None, ray_tmp: str) -> None:
    """The driver (SIGTERM: it stops its trials and its Ray; SIGKILL after STOP_GRACE_S), then whatever of its
    Ray is left (SIGKILL after 30 s). A further Ctrl-C or SIGTERM meanwhile does not cut it short."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _stop(proc, ray_tmp)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _stop(proc: subprocess.Popen | None, ray_tmp: str) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while ray_pids(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in ray_pids(ray_tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 30
    while ray_pids(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = ray_pids(ray_tmp)
    if left:
        print(f"warning: Ray processes of {ray_tmp} still running: {left}", file=sys.stderr)


# ------------------------------------------------------------------------------------------- one campaign
class Ended:
    """Counts the campaign's ended trials from its records (a folder of <trial_id>.json), reading only records
    not yet seen ended."""

    def __init__(self, trials: Path):
        self.trials = trials
        self.ended: dict[str, dict] = {}

    def count(self) -> int:
        try:
            names = [e.name for e in os.scandir(self.trials) if e.name.endswith(".json")]
        except OSError:
            return 0
        for name in names:
            if name in self.ended:
                continue
            try:
                rec = json.loads((self.trials / name).read_text())
            except (OSError, ValueError):
                continue  # being written
            if rec.get("status") in FINAL and rec.get("ended_at"):
                self.ended[name] = {"started_at": rec.get("started_at"), "ended_at": rec["ended_at"]}
        return len(self.ended)


def run_campaign(label: str, args, work: Path, tune_defaults: bool, tree: str | None) -> dict:
    storage = work / "results"
    out = work / "probe"
    out.mkdir()
    if args.plain:
        exp, records = storage / "plain", out / "ended"
        script = work / "plain_tune.py"
        script.write_text(PLAIN)
        command = [str(args.trials), str(args.concurrency), str(args.plain_keys), "1", str(storage), str(records)]
    else:
        import yaml

        spec_file = work / "scale.yaml"
        spec_file.write_text(yaml.safe_dump(campaign_spec(storage, args.trials, args.concurrency), sort_keys=False))
        exp, records = storage / "scale", storage / "scale" / "qs_trials"
        command = ["launch", str(spec_file)]
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths stay under 108 characters
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1", "QKVSEARCH_BENCH_OUT": str(out),
           "QKVSEARCH_BENCH_TRACE": "1" if args.trace else "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("QKVSEARCH_TUNE_DEFAULTS", None)
    if tune_defaults:
        env["QKVSEARCH_TUNE_DEFAULTS"] = "1"
    if args.plain:  # Tune alone: the loggers switched off directly (search.campaign.tune_settings does it otherwise)
        env["QKVSEARCH_BENCH_PLAIN"] = str(script)
        env.pop("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", None)
        if not tune_defaults:
            env["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    if tree:
        shim = package_shim(Path(tree).resolve(), work / "shim")
        env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    log = open(work / "driver.log", "wb")
    proc = None
    samples: list[tuple[float, int, int | None, int | None]] = []  # (t, ended, driver KB, GCS KB)
    marks: dict[str, tuple] = {}
    ended = Ended(records)
    t0 = time.monotonic()
    print(f"{label}: {args.trials} trials, driver log {work / 'driver.log'}, RAY_TMPDIR {ray_tmp}", flush=True)
    try:
        proc = subprocess.Popen([sys.executable, "-c", PROBE, *command], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
        gcs = None
        tenth = max(1, args.trials // 10)
        while proc.poll() is None:
            gcs = gcs or gcs_pid(ray_tmp)
            n = ended.count()
            sample = (time.monotonic() - t0, n, rss_kb(proc.pid), rss_kb(gcs))
            samples.append(sample)
            for tag, at, sig in (("10", tenth, MARK_10), ("100", args.trials, MARK_100)):
                if tag not in marks and n >= at:
                    marks[tag] = sample
                    proc.send_signal(sig)
            time.sleep(SAMPLE_S)
        wall = time.monotonic() - t0
        ended.count()
        if proc.returncode != 0:
            tail = (work / "driver.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"{label}: the campaign's driver exited {proc.returncode}:\n{tail}")
    finally:
        stop_everything(proc, ray_tmp)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return {"label": label, "wall": wall, "samples": samples, "marks": marks, "disk": disk_use(exp),
            "saves": _read_json(out / "saves.json"), "mark10": _read_json(out / "mark10.json"),
            "mark100": _read_json(out / "mark100.json"), "ended": ended.ended, "exp": exp,
            "trace": out / "trace.snapshot"}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def disk_use(exp: Path) -> dict[str, int]:
    """Bytes under the campaign folder by kind of file."""
    kinds: dict[str, int] = {}
    for root, _, files in os.walk(exp):
        rel = Path(root).relative_to(exp)
        for name in files:
            size = os.path.getsize(os.path.join(root, name))
            top = rel.parts[0] if rel.parts else ""
            if top in WEIGHTS_DIRS or top == "qs_trials":
                kind = f"{top}/"
            elif not top:
                run_state = name.startswith(("experiment_state", "searcher-state", "search_gen_state"))
                kind = name.split("-")[0] if run_state else name
            elif name.startswith("events.out.tfevents"):
                kind = "trial/events.out.tfevents.*"
            else:
                kind = f"trial/{name}"
            kinds[kind] = kinds.get(kind, 0) + size
    return kinds


# ------------------------------------------------------------------------------------------- report
def figures(run: dict, trials: int) -> dict:
    m10, m100 = run["marks"].get("10"), run["marks"].get("100")
    span = (m100[1] - m10[1]) if m10 and m100 else 0

    def per(i: int) -> float | None:  # growth per trial of sample column i (driver, GCS), KB
        return (m100[i] - m10[i]) / span if span and m100[i] is not None and m10[i] is not None else None

    def fit(i: int) -> float | None:  # least-squares slope of sample column i over the ended count, 10 % to 100 %
        pts = [(smp[1], smp[i]) for smp in run["samples"]
               if m10 and m100 and m10[1] <= smp[1] <= m100[1] and smp[i] is not None]
        if len(pts) < 3 or pts[-1][0] == pts[0][0]:
            return None
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)

    disk = run["disk"]
    besides = sum(v for k, v in disk.items() if k.rstrip("/") not in WEIGHTS_DIRS)
    ends = sorted(e["ended_at"] for e in run["ended"].values())
    starts = [e["started_at"] for e in run["ended"].values() if e.get("started_at")]
    fifth = max(1, len(ends) // 5)
    first = (ends[fifth - 1] - min(starts)) / fifth if ends and starts else None
    last = (ends[-1] - ends[-fifth - 1]) / fifth if len(ends) > fifth else None
    saves = run["saves"]
    return {
        "driver_10": m10[2] if m10 else None, "driver_100": m100[2] if m100 else None, "driver_per": per(2),
        "driver_fit": fit(2), "gcs_10": m10[3] if m10 else None, "gcs_100": m100[3] if m100 else None,
        "gcs_per": per(3), "gcs_fit": fit(3),
        "disk_per": besides / max(1, trials), "disk": disk, "saves": saves.get("count"),
        "state_last": saves.get("last_experiment_state"), "state_written": saves.get("state_bytes"),
        "staged_written": saves.get("staged_bytes"), "first_fifth": first, "last_fifth": last,
        "wall": run["wall"], "ended": len(ends),
    }


def _mb(kb):
    return "-" if kb is None else f"{kb / 1024:,.0f} MB"


def _kb(v, unit=1):
    return "-" if v is None else f"{v / unit:,.1f} KB"


def _bytes(v):
    return "-" if v is None else f"{v / 1e6:,.1f} MB"


def _s(v):
    return "-" if v is None else f"{v:.2f} s"


ROWS = [
    ("driver RSS at 10 % of trials", "driver_10", _mb),
    ("driver RSS at 100 %", "driver_100", _mb),
    ("driver growth per trial (10 % to 100 %)", "driver_per", _kb),
    ("driver growth per trial (slope of every sample)", "driver_fit", _kb),
    ("GCS RSS at 10 %", "gcs_10", _mb),
    ("GCS RSS at 100 %", "gcs_100", _mb),
    ("GCS growth per trial (10 % to 100 %)", "gcs_per", _kb),
    ("GCS growth per trial (slope of every sample)", "gcs_fit", _kb),
    ("on disk per trial besides weights", "disk_per", lambda v: _kb(v, 1024)),
    ("experiment-state saves", "saves", lambda v: "-" if v is None else f"{v:,}"),
    ("last experiment_state-*.json", "state_last", _bytes),
    ("written by the saves (Tune's state files)", "state_written", _bytes),
    ("copied by the saves (staging folder synced)", "staged_written", _bytes),
    ("seconds per trial, first fifth", "first_fifth", _s),
    ("seconds per trial, last fifth", "last_fifth", _s),
    ("campaign wall time (driver process)", "wall", _s),
]


def print_table(runs: list[dict], trials: int) -> None:
    figs = [figures(r, trials) for r in runs]
    head = ["measure", *[r["label"] for r in runs]] + (["ratio"] if len(runs) == 2 else [])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for name, key, fmt in ROWS:
        cells = [fmt(f[key]) for f in figs]
        if len(runs) == 2:
            a, b = figs[0][key], figs[1][key]
            cells.append(f"{b / a:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    kinds = sorted({k for f in figs for k in f["disk"]}, key=lambda k: -max(f["disk"].get(k, 0) for f in figs))
    print("| files (bytes per trial) | " + " | ".join(r["label"] for r in runs) + " |")
    print("|---|" + "|".join("---" for _ in runs) + "|")
    for kind in kinds:
        print(f"| {kind} | " + " | ".join(f"{f['disk'].get(kind, 0) / trials:,.0f}" for f in figs) + " |")


HEAVY = ("torch", "timm", "pandas", "sklearn", "scipy", "matplotlib", "plotly", "mlflow", "wandb", "tensorboardX",
         "optuna", "pyarrow", "numpy")


def print_driver_details(run: dict, top: int) -> None:
    mods = run["mark10"].get("modules") or []
    tops = {m.split(".")[0] for m in mods}
    print(f"\n{run['label']}: the driver had imported {len(mods)} modules at 10 %; heavy packages among them: "
          f"{', '.join(h for h in HEAVY if h in tops) or 'none'}")
    t10, t100 = run["mark10"].get("types") or {}, run["mark100"].get("types") or {}
    grew = sorted(((t100.get(k, 0) - t10.get(k, 0), k) for k in t100), reverse=True)[:top]
    if grew:
        print(f"objects by type that grew between 10 % and 100 % ({run['label']}):")
        for n, k in grew:
            if n > 0:
                print(f"  {n:+8d}  {k}")


def print_trace(run: dict, top: int) -> None:
    import tracemalloc

    path = run["trace"]
    if not path.exists():
        print(f"\n{run['label']}: no tracemalloc snapshot (the driver ended before it answered)")
        return
    snap = tracemalloc.Snapshot.load(str(path)).filter_traces([
        tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")])
    stats = snap.statistics("traceback")
    total = sum(s.size for s in stats)
    print(f"\n{run['label']}: {total / 1e6:.1f} MB allocated after 10 % of the trials and still alive at 100 % "
          f"(tracemalloc, Python allocations only); top {top} by traceback:")
    for s in stats[:top]:
        frames = [f for f in s.traceback if "site-packages" in f.filename or "qkvsearch" in f.filename
                  or "/search/" in f.filename or "/trainers/" in f.filename] or list(s.traceback)
        where = " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in reversed(frames[-6:]))
        print(f"  {s.size / 1024:9.1f} KB in {s.count:7d} blocks  {where}")
    by_file = snap.statistics("filename")
    print("  by file (innermost frame):")
    for s in by_file[:top]:
        print(f"  {s.size / 1024:9.1f} KB  {_short(s.traceback[0].filename)}")


def _short(path: str) -> str:
    for cut in ("site-packages/", "/search/", "/trainers/", "/spaces/"):
        if cut in path:
            return (cut.strip("/") + "/" if cut != "site-packages/" else "") + path.split(cut, 1)[1]
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=2, help="trials at a time (max_concurrent_trials)")
    ap.add_argument("--compare", action="store_true", help="Tune's defaults and the campaign's Tune settings, "
                    "side by side")
    ap.add_argument("--tune-defaults", action="store_true", help="one campaign, with Tune's defaults "
                    "(QKVSEARCH_TUNE_DEFAULTS=1)")
    ap.add_argument("--trace", action="store_true", help="tracemalloc in the driver from 10 %% to 100 %% of the trials")
    ap.add_argument("--top", type=int, default=25, help="lines of the trace and of the object counts")
    ap.add_argument("--tree", help="run the driver from this checkout of the repository")
    ap.add_argument("--against", metavar="DIR", help="the campaign settings with the driver from DIR (another "
                    "checkout, e.g. a `git worktree` of an earlier commit) and from this tree, side by side")
    ap.add_argument("--keep", help="copy each campaign folder (less train_runs/) and driver log under this folder")
    ap.add_argument("--label", help="the column's name of a single campaign (default: what it runs)")
    ap.add_argument("--plain", action="store_true", help="Ray Tune alone, no qkvsearch (a reproduction of Tune's "
                    "share): the same number of trials, each reporting --plain-keys numeric keys once")
    ap.add_argument("--plain-keys", type=int, default=26, help="numeric keys a --plain trial reports (a qkvsearch "
                    "trial's result has 26)")
    args = ap.parse_args()
    if args.trials < 10:
        ap.error("--trials: at least 10 (memory is read at 10 % and 100 % of the trials)")

    def interrupted(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)

    ours = "Tune loggers off" if args.plain else "campaign settings"
    if args.against:
        plan = [(f"{_commit(args.against)} (--against)", False, args.against),
                (f"{_commit(REPO)} (this tree)", False, None)]
    elif args.compare:
        plan = [("Tune defaults", True, args.tree), (ours, False, args.tree)]
    else:
        plan = [(args.label or ("Tune defaults" if args.tune_defaults else ours), args.tune_defaults, args.tree)]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    what = f"Ray Tune alone (--plain, {args.plain_keys} numeric keys a result)" if args.plain else \
        f"trees: {args.against} against {REPO}" if args.against else f"tree: {args.tree or REPO}"
    try:
        runs = run_all(args, plan)
    except KeyboardInterrupt:
        print("interrupted: the driver and every process of its Ray were stopped", file=sys.stderr)
        raise SystemExit(130) from None
    print(f"\n{args.trials} trivial trials, {args.concurrency} at a time, on {os.cpu_count()} CPUs "
          f"(load average at start {load}); {what}\n")
    print_table(runs, args.trials)


def _commit(tree) -> str:
    """The tree's commit, and `+` where its files differ from it."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return (head or str(tree)) + ("+" if dirty else "")


def run_all(args, plan: list[tuple[str, bool, str | None]]) -> list[dict]:
    runs = []
    for label, defaults, tree in plan:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            run = run_campaign(label, args, Path(tmp), defaults, tree)
            if args.keep:
                dest = Path(args.keep) / label.replace(" ", "-")
                shutil.copytree(run["exp"], dest / "campaign", ignore=shutil.ignore_patterns(*WEIGHTS_DIRS))
                shutil.copy(Path(tmp) / "driver.log", dest / "driver.log")
                shutil.copytree(Path(tmp) / "probe", dest / "probe")
            print_driver_details(run, args.top)
            if args.trace:
                print_trace(run, args.top)
            runs.append(run)
    return runs


if __name__ == "__main__":
    main()
