"""What several test files share: ``campaign_files`` (campaign folders written without training),
``live_campaign`` (a ``qkvsearch`` command in its own process with its own Ray), ``trained_supernet`` (a
one-shot campaign trained once per session, and campaigns that take its supernet), ``browser`` (headless
Chromium). Test files import helpers from here only, never from each other."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root
PRESETS = REPO / "spaces" / "presets"

# The model the campaign tests train: XCiT-nano at patch 8 on 16 px digits (4 tokens), cut by its space to 2
# of its 12 blocks (0.9M parameters; its 2 class-attention blocks stay). What the tests check does not
# depend on depth, and 2 blocks train about 4x faster than 12 on the CPUs the suite shares.
TINY_MODEL = "xcit_nano_12_p8_224"
TINY_DEPTH = 2


def tiny_model(img_size: int = 16) -> dict:
    """A campaign file's model section for TINY_MODEL (its space sets the depth: tiny_space)."""
    return {"name": TINY_MODEL, "img_size": img_size, "num_classes": 10}


def tiny_space(space: dict | None = None) -> dict:
    """A campaign file's space section for TINY_MODEL: ``space`` with the depth fixed at TINY_DEPTH."""
    return {"depth": TINY_DEPTH, **(space or {})}
