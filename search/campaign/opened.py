"""The campaign a driver runs, opened once by the command that runs it and passed down whole.

``launch`` makes it from the campaign file (its folder: search.records.layout.experiment_dir), ``resume`` from the
folder it is given; a one-shot campaign opens its nested supernet campaign and its retraining the same way
(search.campaign.oneshot.phases). Not to be confused with search.records.layout.Campaign: qs_campaign.json as
its readers see it.
"""
from __future__ import annotations

from dataclasses import dataclass

from qkvsearch.spaces.spec import CampaignSpec


@dataclass(frozen=True)
class OpenedCampaign:
    """``spec``: the campaign as it runs (a CampaignSpec: the file's, or one a command derived from it);
    ``exp``: its folder, a local path or a bucket URI."""

    spec: CampaignSpec
    exp: str
