"""docs/pages/extending.md's extension table is true: each kind of extension below is added as its row says, and
nothing else in the project is told of it. The project is laid out once with the toys' rows in its spaces/ (each
row inserted where the table says, as a user would write it), and the toys (tests/toys/) go through a campaign's
parser, proposals, scheduler, measurement settings and a training epoch, and a replay, in a process of its own
(tests/toys/run_toys.py). The q/k/v embedding's row has its own toy: tests/trainers/test_toy_embedding.py.

    a field of a campaign-file section   a Field row in spaces/measure.py MEASURE_FIELDS
    a searcher                           its class (tests/toys/toy_searcher.py), its row in spaces/search_options.py
                                         SEARCHERS
    a trial scheduler, with an option    its builder (tests/toys/toy_scheduler.py), its row in spaces/sections.py
                                         SCHEDULERS, its option's in SCHEDULER_FIELDS
    a dataset format                     its reader (tests/toys/toy_dataset.py), its row in spaces/datasets.py
                                         DATASET_INFO
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO

TOYS = REPO / "tests" / "toys"
# file of spaces/ -> (the line a table opens with, the row the toy adds under it)
ROWS = [
    ("measure.py", "MEASURE_FIELDS = table(",
     '    Field("warmup_runs", POS_INT, 3, "timed calls made and discarded before a metric is timed"),'),
    ("search_options.py", "SEARCHERS = {", '    "toy": "toy_searcher:ToySearcher",'),
    ("sections.py", "SCHEDULERS = {", '    "patient": "toy_scheduler:patient",'),
    ("sections.py", "SCHEDULER_FIELDS = table(",
     '    Field("patience", POS_INT, 2, "epochs without a better first objective before a trial stops", '
     'applies=("patient",)),'),
    ("datasets.py", "DATASET_INFO: dict[str, Dataset] = {",
     '    "npz": Dataset(10, 16, True, False, reader="toy_dataset:NPZ"),   # images.npz: x/y of train and val'),
]
PACKAGES = {"search": "search", "trainers": "trainers", "reference": "results/reference"}


def lay_out(into):
    """into/qkvsearch: the package as installed (pyproject.toml's package-dir), its spaces/ a copy with ROWS added."""
    pkg = into / "qkvsearch"
    pkg.mkdir(parents=True)
    for item in (REPO / "search" / "_root").iterdir():
        (pkg / item.name).symlink_to(item)
    for name, folder in PACKAGES.items():
        (pkg / name).symlink_to(REPO / folder)
    shutil.copytree(REPO / "spaces", pkg / "spaces", ignore=shutil.ignore_patterns("__pycache__"))
    for file, opening, row in ROWS:
        path = pkg / "spaces" / file
        text = path.read_text()
        assert text.count(f"\n{opening}\n") == 1, f"spaces/{file}: expected one line {opening!r}"
        path.write_text(text.replace(f"\n{opening}\n", f"\n{opening}\n{row}\n"))


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    shim = tmp_path_factory.mktemp("extended")
    lay_out(shim)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(TOYS)])}
    out = subprocess.run([sys.executable, str(TOYS / "run_toys.py")], env=env, capture_output=True, text=True,
                         timeout=600, cwd=shim)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_section_field_is_one_row(toys):
    field = toys["field"]
    assert field["default"] == 3 and field["parsed"] == field["written"] == field["settings"] == 7
    assert field["round_trip"] and field["reference"]   # read back, and listed in the reference
    assert field["refused"] == ["measure.warmup_runs: expected a positive int, given 0"]


def test_a_searcher_is_its_class_and_its_row(toys):
    searcher = toys["searcher"]
    assert searcher["class"] == "ToySearcher" and searcher["written"] == "toy"
    assert [t for t, _ in searcher["told"]] == ["t0", "t1", "t2"] and [v for _, v in searcher["told"]] == [50, 51, 52]
    assert searcher["replayed"] == 5   # `simulate` drives it too
    assert searcher["refused"][0].startswith("search.algorithm: expected one of toy, grid, random, ")


def test_a_scheduler_with_an_option_of_its_own_is_its_builder_and_two_rows(toys):
    scheduler = toys["scheduler"]
    assert scheduler["class"] == "PatientScheduler" and scheduler["patience"] == 3 and scheduler["metric"] == "top1"
    assert scheduler["round_trip"] and scheduler["reference"]
    # replayed by `simulate` (its default patience, 2): the 4 curves of 12 that fall after epoch 2 stop at epoch 4
    assert scheduler["replay"] == {"trials": 12, "complete": 8, "stopped": 4, "epochs": 8 * 6 + 4 * 4}


def test_a_dataset_format_is_its_reader_and_its_row(toys):
    dataset = toys["dataset"]
    assert dataset["img_size"] == 16 and dataset["num_classes"] == 10   # the row's facts
    assert dataset["epochs"] == 1 and dataset["train_loss"] > 0
    assert dataset["missing"].startswith("data_path: expected a folder holding images.npz")
    assert dataset["no_path"] == ["data.path: required for dataset npz (the dataset's root folder)"]


def test_the_extension_table_names_registries_that_exist():
    """Every `file` `NAME` pair in the table's "register it in" column is a name that file defines."""
    page = (REPO / "docs" / "pages" / "extending.md").read_text()
    rows = [line.split("|")[3] for line in page.splitlines() if line.startswith("| ") and line.count("|") == 4
            and not line.startswith("| to add")]
    assert rows
    for cell in rows:
        for file, names in re.findall(r"`([\w/]+\.py)` ((?:`\w+`(?:, )?)+)", cell):
            text = (REPO / file).read_text()
            for name in re.findall(r"`(\w+)`", names):
                assert re.search(rf"^{name}\b.*=|^(class|def) {name}\b", text, re.M), f"{file} defines no {name}"
