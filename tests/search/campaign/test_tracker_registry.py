"""Contract tests over the tracker registry (spaces.tracking.TRACKERS): each row names a tracker class that
exists under that name, an extra that pyproject.toml declares and `[dev]` installs, packages that extra
installs, and settings the campaign file accepts with their defaults."""
import importlib.util

import pytest
import tomllib
from helpers import REPO

from qkvsearch.search.campaign.tracking import tracker_class
from qkvsearch.search.campaign.tracking.base import Tracker
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.tracking import TRACKERS

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_every_tracker_row_is_a_tracker_its_extra_installs(name):
    row = TRACKERS[name]
    cls = tracker_class(name)
    assert issubclass(cls, Tracker) and cls.name == name
    assert row.extra in PYPROJECT and any("qkvsearch[" in d and row.extra in d for d in PYPROJECT["dev"])
    assert all(importlib.util.find_spec(m) is not None for m in row.modules)  # [dev] installed them
    assert row.location is None or row.location in row.settings


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_every_tracker_takes_its_settings_from_the_campaign_file(name, tmp_path):
    spec = load_campaign({"name": "t", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16},
                          "train": {"epochs": 1}, "storage": str(tmp_path), "tracking": {name: {}}},
                         check_names=False)
    assert dict(spec.tracking[name]) == dict(TRACKERS[name].settings)
