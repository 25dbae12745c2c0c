"""Trial configs written before some of today's keys existed, read as what they meant: ``upgraded``.

A campaign folder keeps the configs of its time: in its trial records, in Tune's saved trials, in its
searcher's saved state and in every checkpoint. A key added since is absent from them, and its absence means
what the code did before the key existed: ``Key.before`` (spaces.keys), declared once beside the key, which is
its default unless a key says otherwise. Every reader of a stored config (a resumed trial, a restored
checkpoint, a record, a searcher's saved proposals) upgrades it here, so an earlier config and today's of
the same training compare equal, and have one identity.
"""
from __future__ import annotations

from collections.abc import Mapping

from qkvsearch.spaces.keys import DEFAULT, KEYS, not_applicable

__all__ = ["upgraded"]


def upgraded(cfg: Mapping) -> dict:
    """``cfg`` with each key it lacks set to the value that key had before it existed, or null where it does not
    apply to the config (fill's rule: e.g. ``attention`` for an XCiT). A key it holds is kept as it is, so a
    config of today's is returned unchanged (a copy); neither is checked (``fill`` checks)."""
    out = dict(cfg)
    if KEYS.keys() <= out.keys():   # written since every key existed: the common case, read at every record
        return out
    for key in KEYS.values():   # in declaration order: the key deciding whether another applies comes first
        if key.name not in out:
            out[key.name] = None if not_applicable(key, out) else key.default if key.before == DEFAULT else key.before
    return out
