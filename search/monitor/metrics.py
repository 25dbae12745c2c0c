"""Campaign metrics for Prometheus and the Ray dashboard's Metrics page, made with `ray.util.metrics`.

Ray's metrics agent on each node exports them with a ``ray_`` prefix (``ray_qkvsearch_trials``...);
every one is tagged with the campaign's name. `CampaignMetrics.show(progress)` sets them from a
`progress.Progress` snapshot; `monitor.CampaignMonitor` calls it while the campaign's driver runs.
The shipped Grafana dashboard (`search/grafana.py`) queries exactly the names in `METRICS`.
"""
from __future__ import annotations

from qkvsearch.search.monitor.progress import Progress
from qkvsearch.search.records.layout import STATUSES

# name -> (description, tag keys besides "campaign"); exported as ray_<name>
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "qkvsearch_trials": ("trials of the campaign by status", ("status",)),
    "qkvsearch_trials_planned": ("trials the campaign plans", ()),
    "qkvsearch_epochs_completed": ("epochs trained over all trials", ()),
    "qkvsearch_epochs_planned": ("epochs the campaign plans over all trials", ()),
    "qkvsearch_best": ("best value of each objective among completed trials", ("objective",)),
    "qkvsearch_front_size": ("trials on the completed accuracy-cost front", ()),
    "qkvsearch_hypervolume": ("hypervolume of the completed front against the campaign's fixed reference "
                              "(qs_hv_reference.json), named by the tag reference", ("reference",)),
    "qkvsearch_trial_images_per_s": ("training images/s of each trial's last epoch, all workers", ("trial",)),
    "qkvsearch_trial_startup_s": ("seconds from a trial's start to its first training step", ("trial",)),
}


class CampaignMetrics:
    """One Gauge per metric of METRICS, tagged campaign=<name>."""

    def __init__(self, campaign: str):
        from ray.util.metrics import Gauge

        self.campaign = campaign
        self.gauges = {name: Gauge(name, description=doc, tag_keys=("campaign", *tags))
                       for name, (doc, tags) in METRICS.items()}

    def show(self, p: Progress) -> None:
        self._set("qkvsearch_trials_planned", p.trials_planned)
        for status in STATUSES:  # zeros too: a panel shows a status's count from the start
            self._set("qkvsearch_trials", p.counts.get(status, 0), status=status)
        self._set("qkvsearch_epochs_completed", p.epochs_done)
        self._set("qkvsearch_epochs_planned", p.epochs_planned)
        for metric, value in p.best.items():
            self._set("qkvsearch_best", value, objective=metric)
        self._set("qkvsearch_front_size", len(p.front))
        if p.hypervolume is not None:
            self._set("qkvsearch_hypervolume", p.hypervolume, reference=p.reference)
        for trial, v in p.images_per_s.items():
            self._set("qkvsearch_trial_images_per_s", v, trial=trial)
        for trial, v in p.startup_s.items():
            self._set("qkvsearch_trial_startup_s", v, trial=trial)

    def close(self) -> None:
        """Nothing to release: the last values stay exported until the driver exits."""

    def _set(self, name: str, value: float, **tags) -> None:
        self.gauges[name].set(float(value), tags={"campaign": self.campaign, **tags})
