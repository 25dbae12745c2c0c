"""What several test files share: ``campaign_files`` (campaign folders written without training),
``live_campaign`` (a ``qkvsearch`` command in its own process with its own Ray), ``browser`` (headless
Chromium). Test files import helpers from here only, never from each other."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root
PRESETS = REPO / "spaces" / "presets"
