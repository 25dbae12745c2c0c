"""Hostile campaign settings (the spec's fields, campaign folders, tables and streams the commands read or
write): each is refused with exit 2 and a message naming the field or file, what was expected and what was
given, never a traceback, and nothing already written is lost. The file beside this one covers hostile spec
files themselves."""
from __future__ import annotations

import errno
import io
import json
import os
import sys

import pytest
import yaml
from helpers.campaign_files import tree_digest, write_campaign
from helpers.images import write_imagefolder

from qkvsearch.search.cli import main
from qkvsearch.search.searchers.state import VERSION as STATE_VERSION
from qkvsearch.spaces import BadInput, SpecError, load_campaign

LIMIT = 2000   # characters a refusal may print
BASE = {"name": "t", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "digits"},
        "train": {"epochs": 2, "batch_size": 8}, "space": {"embedding": ["linear", "sne"]},
        "search": {"algorithm": "random", "num_trials": 2}}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working folder, so that anything written relative to it shows."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _spec_file(folder, **sections) -> str:
    spec = {**BASE, "storage": str(folder / "results"), **sections}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err, err
    assert len(err) + len(out) < LIMIT, f"{len(err)} characters: {err[:300]}"


def _errors(**sections) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_campaign({**BASE, **sections})
    return info.value.errors


# ------------------------------------------------------------------ search.warm_start


@pytest.fixture
def no_ray(monkeypatch):
    """A refused launch starts no Ray."""
    import qkvsearch.search.campaign.launch as campaign

    def refuse(*_args, **_kwargs):
        raise AssertionError("Ray must not start for a refused launch")

    monkeypatch.setattr(campaign, "connect", refuse)


def test_a_warm_start_from_the_campaign_being_overwritten_is_refused_and_the_campaign_kept(workdir, capsys, no_ray):
    exp = workdir / "results" / "t"
    write_campaign(exp, ["completed", "failed", "completed"], name="t")
    before = tree_digest(exp)
    spec = _spec_file(workdir, search={**BASE["search"], "warm_start": str(exp) + "/"})
    code, out, err = _run(capsys, "validate", spec)
    _refused(code, out, err, "search.warm_start: expected an earlier campaign's folder", "own folder")
    code, out, err = _run(capsys, "launch", spec, "--overwrite")
    _refused(code, out, err, "search.warm_start", str(exp))
    assert tree_digest(exp) == before


@pytest.mark.parametrize("source,fragment", [
    ("missing", "does not exist"),
    ("plain-file", "which is a file"),
    ("empty-folder", "has no qs_campaign.json"),
    ("damaged", "qs_campaign.json: expected"),
])
def test_validate_refuses_a_warm_start_that_is_no_campaign(workdir, capsys, source, fragment):
    (workdir / "plain-file").write_text("x")
    (workdir / "empty-folder").mkdir()
    (workdir / "damaged").mkdir()
    (workdir / "damaged" / "qs_campaign.json").write_text('{"name": "x", "spec": [1, 2')
    spec = _spec_file(workdir, search={**BASE["search"], "warm_start": str(workdir / source)})
    code, out, err = _run(capsys, "validate", spec)
    _refused(code, out, err, "search.warm_start: ", source, fragment)


# ------------------------------------------------------------------ where a campaign writes besides its folder


def test_validate_refuses_a_measurement_cache_it_cannot_create(workdir, capsys):
    (workdir / "file").write_text("x")
    for cache in (workdir / "file", workdir / "file" / "cache"):
        spec = _spec_file(workdir, measure={"cache": str(cache)})
        code, out, err = _run(capsys, "validate", spec)
        _refused(code, out, err, "measure.cache: expected a folder that exists or can be created", "is a file")
    spec = _spec_file(workdir, measure={"cache": str(workdir / "new" / "cache")})
    assert _run(capsys, "validate", spec)[0] == 0
    assert sorted(p.name for p in workdir.iterdir()) == ["file", "spec.yaml"]   # validate made nothing


@pytest.mark.parametrize("tracker,key,value,fragment", [
    ("optuna", "storage", "sqlite//x", "without the ':' after its scheme"),
    ("optuna", "storage", "http:/x", "a URL has '//' after 'http:'"),
    ("optuna", "storage", "redis://host/0", "whose scheme redis optuna does not take"),
    ("optuna", "storage", "file:///tmp/optuna.journal", "whose scheme file optuna does not take"),
    ("optuna", "storage", "sqlite://", "an in-memory database"),
    ("optuna", "storage", "postgresql://host:port/db", "cannot be parsed"),
    ("mlflow", "tracking_uri", "http//host:5000", "without the ':' after its scheme"),
    ("mlflow", "tracking_uri", "https://", "a URL without a host"),
    ("mlflow", "tracking_uri", "file:///tmp/mlruns", "whose scheme file mlflow does not take"),
    ("mlflow", "tracking_uri", "mysql://", "nothing after its scheme"),
])
def test_a_malformed_tracker_location_is_refused_naming_the_field(tmp_path, tracker, key, value, fragment):
    errors = _errors(storage=str(tmp_path), tracking={tracker: {key: value}})
    assert len(errors) == 1 and errors[0].startswith(f"tracking.{tracker}.{key}: expected "), errors
    assert fragment in errors[0], errors


@pytest.mark.parametrize("tracker,key,value", [
    ("optuna", "storage", "garbage"), ("optuna", "storage", "sqlite:///optuna.db"),
    ("optuna", "storage", "postgresql+psycopg2://user@host:5432/db"), ("mlflow", "tracking_uri", "store/mlflow.db"),
    ("mlflow", "tracking_uri", "http://127.0.0.1:5000"), ("mlflow", "tracking_uri", "databricks"),
])
def test_a_well_formed_tracker_location_is_taken(tmp_path, tracker, key, value):
    spec = load_campaign({**BASE, "storage": str(tmp_path), "tracking": {tracker: {key: value}}})
    assert spec.tracking[tracker][key] == value


def test_a_tracker_path_lies_in_the_campaign_folder_not_the_working_directory(workdir):
    from qkvsearch.search.campaign.tracking.mlflow_tracker import default_uri
    from qkvsearch.search.campaign.tracking.optuna_tracker import open_storage, storage_location

    exp = str(workdir / "results" / "t")
    assert storage_location({"storage": "garbage"}, exp) == f"{exp}/garbage"
    assert storage_location({"storage": "sqlite:///optuna.db"}, exp) == f"sqlite:///{exp}/optuna.db"
    assert storage_location({"storage": "/abs/optuna.journal"}, exp) == "/abs/optuna.journal"
    assert storage_location({"storage": None}, exp) == f"{exp}/tracking/optuna.journal"
    open_storage(storage_location({"storage": "garbage"}, exp))
    assert sorted(os.listdir(workdir)) == ["results"] and os.path.isfile(f"{exp}/garbage")
    from qkvsearch.spaces.tracking import tracker_location

    assert tracker_location("mlflow", "store/mlflow.db", exp) == f"sqlite:///{exp}/store/mlflow.db"
    assert tracker_location("mlflow", "http://host:5000", exp) == "http://host:5000"
    assert default_uri(exp) == f"sqlite:///{exp}/tracking/mlflow.db"


def test_a_tracker_file_inside_a_bucket_campaign_or_under_a_file_is_refused(tmp_path, capsys):
    errors = _errors(storage="s3://bucket/results", tracking={"optuna": {"storage": "optuna.journal"}})
    assert len(errors) == 1 and errors[0].startswith("tracking.optuna.storage: expected a server URL or an absolute "
                                                     "path when storage is a bucket"), errors
    (tmp_path / "file").write_text("x")
    spec = _spec_file(tmp_path, tracking={"optuna": {"storage": str(tmp_path / "file" / "optuna.journal")}})
    code, out, err = _run(capsys, "validate", spec)
    _refused(code, out, err, "tracking.optuna.storage: expected a folder that exists or can be created", "is a file")


# ------------------------------------------------------------------ bounds on values


@pytest.mark.parametrize("sections,expected", [
    ({"constraints": {"latency_ms": {"max": -1}}},
     "constraints.latency_ms.max: expected a number >= 0 (latency_ms cannot be negative), given -1"),
    ({"constraints": {"params_m": {"min": -0.5, "max": 3}}},
     "constraints.params_m.min: expected a number >= 0 (params_m cannot be negative), given -0.5"),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1}], "constraints": {"transfer_avg": {"min": 200}}}},
     "stages.constraints.transfer_avg.min: expected a number in [0, 100] (transfer_avg is a percentage), given 200"),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1}], "constraints": {"top1@digits": {"max": -3}}}},
     "stages.constraints.top1@digits.max: expected a number in [0, 100] (top1@digits is a percentage), given -3"),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1}],
                 "ood": {"in_distribution": "digits", "datasets": [{"format": "noise"}]},
                 "constraints": {"auroc": {"min": 200}}}},
     "stages.constraints.auroc.min: expected a number in [0, 100] (auroc is a percentage), given 200"),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1}], "objectives": ["fpr95"]}},
     'stages.objectives[0].metric: expected a metric of a stage the campaign has (top1@<dataset>, transfer_avg, '
     'or a pretraining metric), given "fpr95", which the ood stage measures: stages has no ood section'),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1}], "constraints": {"det_err": {"max": 5}}}},
     'stages.constraints.det_err: expected a metric of a stage the campaign has'),
    ({"search": {"algorithm": "gp", "num_trials": 8, "n_startup_trials": 20}},
     "search.n_startup_trials: expected fewer than the proposals search.num_trials / search.repeats (8), given 20: "
     "every trial would be a random start-up one and the Gaussian process would never lead"),
    ({"search": {"algorithm": "ehvi", "num_trials": 4, "n_startup_trials": 4},
      "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]},
     "search.n_startup_trials: expected fewer than the proposals search.num_trials / search.repeats (4), given 4"),
    ({"space": {"depth": {"int": [2, 100000]}}}, "space.depth.int[1]: expected a positive int up to 256, given 100000"),
    ({"space": {"embed_dim": [64, 10**6]}}, "space.embed_dim.choice[1]: expected a positive int up to 65536"),
    ({"space": {"num_heads": [10**6]}}, "space.num_heads.choice[0]: expected a positive int up to 65536"),
    ({"space": {"mlp_ratio": [1000.0]}}, "space.mlp_ratio.choice[0]: expected a number in (0, 64] or null"),
    ({"space": {"embedding": ["sne"], "hidden_width": [10**6]}},
     "space.hidden_width.choice[0]: expected a positive int width up to 65536"),
    ({"space": {"embedding": ["fsne"], "code_size": [10**6]}},
     "space.code_size.choice[0]: expected a positive int up to"),
    ({"model": {"name": "xcit_nano_12_p16_224", "img_size": 100000}},
     "model.img_size: expected an int >= 8 up to 8192"),
    ({"stages": {"finetune": [{"dataset": "digits", "epochs": 1, "img_size": 100000}]}},
     "stages.finetune[0].img_size: expected an int >= 8 up to 8192"),
])
def test_a_value_past_what_its_field_can_mean_is_refused(sections, expected):
    errors = _errors(**sections)
    assert any(e.startswith(expected) for e in errors), errors


def test_bounds_come_from_the_metric_declarations():
    from qkvsearch.spaces.metrics import BOUNDS, OOD_METRICS, bound_problem, metric_bounds

    assert all(BOUNDS[m] == (0.0, 100.0) for m in (*OOD_METRICS, "transfer_avg", "top1"))
    assert metric_bounds("top1@cars") == (0.0, 100.0) and metric_bounds("latency_ms") == (0.0, float("inf"))
    assert bound_problem("auroc", 100.0) is None and bound_problem("gmacs", 0.0) is None
    spec = load_campaign({**BASE, "constraints": {"latency_ms": {"max": 5}}})   # a sound bound is still taken
    assert spec.constraints[0].max == 5.0


def test_a_runaway_model_size_is_refused_before_it_is_built(workdir, capsys):
    import time

    from qkvsearch.search.campaign.costs import check_size, estimated_params
    from qkvsearch.trainers.model.cost import MAX_PARAMS

    assert estimated_params({"depth": 12, "embed_dim": 192}) == 12 * 192 * 192 * 12   # 12 L d^2 at mlp_ratio 4
    with pytest.raises(BadInput, match=r"^embed_dim: expected a model of at most 1e\+11 parameters with depth 256"):
        check_size({"depth": 256, "embed_dim": 65536})
    assert estimated_params({"depth": 64, "embed_dim": 16384}) > MAX_PARAMS > estimated_params({"embed_dim": 16384})
    spec = _spec_file(workdir, model={"name": "vit_tiny_patch16_224"},
                      space={"depth": {"int": [2, 64]}, "embed_dim": [192, 16384]})
    start = time.monotonic()
    code, out, err = _run(capsys, "validate", spec)
    _refused(code, out, err, "embed_dim: expected a model of at most 1e+11 parameters", "depth=64 embed_dim=16384")
    assert time.monotonic() - start < 60   # the space's other corners are built; this one is not


@pytest.mark.parametrize("space,fragment", [
    ({"mlp_ratio": [0.001]}, "mlp_ratio: expected a ratio giving at least one hidden unit at the token dim 128 "
                             "(at least 0.00781), given 0.001"),   # xcit_nano: timm's d, read off the model
    ({"embed_dim": [64], "mlp_ratio": {"float": [0.01, 4.0]}}, "at the token dim 64 (at least 0.0156), given 0.01"),
])
def test_an_mlp_of_no_hidden_unit_is_refused(workdir, capsys, space, fragment):
    code, out, err = _run(capsys, "validate", _spec_file(workdir, space=space))
    _refused(code, out, err, fragment)


def test_a_finetune_img_size_the_patches_do_not_tile_is_refused_by_validate_and_launch(workdir, capsys, no_ray):
    stages = {"finetune": [{"dataset": "digits", "epochs": 1, "img_size": 32},
                           {"dataset": "digits_0to8", "epochs": 1, "img_size": 30}]}
    spec = _spec_file(workdir, model={"name": "xcit_nano_12_p8_224", "img_size": 16}, stages=stages)
    for command in ("validate", "launch"):
        code, out, err = _run(capsys, command, spec)
        _refused(code, out, err, "stages.finetune[1].img_size: expected a multiple of xcit_nano_12_p8_224's patch "
                                 "size", "given 30")
        assert "finetune[0]" not in err
    assert not (workdir / "results").exists()


# ------------------------------------------------------------------ a stage's resources against the cluster


def _cluster(cpus=8.0, gpus=0.0, **kw):
    from qkvsearch.search.cluster.capacity import Cluster

    return Cluster(cpus, gpus, 4.0, None, False, **kw)


def _staged(**resources):
    ood = {"in_distribution": "digits", "datasets": [{"format": "noise"}], "resources": resources.pop("ood", {})}
    return load_campaign({**BASE, "stages": {"finetune": [{"dataset": "digits", "epochs": 1, "resources": resources}],
                                             "ood": ood}})


def test_a_stage_no_node_can_hold_is_refused_naming_its_field():
    from qkvsearch.search.campaign.preflight import ResourceError, check_stage_resources
    from qkvsearch.search.cluster.capacity import NodeType

    cluster = _cluster()
    with pytest.raises(ResourceError) as info:
        check_stage_resources(_staged(gpus_per_worker=1), cluster)
    text = str(info.value)
    assert text.startswith("stages.finetune[0].resources.gpus_per_worker: expected a phase the cluster can hold, "
                           "given 1 worker(s) x (1 CPU, 1 GPU)"), text
    assert "the cluster has 8 CPUs, 0 GPUs and no autoscaler" in text
    assert cluster.waiting_for == ""   # the cluster is left as it was
    with pytest.raises(ResourceError, match=r"^stages\.finetune\[0\]\.resources\.workers_per_trial: .* = 16 CPUs"):
        check_stage_resources(_staged(workers_per_trial=16), cluster)
    with pytest.raises(ResourceError, match=r"^stages\.ood\.resources\.cpus_per_worker: .*(64 CPU, 0 GPU)"):
        check_stage_resources(_staged(ood={"cpus_per_worker": 64}), cluster)
    cpu_only = [NodeType("cpu-node", 16.0, 0.0, 10)]
    with pytest.raises(ResourceError, match="its autoscaler can add only cpu-node"):
        check_stage_resources(_staged(gpus_per_worker=1), _cluster(node_types=cpu_only, autoscaler="v2"))
    with pytest.raises(ResourceError, match="its autoscaler reports that no node type"):
        check_stage_resources(_staged(gpus_per_worker=1), _cluster(autoscaler="v2"), ask=lambda bundles: False)


def test_a_stage_that_fits_or_that_the_autoscaler_can_make_room_for_passes():
    from qkvsearch.search.campaign.preflight import check_stage_resources
    from qkvsearch.search.cluster.capacity import NodeType

    assert check_stage_resources(_staged(gpus_per_worker=1), _cluster(gpus=2.0)) == []
    assert check_stage_resources(load_campaign(BASE), _cluster()) == []   # no stages
    gpu_nodes = _cluster(node_types=[NodeType("gpu-node", 8.0, 1.0, 4)], autoscaler="v2")
    waiting = check_stage_resources(_staged(gpus_per_worker=1), gpu_nodes)
    assert len(waiting) == 1 and waiting[0].startswith("stages.finetune[0]: waiting for the autoscaler") \
        and "gpu-node (8 CPU, 1 GPU)" in waiting[0], waiting
    asked = []
    silent = check_stage_resources(_staged(gpus_per_worker=1), _cluster(autoscaler="v2"),
                                   ask=lambda bundles: asked.append(bundles))
    assert asked == [[{"CPU": 1.0, "GPU": 1.0}]] and "does not say what it can add" in silent[0]


# ------------------------------------------------------------------ qkvsearch simulate: options and tables


def _table(folder, name="t.csv", **change) -> str:
    """A table of 6 curves of 4 epochs (config_w), top1 rising, params_m one value per curve; ``change``:
    column -> {row: value} (the CSV's data rows, from 0)."""
    import pandas as pd

    rows = [{"config_w": c, "epoch": e, "top1": 10.0 * c + e, "params_m": 1.0 + c, "epoch_s": 1.0}
            for c in range(6) for e in range(1, 5)]
    df = pd.DataFrame(rows).astype({"top1": object, "params_m": object})
    for column, cells in change.items():
        for row, value in cells.items():
            df.loc[row, column] = value
    path = folder / name
    df.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("change,argv,expected", [
    ({}, ["--objectives", "top1:max,top1:min"],
     "objectives: expected each metric once, given top1 twice (top1:max, top1:min)"),
    ({}, ["--seed", "-1"], "--seed: expected an int >= 0, given -1"),
    ({}, ["--startup-s", "-5"], "--startup-s: expected a number of seconds >= 0, given -5.0"),
    ({}, ["--schedulers", "fifo:grace=2"], "schedulers: expected fifo without options (it stops no trial), "
                                           "given 'fifo:grace=2'"),
    ({"top1": {5: "high"}}, [], "column top1: expected numbers (the metric top1), given 'high' in data row 6"),
    ({"params_m": {2: 9.0}}, [], "column params_m: expected one value per curve (a cost is known before "
                                 "training), given 1, 9 over the epochs of curve config_w=0"),
    ({"params_m": {6: None}}, [], "column params_m: expected a cost on every row of a curve, given an empty cell "
                                  "in data row 7 (curve config_w=1)"),
    ({}, ["--constraints", "params_m:max=-1"],
     "constraints: params_m:max: expected a number >= 0 (params_m cannot be negative), given -1"),
])
def test_simulate_refuses_what_it_cannot_replay(tmp_path, capsys, change, argv, expected):
    table = _table(tmp_path, **change)
    code, out, err = _run(capsys, "simulate", table, "--out", str(tmp_path / "out"), *argv)
    _refused(code, out, err, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_simulate_takes_the_same_table_when_it_is_sound(tmp_path, capsys):
    code, out, err = _run(capsys, "simulate", _table(tmp_path), "--out", str(tmp_path / "out"),
                          "--schedulers", "fifo", "--seed", "0")
    assert code == 0, err
    assert "6 curves" in out


# ------------------------------------------------------------------ a standard output that takes nothing


class _Failing(io.TextIOBase):
    """A standard output whose writes fail as a full disk or a closed pipe does."""

    def __init__(self, error: OSError):
        self.error = error

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error


@pytest.mark.parametrize("error,says", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), "Broken pipe"),
    (None, "standard output is closed"),   # started with its stdout closed: Python's sys.stdout is None
])
def test_cost_into_a_full_or_closed_output_exits_with_one_line(workdir, capsys, monkeypatch, error, says):
    spec = _spec_file(workdir)
    stream = None if error is None else _Failing(error)
    monkeypatch.setattr(sys, "stdout", stream)
    code = main(["cost", spec, "--csv"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [f"qkvsearch cost: stdout: expected an output that takes what the command "
                                        f"prints, given one that failed ({says}); nothing else was lost"]
    assert sys.stdout is stream   # main gives back the stream it found


# ------------------------------------------------------------------ damaged records: folders and pipes


@pytest.mark.timeout(120)   # reading the pipe as a record would block for ever
@pytest.mark.parametrize("command", [["status"], ["watch", "--once"], ["report"], ["simulate"]])
def test_a_record_that_is_a_folder_a_pipe_or_a_dead_link_is_reported_like_any_damaged_one(tmp_path, capsys, command):
    exp = tmp_path / "c"
    write_campaign(exp, ["completed"] * 5 + ["failed"])
    trials = exp / "qs_trials"
    (trials / "t09997.json").mkdir()
    os.mkfifo(trials / "t09998.json")
    os.symlink(tmp_path / "nowhere", trials / "t09999.json")
    argv = [command[0], str(exp), *command[1:]]
    if command[0] in ("report", "simulate"):
        argv += ["--out", str(tmp_path / "out")]
    if command[0] == "report":
        argv.append("--no-static")  # the records are read before any figure is drawn
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    for name, kind in (("t09997", "a folder"), ("t09998", "a pipe, socket or device"),
                       ("t09999", "a link to nowhere")):
        assert f"qs_trials/{name}.json: expected a trial record (a file), given {kind}" in err, err
    assert "Traceback" not in err


# ------------------------------------------------------------------ a campaign whose every trial failed


@pytest.mark.parametrize("statuses,code", [
    (["failed", "failed"], 3), (["failed", "completed"], 0), (["failed", "stopped_early"], 0),
    (["failed", "diverged"], 0), ([], 0),
])
def test_launch_exits_3_with_the_first_error_when_every_trial_failed(tmp_path, capsys, statuses, code):
    from qkvsearch.search.cli import EXIT_ALL_FAILED, closing_code
    from qkvsearch.search.monitor.progress import read_progress

    exp = str(tmp_path / "c")
    write_campaign(exp, statuses)
    assert closing_code(read_progress(exp), exp) == code
    err = capsys.readouterr().err
    if code:
        assert code == EXIT_ALL_FAILED
        assert err.strip() == (f"qkvsearch: every trial failed; the first: linear-h0-0000: RuntimeError: CUDA out of "
                               f"memory (`qkvsearch status {exp}` shows each error)"), err
    else:
        assert err == ""


@pytest.mark.parametrize("damage", ["no tuner.pkl", "searcher state of a newer version"])
def test_resume_refuses_what_it_cannot_resume_before_writing_anything(tmp_path, capsys, no_ray, damage):
    import json

    exp = tmp_path / "results" / "t"
    write_campaign(exp, ["completed", "running"], name="t",
                   spec=load_campaign({**BASE, "storage": str(tmp_path / "results")}).to_dict())
    if damage != "no tuner.pkl":
        (exp / "tuner.pkl").write_bytes(b"")
        (exp / "searcher-state-2030.pkl").write_text(json.dumps({"format": "qkvsearch-searcher-state",
                                                                  "version": 99, "algorithm": "random"}))
    before = tree_digest(exp)
    code, out, err = _run(capsys, "resume", str(exp))
    _refused(code, out, err,
             *(("tuner.pkl",) if damage == "no tuner.pkl" else ("version 99", f"up to {STATE_VERSION}")))
    assert tree_digest(exp) == before  # the campaign file's ended_at and the records as they were


# ------------------------------------------------------------------ every int a campaign file takes is bounded


def _int_checks():
    """(where, check) of every int a campaign file takes: every declared section table's Field rows (those the
    reference prints), the trial keys, the phases' own resources."""
    from qkvsearch.spaces.keys import KEYS
    from qkvsearch.spaces.reference import SECTION_TABLES
    from qkvsearch.spaces.schema import WORKER_RESOURCES

    found = [(f"{section}.{name}", field.check) for section, table in SECTION_TABLES.items()
             for name, field in table.items() if field.check is not None]
    found += [(f"key {name}", key.check) for name, key in KEYS.items()]
    found += [(f"resources.{name}", check) for name, check in WORKER_RESOURCES]

    def takes_ints(check) -> bool:
        try:
            return type(check(5)) is int
        except Exception:  # noqa: BLE001  (a check of strings or choices)
            return False

    return [(where, check) for where, check in found if takes_ints(check)]


def test_every_int_a_campaign_file_takes_has_an_upper_bound():
    from qkvsearch.spaces.checks import Bad

    checks = _int_checks()
    assert {"supernet.control", "supernet.bn_batches", "search.seed", "key loader_workers", "key seed",
            "resources.workers_per_trial"} <= {where for where, _ in checks}
    for where, check in checks:
        with pytest.raises(Bad) as info:
            check(10**12)
        assert info.value.expected and " up to " in info.value.expected, where


@pytest.mark.parametrize("sections,expected", [
    ({"supernet": {"train": {"epochs": 1}, "control": 10**9}},
     "supernet.control: expected a non-negative int up to 10000, given 1000000000"),
    ({"supernet": {"train": {"epochs": 1}, "bn_batches": 10**9}},
     "supernet.bn_batches: expected a positive int up to 1000, given 1000000000"),
    ({"supernet": {"train": {"epochs": 1}, "random_subnets": 10**6}},
     "supernet.random_subnets: expected a non-negative int up to 64, given 1000000"),
    ({"search": {"algorithm": "random", "num_trials": 2, "seed": 2**40}},
     "search.seed: expected a non-negative int up to 4294967295, given 1099511627776"),
    ({"train": {"epochs": 2, "batch_size": 8, "seed": 2**40}},
     "train.seed: expected a non-negative int up to 4294967295, given 1099511627776"),
    ({"train": {"epochs": 2, "batch_size": 8, "loader_workers": 1_000_000}},
     "train.loader_workers: expected a non-negative int up to 512 or auto, given 1000000"),
    ({"measure": {"batch": 10**12}}, "measure.batch: expected a positive int up to 1000000000, given 1000000000000"),
])
def test_a_count_past_what_its_field_can_mean_is_refused(sections, expected):
    space = {"embedding": ["linear", "sne"]} if "supernet" not in sections else {"embedding": {"choice": ["linear"]}}
    errors = _errors(space=space, **sections)
    assert any(e.startswith(expected) for e in errors), errors


# ------------------------------------------------------------------ deployment targets and their bounds


ONESHOT = {**BASE, "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
           "space": {"depth": 2, "embedding": {"choice": ["linear", "sne"]}},
           "supernet": {"train": {"epochs": 1}, "control": 0}}


@pytest.mark.parametrize("amount", [float("nan"), float("inf"), -1, 0, True, "1"])
@pytest.mark.parametrize("where", ["targets", "measure"])
def test_a_resource_amount_that_is_no_positive_finite_number_is_refused(where, amount):
    if where == "targets":
        errors = _errors(**ONESHOT, targets=[{"name": "phone", "resources": {"CPU": amount}}])
        path = "targets[0].resources.CPU"
    else:
        errors = _errors(measure={"resources": {"CPU": amount}})
        path = "measure.resources.CPU"
    assert len(errors) == 1 and errors[0].startswith(f"{path}: expected a positive amount of a named Ray resource"), \
        errors


@pytest.mark.parametrize("metric", ["params", "params_m", "gmacs", "latency_ms", "throughput", "train_step_ms",
                                    "peak_mem_gb", "size_mb"])
def test_a_max_of_0_on_a_cost_every_model_has_is_refused_for_the_campaign_and_a_target(metric):
    expected = f"expected a number > 0 (every model's {metric} is above 0: a max of 0 holds for none), given 0"
    errors = _errors(**ONESHOT, constraints={metric: {"max": 0}})
    assert errors == [f"constraints.{metric}.max: {expected}"], errors
    errors = _errors(**ONESHOT, targets=[{"name": "phone", "constraints": {metric: {"max": 0.0}}}])
    assert errors == [f"targets[0].constraints.{metric}.max: {expected}"], errors
    load_campaign({**ONESHOT, "constraints": {metric: {"min": 0}}})   # holds for every model: no harm


def test_a_counted_max_the_smallest_subnet_breaks_is_refused_for_the_campaign_and_a_target(workdir, capsys, no_ray):
    for sections, said in (({"constraints": {"params_m": {"max": 0.001}}}, "constraints.params_m: "),
                           ({"targets": [{"name": "phone", "constraints": {"gmacs": {"max": 1e-6}}}]},
                            "targets[0].constraints.gmacs: ")):
        code, out, err = _run(capsys, "validate", _spec_file(workdir, **{**ONESHOT, **sections}))
        _refused(code, out, err, said + "expected a bound the space's smallest subnet meets, given {'max': ",
                 "which it breaks", "no subnet of the space can serve it")
    code, out, err = _run(capsys, "validate", _spec_file(workdir, **{**ONESHOT, "search": {"algorithm": "grid"}},
                                                         constraints={"params_m": {"min": 0.5}}))
    assert code == 0, err   # a min the smallest breaks: larger subnets may meet it (grid: no searcher estimates)


@pytest.mark.parametrize("given", [[], {}, ""])
def test_empty_target_objectives_are_refused_not_taken_for_the_campaigns(given):
    errors = _errors(**ONESHOT, targets=[{"name": "phone", "objectives": given}])
    assert len(errors) == 1 and errors[0].startswith("targets[0].objectives: expected a non-empty list"), errors
    spec = load_campaign({**ONESHOT, "targets": [{"name": "phone", "objectives": None}]})   # null: the campaign's
    assert spec.targets[0].objectives == ()


def _written_supernet(folder, *, trained: bool, plan: bool = True) -> None:
    """A campaign folder holding a supernet/ nested campaign as a launch leaves it (without its weights)."""
    from helpers.campaign_files import atomic_json

    sub = folder / "supernet"
    write_campaign(sub, ["completed" if trained else "running"], name="supernet")
    if plan:
        atomic_json(sub / "plan.json", {})


@pytest.mark.parametrize("source,fragment", [
    ("missing", "which does not exist"),
    ("a-file", "which is no folder"),
    ("of-trials", "which holds no supernet/qs_campaign.json (no supernet trained there"),
    ("no-plan", "which holds no supernet/plan.json"),
    ("untrained", "expected a trained supernet (a completed trial with its checkpoint), given running"),
    ("damaged", "supernet/qs_campaign.json: expected a JSON object, given invalid or truncated JSON"),
])
def test_a_supernet_from_that_holds_no_trained_supernet_is_refused_naming_the_field_as_written(
        workdir, capsys, no_ray, source, fragment):
    (workdir / "a-file").write_text("x")
    write_campaign(workdir / "of-trials", ["completed"])
    _written_supernet(workdir / "no-plan", trained=True, plan=False)
    _written_supernet(workdir / "untrained", trained=False)
    _written_supernet(workdir / "damaged", trained=True)
    (workdir / "damaged" / "supernet" / "qs_campaign.json").write_text('{"name": "supernet", "spec": {')
    spec = _spec_file(workdir, **{k: v for k, v in ONESHOT.items() if k != "supernet"},
                      supernet={"from": source, "control": 0})
    for command in ("validate", "launch"):
        code, out, err = _run(capsys, command, spec)
        _refused(code, out, err, "supernet.from: expected a one-shot campaign folder whose supernet has trained, "
                                 f'given "{source}"', fragment)
        if source not in ("untrained", "damaged"):   # only the file at fault is named beyond the folder as given
            assert f"{source}/supernet/" not in err.replace(f"{source}/supernet/qs_campaign.json", ""), err
    assert not (workdir / "results").exists()


# ------------------------------------------------------------------ one-shot runs: none chosen, a space exhausted


def _scored(spec, **metrics) -> list[dict]:
    """An evaluation per configuration of the spec's space, as scoring records them."""
    from qkvsearch.search.campaign.oneshot.plan import candidates

    return [{"subnet_id": f"subnet_{i:06d}", "keys": t["keys"], "config": t["config"], "cost": t["cost"],
             "metrics": {"top1": 50.0 + i, **metrics}, "status": "completed"} for i, t in enumerate(candidates(spec))]


def test_a_selection_of_no_feasible_subnet_chooses_none_and_plans_no_retraining(caplog):
    from qkvsearch.search.campaign.oneshot.retrain import retraining, select

    spec = load_campaign({**ONESHOT, "constraints": {"size_mb": {"max": 0.001}}})   # no subnet is this small
    records = _scored(spec, size_mb=1.0)
    for scored in (records, [], [{**r, "status": "failed", "metrics": {}, "error": "Traceback ...\nStopIteration"}
                                 for r in records]):
        chosen = select(spec, scored)
        assert chosen["chosen"] == [] and chosen["control"] == []
        with caplog.at_level("WARNING", logger="qkvsearch"):
            assert retraining(spec, chosen, scored, "target phone: ") is None
    said = [r.getMessage() for r in caplog.records]
    assert said == ["target phone: nothing to retrain: none of the 2 subnet(s) scored meets the constraints with "
                    "every objective known",
                    "target phone: nothing to retrain: no subnet was scored: every proposal broke a constraint, or "
                    "no model can be made of it",
                    "target phone: nothing to retrain: every one of the 2 subnet(s) scored failed; the first, "
                    "subnet_000000: StopIteration"], said


def test_a_control_sample_larger_than_the_space_ends_with_what_the_space_holds():
    import time

    from qkvsearch.search.campaign.oneshot.retrain import control_sample

    spec = load_campaign({**ONESHOT, "supernet": {"train": {"epochs": 1}, "control": 10_000}})
    start = time.monotonic()
    drawn = control_sample(spec, [{"depth": 2, "embedding": "linear"}])
    assert drawn == [{"depth": 2, "embedding": "sne"}]   # the one configuration left
    assert time.monotonic() - start < 60


def test_bn_batches_past_one_pass_over_the_training_split_take_the_next_passes():
    import torch

    from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
    from qkvsearch.trainers.data.sources import DatasetError
    from qkvsearch.trainers.supernet.plan import SupernetPlan
    from qkvsearch.trainers.supernet.scoring import SubnetScorer

    spec = load_campaign(ONESHOT)
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    state = {"model": plan.supernet(init=False).state_dict()}   # its values play no part in which batches come
    config = candidates(spec)[0]["config"]
    scorer = SubnetScorer(plan, state, {**config, "batch_size": 512}, bn_batches=5)   # 1437 images: 2 a pass
    batches = list(scorer._bn_batches())
    assert len(batches) == 5 and all(x.shape[0] == 512 for x in batches)
    assert not torch.equal(batches[0], batches[2])   # the second pass, in its own order
    with pytest.raises(DatasetError, match=r"^supernet.bn_batches: expected a training split of at least one batch "
                                           r"\(4096 images\) to recalibrate BatchNorm on, given 1437 images"):
        list(SubnetScorer(plan, state, {**config, "batch_size": 4096}, bn_batches=1)._bn_batches())


def test_a_value_no_model_can_take_is_refused_by_validate_naming_the_key(workdir, capsys):
    """XCiT's attention splits embed_dim among its heads without checking: 999 over 4 heads was a reshape's
    RuntimeError in validate, and in `export --set embed_dim=999`."""
    from qkvsearch.search.searchers.problem import build_trial
    from qkvsearch.spaces import base_config

    spec = _spec_file(workdir, model=ONESHOT["model"], space={"depth": 2, "embed_dim": [64, 999]},
                      search={"algorithm": "grid"})
    code, out, err = _run(capsys, "validate", spec)
    _refused(code, out, err, "embed_dim: expected an embed_dim that xcit_nano_12_p8_224's 4 heads divide "
                             "(embed_dim 999), given 999")
    trial = build_trial(base_config(load_campaign(ONESHOT)), {"depth": 2, "embedding": "sne", "embed_dim": 999})
    assert trial["invalid"].startswith("embed_dim: expected an embed_dim that")


# -------------------------------------------------------------- one-shot campaign folders: damaged, or missing a part


TARGETED = {**ONESHOT, "targets": [{"name": "a"}, {"name": "b"}]}


def _oneshot_folder(root, spec: dict = ONESHOT) -> tuple[str, list[str]]:
    """A one-shot campaign's folder as its driver leaves it once every folder of scores has scored
    search.num_trials (2) subnets and chosen one (the supernet and the retraining left out); -> (the campaign
    folder, its folders of scores: its own, or one per deployment target)."""
    from qkvsearch.search.records import inherited
    from qkvsearch.search.records.layout import CampaignFolder

    exp = str(root / "results" / "t")
    full = load_campaign({**spec, "storage": str(root / "results")})
    CampaignFolder.create(exp, full, "test")
    folders = [inherited.target_dir(exp, t.name) for t in full.targets] or [exp]
    for folder in folders:
        if folder != exp:
            CampaignFolder.create(folder, load_campaign({**ONESHOT, "name": folder.rsplit("/", 1)[1],
                                                         "storage": f"{exp}/targets"}), "test")
        keys = [{"depth": 2, "embedding": e} for e in ("linear", "sne")]
        for i, k in enumerate(keys):
            inherited.write_batch(folder, i, [{"subnet_id": f"subnet_{i:06d}", "keys": k, "config": {**k, "seed": 0},
                                               "cost": {"gmacs": 0.1 + i}, "metrics": {"top1": 50.0 + i},
                                               "supernet": "s", "space": "h"}])
        inherited.write_selection(folder, {"chosen": keys[1:], "control": [], "seed": 0, "retrain_from": "scratch"})
    return exp, folders


READERS = {"status": [], "watch": ["--once"], "report": ["--no-static"]}
DAMAGED = {  # what a record holds -> what the message says it holds
    "selection.json": {b'{"chosen": [{"depth": 2': "given invalid or truncated JSON",
                       b"": "given an empty file",
                       b"[1, 2]": "given a list",
                       b'{"chosen": 5, "control": [], "seed": 0}': "chosen: expected a list of objects (space keys), "
                                                                   "given 5",
                       b'{"chosen": [], "control": []}': "seed: expected an int, given nothing"},
    "measured.json": {b'{"subnet_000001": {"cost": {"latency_ms"': "given invalid or truncated JSON",
                      b'{"subnet_000001": 5}': 'subnet_000001: expected {"cost": {...}, "measured_on": ...} or '
                                               '{"error": ...}, given 5'},
}


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("spec", [ONESHOT, TARGETED], ids=["campaign", "targets"])
def test_a_damaged_selection_or_measured_cost_record_exits_2_naming_it_with_nothing_written(
        tmp_path, capsys, command, spec):
    from qkvsearch.search.records import inherited

    exp, folders = _oneshot_folder(tmp_path, spec)
    cases = [(name, content, said) for name, contents in DAMAGED.items() for content, said in contents.items()]
    cases += [("selection.json", "folder", "(a file), given a folder"),
              ("selection.json", "pipe", "(a file), given a pipe, socket or device")]   # never opened: no hang
    for name, content, said in cases:
        path = f"{folders[-1]}/{inherited.INHERITED_DIR}/{name}"
        kept = open(path, "rb").read() if os.path.exists(path) else None
        os.remove(path) if os.path.exists(path) else None
        if content == "folder":
            os.mkdir(path)
        elif content == "pipe":
            os.mkfifo(path)
        else:
            open(path, "wb").write(content)
        before = _files(exp)
        code, out, err = _run(capsys, command, exp, *READERS[command])
        _refused(code, out, err, f"qkvsearch {command}: {path}: ", said)
        assert _files(exp) == before and not os.path.exists(f"{exp}/report")
        os.rmdir(path) if content == "folder" else os.remove(path)
        if kept is not None:
            open(path, "wb").write(kept)


def _files(root) -> dict:
    """Every plain file under root -> its digest (a pipe is never opened: reading it would block)."""
    import hashlib

    return {os.path.join(d, f): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(root) for f in files if os.path.isfile(os.path.join(d, f))}


def _damage(exp: str, folders: list[str], what: str) -> str:
    """Damage the folder as ``what`` says; -> the file or folder a reader must name."""
    import shutil

    from qkvsearch.search.records import inherited

    batch = f"{folders[-1]}/{inherited.INHERITED_DIR}/batch-000001.json"
    if what == "truncated batch":
        open(batch, "r+b").truncate(20)
        return batch
    if what == "emptied batch":
        open(batch, "w").write("[]")
        return batch
    if what == "missing selection":
        selection = f"{folders[-1]}/{inherited.INHERITED_DIR}/{inherited.SELECTION_FILE}"
        os.remove(selection)
        return selection
    shutil.rmtree(folders[0])   # a missing target folder
    return folders[0]


@pytest.mark.parametrize("what,spec", [("truncated batch", ONESHOT), ("emptied batch", TARGETED),
                                       ("missing selection", ONESHOT), ("missing selection", TARGETED),
                                       ("missing target folder", TARGETED)])
def test_a_missing_part_or_a_damaged_batch_is_named_by_status_watch_and_report(tmp_path, capsys, what, spec):
    exp, folders = _oneshot_folder(tmp_path, spec)
    named = _damage(exp, folders, what)
    code, out, err = _run(capsys, "status", exp)
    assert code == 0 and f"  missing or damaged record {named}: expected " in out, out + err
    code, out, err = _run(capsys, "watch", exp, "--once")
    assert code == 0 and "1 record(s) missing or damaged (`qkvsearch status` names them)" in out, out + err
    code, out, err = _run(capsys, "report", exp, "--no-static")
    assert code == 0 and f"warning: {named}: expected " in err and "the report goes on without it" in err, err
    assert "Traceback" not in err


# ------------------------------------------------------------------ export --out: never a record, never a file kept


def _export(capsys, exp, *argv):
    return _run(capsys, "export", exp, "--target", "a", "--rank", "1", *argv) if "targets" in os.listdir(exp) \
        else _run(capsys, "export", exp, "--rank", "1", *argv)


@pytest.mark.parametrize("inside,said", [
    ("qs_inherited/selection.json", "which is inside the campaign folder"),
    ("qs_inherited/batch-000000.json", "which is inside the campaign folder"),
    ("targets/a/qs_inherited/selection.json", "which is inside the campaign folder"),
    ("targets/a/subnets/x.pt", "which is inside the campaign folder"),
    ("targets/x.pt", "which is inside the campaign folder"),
    ("x.pt", "which is the campaign folder itself"),
    ("qs_trials/x.pt", "which is inside the campaign's qs_trials/ folder"),
])
def test_export_refuses_an_out_inside_the_campaigns_records(tmp_path, capsys, inside, said):
    exp, _ = _oneshot_folder(tmp_path, TARGETED)
    before = tree_digest(exp, skip=None)
    code, out, err = _export(capsys, exp, "--out", f"{exp}/{inside}")
    _refused(code, out, err, "qkvsearch export: --out: expected a folder outside a campaign's own files", said)
    assert tree_digest(exp, skip=None) == before


def test_export_replaces_no_file_without_force_and_writes_no_summary_over_its_checkpoint(tmp_path, capsys):
    from qkvsearch.search.records import inherited

    exp, folders = _oneshot_folder(tmp_path, ONESHOT)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kept.pt").write_text("a file of mine")
    (mine / "other.json").write_text("a summary of mine")
    exports = f"{exp}/exports"
    os.makedirs(exports)
    open(f"{exports}/subnet_000001.pt", "w").write("an earlier export")   # the chosen subnet's own name
    before = tree_digest(tmp_path, skip=None)
    for argv, said in (
            (["--out", str(mine / "kept.pt")], f'--out: expected a path where no file is, given "{mine}/kept.pt", '
                                              f"whose checkpoint {mine}/kept.pt exists"),
            (["--out", str(mine / "other.pt")], f"whose summary {mine}/other.json exists"),
            ([], f"{exports}/subnet_000001.pt: expected no file where the export writes its checkpoint, given an "
                 "earlier export of this subnet; --force replaces it"),
            (["--out", str(mine / "y.json")], "--out: expected a checkpoint's path not ending in .json"),
            (["--out", f"{exports}/y.json", "--force"], "--out: expected a checkpoint's path not ending in .json")):
        code, out, err = _export(capsys, exp, *argv)
        _refused(code, out, err, said)
    assert tree_digest(tmp_path, skip=None) == before
    assert inherited.read_selection(folders[0])["chosen"] == [{"depth": 2, "embedding": "sne"}]


@pytest.mark.slow
def test_export_with_force_replaces_the_file_at_out_and_touches_no_record(trained_oneshot, tmp_path, capsys):
    """On the one-shot campaign trained once per session: the refusals above, then --force writing for real."""
    from helpers.trained_supernet import TRAINED_TARGET

    exp = str(trained_oneshot)
    before = tree_digest(exp, skip=None)
    out = tmp_path / "mine.pt"
    out.write_text("a file of mine")
    argv = ["export", exp, "--target", TRAINED_TARGET, "--rank", "1", "--out"]
    for where in (f"{exp}/targets/{TRAINED_TARGET}/qs_inherited/selection.json", str(out)):
        code, _, err = _run(capsys, *argv, where)
        assert code == 2 and "--out: expected a " in err, err
    code, printed, err = _run(capsys, *argv, str(out), "--force")
    assert code == 0, err
    assert printed.splitlines() == [f"checkpoint: {out}", f"summary: {tmp_path / 'mine.json'}"]
    assert out.read_bytes()[:2] == b"PK"   # torch's zip format, in place of the file it replaced
    assert tree_digest(exp, skip=None) == before


# ------------------------------------------------------------------ data that the trial would refuse: validate does


def _png(side: int = 8) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def _hf_folder(folder, train: list, val: list) -> str:
    """A folder as datasets writes one (Dataset.to_parquet), a split per file: (image, label) rows."""
    import datasets

    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    folder.mkdir()
    for split, rows in (("train", train), ("validation", val)):
        datasets.Dataset.from_dict({"image": [r[0] for r in rows], "label": [r[1] for r in rows]},
                                   features=features).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    return str(folder)


def _wds_folder(folder, train: list[dict], val: list[dict]) -> str:
    """A shard per split as webdataset's TarWriter writes one (samples: {extension: value}), and timm's info file."""
    import webdataset as wds

    folder.mkdir()
    info = {"name": "hostile", "splits": {}}
    for split, samples in (("train", train), ("validation", val)):
        with wds.TarWriter(str(folder / f"{split}-0000.tar")) as sink:
            for i, sample in enumerate(samples):
                sink.write({"__key__": f"s{i:06d}", **sample})
        info["splits"][split] = {"name": split, "num_samples": len(samples), "filenames": [f"{split}-0000.tar"],
                                 "shard_lengths": [len(samples)]}
    (folder / "_info.json").write_text(json.dumps(info))
    return str(folder)


def _data_cases(tmp_path) -> dict:
    """case -> (the data section, what validate says of it)."""
    good = [({"bytes": _png(), "path": None}, i % 3) for i in range(4)]
    empty = {"bytes": b"", "path": None}
    sample = {"png": _png(), "cls": 1}
    imagefolder = tmp_path / "imagefolder"
    write_imagefolder(imagefolder, ["ant", "bee", "cat"], 2)
    (imagefolder / "train" / "ant" / "0.png").write_bytes(b"")
    return {
        "hfds empty split": ({"dataset": "hfds", "path": _hf_folder(tmp_path / "h1", good, [])},
                             "expected rows in split validation of"),
        "hfds label missing": ({"dataset": "hfds", "path": _hf_folder(tmp_path / "h2", good + [(good[0][0], None)],
                                                                      good)},
                               "expected a label on every row of"),
        "hfds zero-byte image": ({"dataset": "hfds", "path": _hf_folder(tmp_path / "h3", [(empty, 0)] + good, good)},
                                 "given one that cannot be read (ValueError: an empty image (0 bytes, no path))"),
        "hfds label out of range": ({"dataset": "hfds", "path": _hf_folder(tmp_path / "h4", good + [(good[0][0], 7)],
                                                                           good)},
                                    "expected labels in 0..2 (num_classes)"),
        "wds json labels": ({"dataset": "wds",
                             "path": _wds_folder(tmp_path / "w1", [{"png": _png(), "json": {"label": 1}}], [sample])},
                            "could not be decoded (expected an image jpg / png / webp and its class in .cls): "
                            "KeyError: 'no .cls file (its files: json, png)'"),
        "wds label out of range": ({"dataset": "wds", "path": _wds_folder(tmp_path / "w2", [{**sample, "cls": 7}],
                                                                           [sample])},
                                   "has label 7, expected 0..2 (num_classes 3)"),
        "wds zero-byte image": ({"dataset": "wds", "path": _wds_folder(tmp_path / "w3", [sample],
                                                                        [{**sample, "png": b""}])},
                                "ValueError: an empty image file (0 bytes)"),
        "imagefolder zero-byte image": ({"dataset": "imagefolder", "path": str(imagefolder)},
                                        "0.png', given a file that cannot be read "
                                        "(ValueError: an empty file (0 bytes))"),
    }


def test_validate_refuses_data_the_trial_would_refuse(workdir, capsys, no_ray):
    model = {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 3}
    for data, said in _data_cases(workdir).values():
        spec = _spec_file(workdir, model=model, data=data)
        for command in ("validate", "launch"):
            code, out, err = _run(capsys, command, spec)
            _refused(code, out, err, "data_path: ", data["path"], said)
            assert "expected" in err, err
    assert not (workdir / "results").exists()


def test_the_same_data_made_sound_passes(workdir, capsys):
    good = [({"bytes": _png(), "path": None}, i % 3) for i in range(4)]
    model = {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 3}
    for data in ({"dataset": "hfds", "path": _hf_folder(workdir / "h", good, good)},
                 {"dataset": "wds", "path": _wds_folder(workdir / "w", [{"png": _png(), "cls": 1}],
                                                         [{"png": _png(), "cls": 2}])}):
        code, out, err = _run(capsys, "validate", _spec_file(workdir, model=model, data=data))
        assert code == 0, err


# ------------------------------------------------------------------ a stage's data in a bucket


def test_a_stage_path_in_a_bucket_is_checked_as_data_path_is_not_warned_about(workdir, capsys):
    stages = {"finetune": [{"dataset": "cifar10", "path": "s3://stage-data/cifar-10-batches-py", "epochs": 1}]}
    code, out, err = _run(capsys, "validate", _spec_file(workdir, stages=stages))
    _refused(code, out, err, "stages.finetune[0].path: expected a local folder holding data_batch_1",
             "(cifar10 is read from files; wds also from a bucket prefix), given 's3://stage-data/cifar-10-batches-py'")
    assert "does not exist on this machine" not in err
    code, out, err = _run(capsys, "validate", _spec_file(workdir, data={"dataset": "cifar10",
                                                                       "path": "s3://stage-data/cifar-10-batches-py"}))
    _refused(code, out, err, "data_path: expected a local folder holding data_batch_1")   # the same rule
    stages["finetune"][0]["path"] = str(workdir / "elsewhere")   # a folder of another machine: a warning
    code, out, err = _run(capsys, "validate", _spec_file(workdir, stages=stages))
    assert code == 0 and f"stages.finetune[0].path: {workdir / 'elsewhere'} does not exist on this machine" in err


def test_every_source_declares_what_loader_workers_auto_asks_with_the_defaults_of_one_in_memory():
    from qkvsearch.trainers.data.shard_source import ShardSource
    from qkvsearch.trainers.data.sources import PilSource, Source, TensorSource

    for cls in (TensorSource, PilSource, ShardSource):
        assert Source in cls.__mro__
        assert all(callable(getattr(cls, name)) for name in ("decode_rate", "most_workers", "part", "batches"))
    import torch

    memory = TensorSource(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64), 8, 1)
    assert (memory.loader_workers, memory.decode_rate(), memory.most_workers(4)) == (None, None, None)
    assert PilSource([], 2).most_workers(4) is None and PilSource([], 2).loader_workers == 2
