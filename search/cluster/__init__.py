"""The Ray cluster a campaign runs on: ``local_ray`` (start and stop a local Ray), ``capacity`` (what fits,
autoscalers), ``jobs`` (the dashboard's Jobs page), ``ray_private`` (every use of Ray's private API)."""
