"""Watching a campaign: ``progress`` (a snapshot from the records), ``oneshot_phases`` (a one-shot campaign's
phases), ``terminal``, ``metrics`` (Ray's metrics agent), ``grafana``, ``status``, ``watch`` (the polling loop).
Loads neither Ray nor torch on import."""
