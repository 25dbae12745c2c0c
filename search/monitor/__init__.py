"""Watching a campaign: ``progress`` (a snapshot from the records), ``terminal``, ``metrics`` (Ray's metrics
agent), ``grafana``, ``status``, ``watch`` (the polling loop). Loads neither Ray nor torch on import."""
