"""Hostile input: binary, deeply nested, alias-bomb, oversized or missing files, directories and FIFOs
given as a spec, damaged campaign folders, impossible storage and resources. Every command exits 2
with a short message naming the file, never a traceback or a hang, and writes nothing."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import PRESETS

from qkvsearch.search.campaign import preflight
from qkvsearch.search.campaign.preflight import ResourceError, check_local_resources, check_storage
from qkvsearch.search.cli import main
from qkvsearch.spaces import BadInput, SpecError, dimensions, load_campaign
from qkvsearch.spaces.errors import show
from qkvsearch.spaces.reading import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

LIMIT = 2000   # characters a refusal may print


def _lol(levels: int = 9) -> str:
    """The "billion laughs" file: 10 levels of 9 aliases each, about 1.3 KB that expand to 9**9 strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nspace: {{embedding: {{choice: *a{levels}}}}}\n"


HOSTILE = {
    "utf16.yaml": b"\xff\xfen\x00a\x00m\x00e\x00",
    "png.yaml": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "nul.yaml": b"name: x\x00\nmodel: {}\n",
    "latin1.yaml": b"name: caf\xe9\n",
    "control.yaml": b"name: a\x07b\n",
    "deep.yaml": b"[" * 100_000,
    "deep-map.yaml": b"".join(b"  " * i + b"k:\n" for i in range(MAX_DEPTH + 10)),
    "bomb.yaml": _lol().encode(),
    "self.yaml": b"space: &s {variants: [*s]}\n",
    "huge-int.yaml": b"name: " + b"9" * 5000 + b"\n",
    "too-big.yaml": b"# " + b"x" * MAX_FILE_BYTES + b"\n",
    "list.yaml": b"- just\n- a list\n",
}
FRAGMENTS = {
    "utf16.yaml": "UTF-16", "png.yaml": "binary", "nul.yaml": "NUL byte", "latin1.yaml": "not UTF-8",
    "control.yaml": "control character", "deep.yaml": f"deeper than {MAX_DEPTH} levels",
    "deep-map.yaml": f"deeper than {MAX_DEPTH} levels", "bomb.yaml": f"at most {MAX_NODES} values",
    "self.yaml": "contains itself", "huge-int.yaml": "Python can read", "too-big.yaml": f"{MAX_FILE_BYTES} bytes",
    "list.yaml": "expected a mapping of sections",
}
SPEC_COMMANDS = ("validate", "cost", "launch")


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(code: int, out: str, err: str, name: str) -> None:
    assert code == 2, err
    assert name in err, err
    assert "Traceback" not in err, err
    assert len(err) + len(out) < LIMIT, f"{len(err)} characters: {err[:300]}"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working folder, so the default storage (results/) would land in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", SPEC_COMMANDS)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_spec_file_exits_2_naming_it(workdir, capsys, command, name):
    path = workdir / name
    path.write_bytes(HOSTILE[name])
    code, out, err = _run(capsys, command, str(path))
    _refused(code, out, err, name)
    assert FRAGMENTS[name] in err, err
    assert not (workdir / "results").exists()


def test_the_alias_bomb_is_small_and_cheap_to_refuse(workdir):
    path = workdir / "bomb.yaml"
    path.write_text(_lol())
    assert path.stat().st_size < 1500
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert time.monotonic() - start < 1
    assert len(str(info.value)) < LIMIT and str(path) in str(info.value)


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_directory_fifo_and_missing_file_exit_2(workdir, capsys, command):
    (workdir / "folder.yaml").mkdir()
    os.mkfifo(workdir / "pipe.yaml")   # reading it would block forever
    for name, fragment in (("folder.yaml", "a directory"), ("pipe.yaml", "special file"),
                           ("missing.yaml", "not found")):
        code, out, err = _run(capsys, command, str(workdir / name))
        _refused(code, out, err, name)
        assert fragment in err, err
    code, out, err = _run(capsys, command, str(workdir / "folder.yaml" / "under-a-folder" / "x.yaml"))
    _refused(code, out, err, "x.yaml")
    assert not (workdir / "results").exists()


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_unreadable_spec_file_exits_2(workdir, capsys, monkeypatch, command):
    path = workdir / "secret.yaml"
    path.write_text("name: secret\n")
    real_open = pathlib.Path.open

    def deny(self, *args, **kwargs):   # chmod 000 does not stop root, so the refusal is simulated
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", deny)
    code, out, err = _run(capsys, command, str(path))
    _refused(code, out, err, "secret.yaml")
    assert "cannot be read (Permission denied)" in err
    assert not (workdir / "results").exists()


def test_spec_under_a_file_exits_2(workdir, capsys):
    (workdir / "plain").write_text("x")
    code, out, err = _run(capsys, "validate", str(workdir / "plain" / "spec.yaml"))
    _refused(code, out, err, "spec.yaml")
    assert "cannot be read" in err


@pytest.mark.parametrize("value", ["[" * 100_000, "&a [*a]", "x" * 100_000], ids=["deep", "self", "long"])
def test_hostile_override_values_exit_2_briefly(workdir, capsys, value):
    code, out, err = _run(capsys, "validate", str(PRESETS / "quickstart.yaml"), "--set", f"space.embedding={value}")
    assert code == 2 and "Traceback" not in err, err
    assert "space.embedding" in err, err
    assert len(err) < LIMIT, err[:300]


def test_oversized_and_deep_python_specs_are_refused_before_copying():
    shared = ["lol"] * 10
    for _ in range(8):
        shared = [shared] * 10
    with pytest.raises(SpecError, match=f"at most {MAX_NODES} values"):
        load_campaign({"name": "x", "space": {"variants": shared}})
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(SpecError, match=f"at most {MAX_DEPTH} levels"):
        load_campaign({"name": "x", "description": deep})


# ------------------------------------------------------------------ show(): bounded echo


def test_show_is_bounded_and_lazy():
    bomb: object = "lol"
    for _ in range(30):               # 10**30 strings if expanded
        bomb = [bomb] * 10
    text = show(bomb)
    assert len(text) <= 200 and text.endswith("…") and text.startswith("[[[")
    looped: list = []
    looped.append(looped)
    assert len(show(looped)) <= 200
    assert len(show("x" * 10**7)) <= 200
    assert len(show({"k" * 10**6: 1})) <= 200
    assert "bits" in show(10**5000)
    assert len(show(b"\0" * 10**6)) <= 200


@pytest.mark.parametrize("value", ["big", 0, 6.5, None, True, [8, 0], {"a": [1, "b"]}, [], {}, {1: 2}])
def test_show_matches_json_for_small_values(value):
    assert show(value) == json.dumps(value)


# ------------------------------------------------------------------ grid size: counted, not enumerated


def _grid_of(n_dims: int, per_dim: int) -> dict:
    """A spec whose grid has per_dim**n_dims points (searchable train keys, each a grid of values)."""
    floats = ["lr", "weight_decay", "drop_path_rate", "label_smoothing", "min_lr", "warmup_lr"]
    ints = ["seed", "checkpoint_every"]
    space = {}
    for key in (floats + ints)[:n_dims]:
        space[key] = {"grid": [i + 1 if key in ints else round(1e-3 * (i + 1), 6) for i in range(per_dim)]}
    return {"name": "huge", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "digits"},
            "train": {"epochs": 10, "batch_size": 8}, "space": space, "search": {"algorithm": "grid"}}


@pytest.mark.timeout(60)  # enumerating the grid would take hours
def test_a_grid_of_10_to_the_8_points_validates_without_enumerating_it(workdir, capsys):
    small = workdir / "small.yaml"
    small.write_text(yaml.safe_dump(_grid_of(8, 1)))
    assert _run(capsys, "validate", str(small))[0] == 0   # pays the one-off imports (model names)
    path = workdir / "huge.yaml"
    path.write_text(yaml.safe_dump(_grid_of(8, 10)))
    code, out, err = _run(capsys, "validate", str(path))
    assert code == 0, err
    assert "100000000 trials" in out


SPACES = [
    {},
    {"embedding": ["linear", "sne", "psne", "fsne"]},
    {"embedding": ["linear", "sne", "fsne"], "hidden_width": [0.5, 1.0], "code_size": [4, 8, 16],
     "code_sharing": ["shared", "per_block"]},
    {"embedding": ["sne", "fsne"], "code_sharing": ["shared", "per_block"],
     "code_size": {"choice": [4, 8], "when": {"code_sharing": "per_block"}}, "lr": [1e-3, 1e-4]},
    {"variants": [{"embedding": "linear"}, {"embedding": "fsne", "code_size": 4}, {"embedding": "sne"}],
     "hidden_width": [0.25, 0.5, 1.0], "code_sharing": {"choice": ["shared", "per_block"]}},
]


@pytest.mark.parametrize("space", SPACES, ids=[f"space{i}" for i in range(len(SPACES))])
def test_count_matches_enumeration(space):
    spec = load_campaign({"name": "t", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "digits"},
                          "train": {"epochs": 2, "batch_size": 8}, "space": space})
    assert dimensions.count(spec.space) == len(dimensions.expand(spec.space))
    assert spec.search.num_trials == len(dimensions.expand(spec.space))


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS.glob("*.yaml")))
def test_count_matches_enumeration_on_presets(preset):
    spec = load_campaign(PRESETS / f"{preset}.yaml")
    if spec.space.enumerable:
        assert dimensions.count(spec.space) == len(dimensions.expand(spec.space))


# ------------------------------------------------------------------ one message per mistake


BASE = {"name": "t", "model": {"name": "xcit_nano_12_p16_224"}, "data": {"dataset": "digits"},
        "train": {"epochs": 2, "batch_size": 8}, "space": {"embedding": ["linear", "sne"]}}


def _errors(**sections) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_campaign({**BASE, **sections})
    return info.value.errors


@pytest.mark.parametrize("search,expected", [
    ({"algorithm": "random", "num_trials": 0}, "search.num_trials: expected a positive int, given 0"),
    ({"algorithm": "tpe", "num_trials": "many"}, 'search.num_trials: expected a positive int, given "many"'),
    ({"algorithm": "grid", "repeats": 0, "num_trials": 4}, "search.repeats: expected a positive int, given 0"),
    ({"algorithm": "random", "num_trials": 4, "repeats": 0}, "search.repeats: expected a positive int, given 0"),
    ({"algorithm": "tpe", "num_trials": 4, "population_size": 1},
     "search.population_size: applies to algorithm nsga2 only"),
    ({"algorithm": "bayes", "num_trials": 0}, "search.algorithm: expected one of"),
])
def test_one_search_mistake_gives_one_message(search, expected):
    errors = _errors(search=search)
    if search.get("algorithm") == "bayes":   # two independent mistakes: both, and no third
        assert len(errors) == 2 and errors[0].startswith(expected), errors
        return
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_a_broken_space_does_not_also_blame_num_trials():
    errors = _errors(space={"embedding": ["linear", "snee"], "lr": [1e-3, 1e-4]},
                     search={"algorithm": "grid", "num_trials": 4})
    assert len(errors) == 1 and errors[0].startswith("space.embedding.choice[1]"), errors
    errors = _errors(space={"seed": {"int": [5, 2]}, "lr": {"grid": [1e-3]}}, search={"num_trials": 4})
    assert len(errors) == 1 and errors[0].startswith("space.seed.int"), errors


def test_grid_values_under_the_default_algorithm_name_the_range():
    errors = _errors(space={"seed": {"int": [0, 3]}, "lr": {"grid": [1e-3, 1e-4]}}, search={"num_trials": 4})
    assert len(errors) == 1, errors
    assert "space.lr.grid" in errors[0] and "space.seed is a range" in errors[0] and "given random" not in errors[0]


# ------------------------------------------------------------------ identical trials: a warning


@pytest.mark.parametrize("space,search,key", [
    ({}, {"algorithm": "random", "num_trials": 4}, "search.num_trials"),
    ({}, {"algorithm": "nsga2", "num_trials": 8}, "search.num_trials"),
    ({"embedding": "sne", "hidden_width": [0.5]}, {"algorithm": "tpe", "num_trials": 3}, "search.num_trials"),
    ({}, {"algorithm": "grid", "repeats": 3}, "search.repeats"),
])
def test_a_spec_of_identical_trials_loads_with_a_warning(caplog, space, search, key):
    with caplog.at_level(logging.WARNING, logger="qkvsearch"):
        spec = load_campaign({**BASE, "space": space, "search": search})
    assert spec.search.num_trials > 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(key) and "one configuration" in warnings[0], warnings


def test_no_warning_for_a_real_space_or_a_single_trial(caplog):
    with caplog.at_level(logging.WARNING, logger="qkvsearch"):
        load_campaign({**BASE, "search": {"algorithm": "random", "num_trials": 4}})
        load_campaign({**BASE, "space": {}, "search": {"algorithm": "random", "num_trials": 1}})
        load_campaign({**BASE, "search": {"algorithm": "grid", "repeats": 2}})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_validate_shows_the_warning(workdir, capsys):
    path = workdir / "same.yaml"
    path.write_text(yaml.safe_dump({**BASE, "space": {}, "search": {"algorithm": "random", "num_trials": 5}}))
    code, out, err = _run(capsys, "validate", str(path))
    assert code == 0, err
    assert f"warning: {path}: search.num_trials: the space holds one configuration" in err
    assert "valid" in out


# ------------------------------------------------------------------ storage and resources before Ray


def test_storage_that_is_a_file_or_under_one_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for storage in (tmp_path / "file", tmp_path / "file" / "results" / "deeper"):
        with pytest.raises(BadInput, match=r"^storage: expected a folder .* is a file\)"):
            check_storage(str(storage))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_storage_under_an_unwritable_folder_is_refused(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(preflight.os, "access",   # root may write anywhere, so the mode is simulated
                        lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    with pytest.raises(BadInput, match="storage: .*locked is not writable"):
        check_storage(str(locked / "a" / "b"))
    assert list(locked.iterdir()) == []


def test_storage_that_can_be_created_or_is_a_uri_passes_and_nothing_is_made(tmp_path):
    check_storage(str(tmp_path / "new" / "deeper"))
    check_storage(str(tmp_path))
    check_storage("s3://bucket/results")
    check_storage("file:///nonexistent/under/anything")
    assert list(tmp_path.iterdir()) == []


def test_launch_refuses_bad_storage_before_ray_starts(workdir, capsys, monkeypatch):
    import qkvsearch.search.campaign.launch as campaign

    def no_ray(*_args, **_kwargs):
        raise AssertionError("Ray must not start for a refused launch")

    monkeypatch.setattr(campaign, "connect", no_ray)
    (workdir / "file").write_text("x")
    code, out, err = _run(capsys, "launch", str(PRESETS / "quickstart.yaml"),
                          "--set", f"storage={workdir / 'file' / 'results'}")
    _refused(code, out, err, "storage")
    assert sorted(p.name for p in workdir.iterdir()) == ["file"]


def test_local_resources_must_fit_one_trial(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(preflight, "cuda_device_count", lambda: 0)
    check_local_resources({"workers_per_trial": 2, "cpus_per_worker": 1, "gpus_per_worker": 0})
    with pytest.raises(ResourceError, match=r"^resources: .*= 4 CPUs, but this machine has 2"):
        check_local_resources({"workers_per_trial": 4, "cpus_per_worker": 1, "gpus_per_worker": 0})
    with pytest.raises(ResourceError, match="= 1 GPUs, but this machine has 0"):
        check_local_resources(load_campaign({**BASE, "resources": {"gpus_per_worker": 1}}).resources)
    assert issubclass(ResourceError, BadInput)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")   # a cluster: its size is Ray's business
    check_local_resources({"workers_per_trial": 64, "cpus_per_worker": 8, "gpus_per_worker": 8})


def test_cuda_device_count_without_torch_reads_dev(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(preflight.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidia1"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert preflight.cuda_device_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert preflight.cuda_device_count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert preflight.cuda_device_count() == 0
    assert "torch" not in sys.modules
