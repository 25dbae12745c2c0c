"""The distribution: one import name, the reference points as package data, timm registration on import."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from helpers import REPO


@pytest.mark.slow
def test_the_wheel_ships_one_import_name_and_the_reference_points(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in tracked.stdout.split():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(src)], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("qkvsearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"qkvsearch"}
    assert not top & {"search", "spaces", "trainers"}
    for member in ("qkvsearch/__init__.py", "qkvsearch/storage.py", "qkvsearch/search/cli.py",
                   "qkvsearch/search/records/readers.py", "qkvsearch/search/simulation/replay.py",
                   "qkvsearch/spaces/keys.py",
                   "qkvsearch/trainers/model/models.py", "qkvsearch/reference/sne_paper_imagenet.csv",
                   "qkvsearch/spaces/presets/quickstart.yaml"):
        assert member in names, member


def test_import_qkvsearch_alone_registers_the_models_in_timm_and_stays_light(tmp_path):
    """...and timm loads without W&B (qkvsearch.TIMM_OPTIONAL_SKIPPED): W&B makes no temp folder (one that a
    process ending without its exit handlers, as a Ray worker does, would leave behind); W&B still imports
    where it is asked for."""
    code = ("import importlib.util, os, sys, qkvsearch\n"
            "light = not {'torch', 'timm'} & set(sys.modules)\n"
            "import timm\n"
            "m = timm.create_model('qkv_xcit_nano_12_p16_224', embedding='fsne', code_size=8, img_size=32,"
            " num_classes=10)\n"
            "made = [n for n in os.listdir(os.environ['TMPDIR']) if 'wandb' in n]\n"  # (torch keeps a cache there)
            "print(light, m.qkv_config['width'], m.qkv_config['code_size'], qkvsearch.build_model.__name__,"
            " 'wandb' in sys.modules, made)\n"
            "if importlib.util.find_spec('wandb'):\n"  # installed by [dev]: the tracker's own import still works
            "    import wandb\n"
            "    print(wandb.Settings.__name__)\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/",
                         env={**os.environ, "TMPDIR": str(temp)})
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["True", "128", "8", "build_model", "False", "[]"]
    assert lines[1:] == (["Settings"] if importlib.util.find_spec("wandb") else [])


def test_the_report_reads_the_reference_points_as_package_data():
    from qkvsearch.search.analysis.paper_table import PAPER_CSV

    assert PAPER_CSV.is_file() and "xcit" in PAPER_CSV.read_text().lower()
