"""Where a one-shot campaign (search.campaign.oneshot.phases) stands, read from what its phases write: one reader
(`read_phases`) and one wording for the live line, `qkvsearch status` and `qkvsearch watch`.

    supernet    the nested campaign <exp>/supernet/: its one trial's epochs of those it plans; with
                ``supernet.from`` trained in that campaign already
    scoring     the evaluations recorded in qs_inherited/ of search.num_trials (with deployment targets: summed
                over the targets' folders, of search.num_trials per target; selection and retraining alike)
    selection   qs_inherited/selection.json: the chosen and control subnets
    retraining  the campaign's own trials (qs_trials/) ended, of those the selection plans

A phase is done once a later one has begun (its records exist), so a folder an earlier version wrote, or one
whose nested supernet folder is gone, still reads as far as its records go. The scored count is every
evaluation recorded, the control sample's included once selected: what the report counts as scored. What the
folders lack or hold damaged (search.records.inherited.read_folders) is named in ``problems``.
"""
from __future__ import annotations

from dataclasses import dataclass

from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import TUNER_FILE, is_one_shot
from qkvsearch.search.records.layout import CAMPAIGN_FILE, FINAL_STATUSES, CampaignFileError, open_campaign
from qkvsearch.search.records.lease import read_lease
from qkvsearch.search.records.readers import read_trials
from qkvsearch.storage import exists

PHASES = ("supernet", "scoring", "selection", "retraining")
DONE = "done"  # every phase done: the driver recorded its end, or every training it planned ended


@dataclass(frozen=True)
class OneShotPhases:
    """A one-shot campaign's phases as its folder records them (``read_phases``)."""

    phase: str                        # one of PHASES, or DONE
    supernet_epochs: int = 0          # epochs its trial recorded
    supernet_planned: int | None = None  # None: its nested campaign not written yet
    supernet_status: str | None = None   # its trial's status; None: no trial recorded
    supernet_source: str | None = None   # ``supernet.from``: trained there
    scored: int = 0                   # evaluations recorded
    to_score: int | None = None       # search.num_trials
    chosen: int | None = None         # None: nothing selected yet
    control: int | None = None
    retrained: int = 0                # retraining trials ended (a final status)
    to_retrain: int | None = None     # trainings the selection plans; None: nothing selected yet
    problems: tuple[str, ...] = ()    # "<file>: expected ..., given ...": records missing or damaged

    def begun(self, phase: str) -> bool:
        return self.phase == DONE or PHASES.index(phase) <= PHASES.index(self.phase)

    def finished(self, phase: str) -> bool:
        return self.phase == DONE or PHASES.index(phase) < PHASES.index(self.phase)

    def texts(self) -> dict[str, str]:
        """Phase -> its progress in words, for every phase (one to come says so)."""
        return {"supernet": self._supernet(), "scoring": self._scoring(), "selection": self._selection(),
                "retraining": self._retraining()}

    def summary(self) -> str:
        """The live line's part: the phases begun so far, the current one last, and the retraining's size once
        the selection is known."""
        texts = self.texts()
        shown = "; ".join(texts[p] for p in PHASES if self.begun(p) or (p == "retraining" and self.to_retrain))
        return shown + (f"; {len(self.problems)} record(s) missing or damaged (`qkvsearch status` names them)"
                        if self.problems else "")

    def lines(self) -> list[str]:
        """`qkvsearch status`: the phase, then one line per phase."""
        return [f"one-shot phase: {self.phase}"] + [f"  {text}" for text in self.texts().values()] \
            + [f"  missing or damaged record {p}" for p in self.problems]

    def bars(self) -> list[tuple[str, int, int, str]]:
        """`watch`'s progress bars: (label, done, total, text) of the supernet, the scoring and the retraining."""
        texts = self.texts()
        rows = []
        for label, phase, done, total in (("supernet", "supernet", self.supernet_epochs, self.supernet_planned),
                                          ("scored", "scoring", self.scored, self.to_score),
                                          ("retrained", "retraining", self.retrained, self.to_retrain)):
            total = max(total or 0, done, 1)
            rows.append((label, total if self.finished(phase) else done, total, texts[phase]))
        return rows

    def _supernet(self) -> str:
        if self.supernet_source is not None:
            return f"supernet taken from {self.supernet_source}"
        of = f"{self.supernet_epochs} of {_count(self.supernet_planned)}"
        if self.finished("supernet"):
            return f"supernet done: {of} epochs" if self.supernet_epochs else "supernet done"
        if self.supernet_planned is None:
            return "supernet not started"
        if self.supernet_status in FINAL_STATUSES and self.supernet_status != "completed":
            return f"supernet {self.supernet_status} at epoch {of}"
        return f"supernet epoch {of}"

    def _scoring(self) -> str:
        if self.finished("scoring"):
            return f"scoring done: {self.scored} subnets scored"
        return f"subnets scored {self.scored} of {_count(self.to_score)}"

    def _selection(self) -> str:
        if self.chosen is None:
            return "selection to come"
        return f"selected {self.chosen} chosen and {self.control} control subnet(s)"

    def _retraining(self) -> str:
        if not self.begun("retraining"):
            return "retraining to come" if self.to_retrain is None else f"retraining 0 of {self.to_retrain}"
        if self.phase == DONE:
            return f"retraining done: {self.retrained} of {_count(self.to_retrain)}"
        return f"retraining {self.retrained} of {_count(self.to_retrain)}"


def read_phases(exp, campaign=None, records: list[dict] | None = None) -> OneShotPhases | None:
    """The one-shot campaign at ``exp`` now; None for a campaign of trials. campaign: its Campaign, records: its
    trial records, when read already."""
    campaign = campaign if campaign is not None else open_campaign(exp)
    if not is_one_shot(campaign):
        return None
    root = str(exp).rstrip("/")
    targets = getattr(campaign.spec, "targets", ()) or ()
    read = inherited.read_folders(root, campaign, driver_live=read_lease(root).live)
    scored = sum(read.scored.values())
    if targets:   # each target scores, selects and retrains in its own folder: the campaign's sums
        folders = [inherited.target_dir(root, t.name) for t in targets]
        retrains = [f for t, f in zip(targets, folders) if t.retrain]
        records = [r for f in retrains if exists(f"{f}/{CAMPAIGN_FILE}") for r in read_trials(f).records]
        selections = [read.selections.get(f) for f in folders]
        selection = None if None in selections else {
            role: [k for sel in selections for k in sel.get(role) or []] for role in ("chosen", "control")}
        planned = [_planned(read.selections.get(f)) for f in retrains]
        to_retrain = None if selection is None or None in planned else sum(planned)
        retraining = bool(records) or any(exists(f"{f}/{TUNER_FILE}") for f in retrains)
    else:
        records = records if records is not None else read_trials(root).records
        selection = read.selections[root]
        retraining = bool(records) or exists(f"{root}/{TUNER_FILE}")
        to_retrain = _planned(selection)
    retrained = sum(1 for r in records if r.get("status") in FINAL_STATUSES)
    # done: the driver recorded its end, or (its driver stopped before it could) every planned training ended
    if campaign.ended or (to_retrain is not None and len(records) >= to_retrain and retrained >= to_retrain):
        phase = DONE
    elif retraining:
        phase = "retraining"
    elif selection is not None:
        phase = "selection"
    elif scored:
        phase = "scoring"
    else:
        phase = None   # the supernet's, unless it is taken from another campaign
    source = campaign.spec.supernet.source if campaign.spec.supernet else None
    supernet = _supernet(f"{root}/{inherited.SUPERNET_DIR}") if source is None else (0, None, None)
    if phase is None:
        phase = "scoring" if source is not None or supernet[2] == "completed" else "supernet"
    return OneShotPhases(
        phase=phase, supernet_epochs=supernet[0], supernet_planned=supernet[1], supernet_status=supernet[2],
        supernet_source=source, scored=scored,
        to_score=None if campaign.trials_planned is None else campaign.trials_planned * max(1, len(targets)),
        chosen=_length(selection, "chosen"), control=_length(selection, "control"),
        retrained=retrained, to_retrain=to_retrain, problems=read.problems)


def _supernet(folder: str) -> tuple[int, int | None, str | None]:
    """(epochs recorded, epochs planned, its trial's status) of the nested campaign training the supernet;
    (0, None, None) before it is written, or where it cannot be read (the rest of the campaign still shows)."""
    if not exists(f"{folder}/{CAMPAIGN_FILE}"):
        return 0, None, None
    try:
        nested = open_campaign(folder)
    except CampaignFileError:
        return 0, None, None
    read = read_trials(folder)
    if not read.records:
        return 0, nested.epochs_planned, None
    record, epochs = read.records[0], read.epoch_counts()[0]   # its one trial
    planned = record.get("epochs_planned") or nested.epochs_planned
    status = record.get("status")
    return int(epochs), int(planned) if planned else None, None if status is None else str(status)


def _planned(selection: dict | None) -> int | None:
    """The trainings a selection plans (search.records.inherited.retrained_variants); None: nothing selected,
    or a selection this version cannot read."""
    if selection is None:
        return None
    try:
        return len(inherited.retrained_variants(selection))
    except (KeyError, TypeError, AttributeError):
        return None


def _length(selection: dict | None, role: str) -> int | None:
    value = (selection or {}).get(role)
    return len(value) if isinstance(value, list) else None


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)
