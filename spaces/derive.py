"""Campaigns made from another, the one way: the campaign's file without some sections, with others set, read
back by the loader as a file is (so a derived campaign is checked, and stored, as any other). A one-shot
campaign derives three (search.campaign.oneshot): the one that trains its supernet, the one each deployment
target searches in, and the one its chosen subnets retrain in.

    derived(spec, drop=("constraints",), name="x", objectives=[...])   # sections by their file names
    fixed_trainings(spec, variants)   # exactly these trainings, each to its planned epochs: grid + FIFO
"""
from __future__ import annotations

from qkvsearch.spaces.loader import load_campaign
from qkvsearch.spaces.spec import CampaignSpec


def derived(spec: CampaignSpec, *, drop: tuple[str, ...] = (), **sections) -> CampaignSpec:
    """``spec``'s file without the sections ``drop`` names and with ``sections`` (file name -> its whole value, as a
    campaign file writes it) in their place, loaded."""
    d = spec.to_dict()
    for name in drop:
        d.pop(name, None)
    d.update(sections)
    return load_campaign(d)


def fixed_trainings(spec: CampaignSpec, variants: list[dict], *, drop: tuple[str, ...] = (),
                    **sections) -> CampaignSpec:
    """A campaign that trains ``variants`` (space keys; {} and [] alike: the spec's fixed keys) and nothing
    else, every one to its planned epochs whatever the spec's scheduler: a grid over them under the spec's search
    seed, FIFO. ``drop``, ``sections``: as ``derived``."""
    space = {"variants": [dict(v) for v in variants]} if any(variants) else {}
    return derived(spec, drop=drop, space=space, search={"algorithm": "grid", "seed": spec.search.seed},
                   scheduler={"type": "fifo"}, **sections)
