"""Shared fixtures. Ray is started once per test session, on loopback, and shut down at the end."""
import os

# Train's controller polls workers every 2 s by default: each report would arrive ~2 s late.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu run where CUDA is present and are skipped, saying so, elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 CPUs and one trial slot (the campaign layer's concurrency cap)."""
    import ray

    from qkvsearch.search.campaign import start_local_ray

    if not ray.is_initialized():
        start_local_ray(trial_slots=1, num_cpus=2)
    yield ray
    ray.shutdown()
