"""A one-shot campaign's phases in the live line, `qkvsearch status` and `qkvsearch watch`, read from folders
written as each phase leaves them (no Ray, no training): the nested supernet campaign, the scored subnets, the
selection, the retrained trials."""
import io
import json
import os
import time

import numpy as np
import pytest
from helpers.campaign_files import SPEC, synthetic_record, write_campaign, write_record
from helpers.views import Recorder

from qkvsearch.search.cli import EXIT_OK, main
from qkvsearch.search.monitor.oneshot_phases import read_phases
from qkvsearch.search.monitor.progress import read_progress
from qkvsearch.search.monitor.terminal import TerminalView
from qkvsearch.search.records import inherited
from qkvsearch.search.records.layout import ENDED_KEY

SUBNETS, SUPERNET_EPOCHS = 6, 3
ONESHOT = dict(SPEC, supernet={"train": {"epochs": SUPERNET_EPOCHS}},
               search={"algorithm": "random", "num_trials": SUBNETS, "seed": 0})
NESTED = dict(SPEC, train=dict(SPEC["train"], epochs=SUPERNET_EPOCHS), search={"algorithm": "grid"})
SUPERNET_DONE = f"oneshot: supernet done: {SUPERNET_EPOCHS} of {SUPERNET_EPOCHS} epochs"
SELECTED = f"{SUPERNET_DONE}; scoring done: 7 subnets scored; selected 1 chosen and 1 control subnet(s)"
# phase -> (the phase `status` names, the live line's start)
EXPECTED = {
    "not started": ("supernet", "oneshot: supernet not started"),
    "supernet": ("supernet", "oneshot: supernet epoch 1 of 3"),
    "scoring": ("scoring", f"{SUPERNET_DONE}; subnets scored 4 of {SUBNETS}"),
    "selection": ("selection", f"{SELECTED}; retraining 0 of 3"),
    "retraining": ("retraining", f"{SELECTED}; retraining 1 of 3 (1 completed, 1 running); epochs 9/18; front 1"),
    "done": ("done", f"{SELECTED}; retraining done: 3 of 3 (3 completed); epochs 18/18; front"),
}


def _mark_ended(exp) -> None:
    path = os.path.join(exp, "qs_campaign.json")
    campaign = json.loads(open(path).read())
    campaign[ENDED_KEY] = time.time()
    open(path, "w").write(json.dumps(campaign))


def _supernet(exp, status: str, ended: bool = False) -> None:
    """The nested campaign <exp>/supernet with its one trial in ``status`` (running: 1 of 3 epochs)."""
    write_campaign(os.path.join(exp, "supernet"), [status], spec=NESTED, epochs_planned=SUPERNET_EPOCHS,
                   name="supernet")
    if ended:
        _mark_ended(os.path.join(exp, "supernet"))


def _scored(exp, batch: int, ids: range) -> None:
    inherited.write_batch(exp, batch, [{"subnet_id": f"subnet_{i:06d}", "keys": {"embedding": i}, "config": {},
                                        "cost": {}, "metrics": {"top1": 40.0 + i}, "supernet": "s", "space": "h"}
                                       for i in ids])


def one_shot_folder(exp: str, phase: str, spec: dict = ONESHOT) -> str:
    """A one-shot campaign's folder as its driver leaves it in ``phase`` (a key of EXPECTED)."""
    order = list(EXPECTED)
    reached = order.index(phase)
    write_campaign(exp, [], spec=spec, name="oneshot")
    if reached >= order.index("supernet"):
        _supernet(exp, "running" if phase == "supernet" else "completed", ended=phase != "supernet")
    if reached >= order.index("scoring"):
        _scored(exp, 0, range(4))
    if reached >= order.index("selection"):   # the search's last 2, then the control subnet, scored after it
        _scored(exp, 1, range(4, SUBNETS))
        inherited.write_selection(exp, {"chosen": [{"embedding": 5}], "control": [{"embedding": 6}], "seed": 0,
                                        "retrain_from": "scratch"})
        _scored(exp, 2, range(SUBNETS, SUBNETS + 1))
    if reached >= order.index("retraining"):  # 1 chosen + 1 control under two seeds: 3 trainings
        rng = np.random.default_rng(0)
        statuses = ["completed", "running"] if phase == "retraining" else ["completed"] * 3
        for i, status in enumerate(statuses):
            write_record(exp, synthetic_record(i, status, rng=rng, campaign="oneshot"))
    if phase == "done":
        _mark_ended(exp)
    return exp


@pytest.mark.parametrize("phase", list(EXPECTED))
def test_each_phase_shows_in_the_live_line_status_and_watch(tmp_path, capsys, phase):
    exp = one_shot_folder(str(tmp_path / "oneshot"), phase)
    named, line = EXPECTED[phase]
    progress = read_progress(exp)
    assert progress.summary().startswith(line), progress.summary()
    assert progress.oneshot.phase == named and progress.ended == (phase == "done")  # watch goes on until the end
    # the retraining's trials, not the subnets scored, are the campaign's trials
    assert progress.trials_planned == (3 if phase in ("selection", "retraining", "done") else 0)

    out = io.StringIO()  # the live line as a running campaign prints it (plain output)
    view = TerminalView(out, live=False)
    view.show(progress)
    assert any(printed.startswith(line) for printed in out.getvalue().splitlines()), out.getvalue()

    assert main(["status", exp]) == EXIT_OK
    status = capsys.readouterr().out.splitlines()
    at = status.index(f"one-shot phase: {named}")
    assert status[at + 1:at + 5] == [f"  {text}" for text in progress.oneshot.texts().values()]

    assert main(["watch", exp, "--once"]) == EXIT_OK  # after its driver's line
    assert any(printed.startswith(line) for printed in capsys.readouterr().out.splitlines())


def test_the_status_lines_name_every_phase_those_to_come_included(tmp_path, capsys):
    exp = one_shot_folder(str(tmp_path / "oneshot"), "scoring")
    assert main(["status", exp]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.endswith("0 trial(s): \none-shot phase: scoring\n  supernet done: 3 of 3 epochs\n"
                        f"  subnets scored 4 of {SUBNETS}\n  selection to come\n  retraining to come\n")


def test_watch_on_a_terminal_draws_a_bar_per_phase(tmp_path):
    exp = one_shot_folder(str(tmp_path / "oneshot"), "retraining")
    out = io.StringIO()
    view = TerminalView(out, live=True)
    view.show(read_progress(exp))
    view.close()
    text = out.getvalue()
    assert "retraining" in text and "supernet" in text and "scored" in text and "retrained" in text
    assert "retraining 1 of 3" in text and "trials " not in text  # the phases' bars instead of the trials'


def test_a_supernet_taken_from_another_campaign_starts_at_the_scoring(tmp_path):
    spec = dict(ONESHOT, supernet={"from": "results/earlier-oneshot"})
    exp = one_shot_folder(str(tmp_path / "oneshot"), "not started", spec=spec)
    p = read_progress(exp)
    assert p.oneshot.phase == "scoring" and not p.ended
    assert p.summary() == f"oneshot: supernet taken from results/earlier-oneshot; subnets scored 0 of {SUBNETS}"


def test_a_supernet_whose_training_failed_says_so(tmp_path):
    exp = one_shot_folder(str(tmp_path / "oneshot"), "not started")
    _supernet(exp, "failed", ended=True)
    p = read_progress(exp)
    assert p.oneshot.phase == "supernet" and p.summary() == "oneshot: supernet failed at epoch 1 of 3"


def test_a_folder_written_before_reads_as_far_as_its_records_go(tmp_path):
    """An earlier version's folder: a selection without retrain_from, evaluations without selected_for, no end
    recorded, and its nested supernet folder gone: every trial ended reads as done."""
    exp = one_shot_folder(str(tmp_path / "oneshot"), "done")
    for name in os.listdir(os.path.join(exp, "supernet", "qs_trials")):
        os.remove(os.path.join(exp, "supernet", "qs_trials", name))
    os.remove(os.path.join(exp, "supernet", "qs_campaign.json"))
    inherited.write_selection(exp, {"chosen": [{"embedding": 5}], "control": [{"embedding": 6}], "seed": 0})
    path = os.path.join(exp, "qs_campaign.json")
    campaign = json.loads(open(path).read())
    del campaign[ENDED_KEY]
    open(path, "w").write(json.dumps(campaign))
    p = read_progress(exp)
    assert p.ended and p.oneshot.phase == "done"
    assert p.summary().startswith("oneshot: supernet done; scoring done: 7 subnets scored; selected 1 chosen and "
                                  "1 control subnet(s); retraining done: 3 of 3 (3 completed)")


def test_a_campaign_of_trials_shows_no_phase(tmp_path, capsys):
    write_campaign(tmp_path, ["completed", "running"])
    assert read_phases(str(tmp_path)) is None and read_progress(tmp_path).oneshot is None
    assert read_progress(tmp_path).summary().startswith("synth: 1/2 trials done (1 completed, 1 running); epochs")
    assert main(["status", str(tmp_path)]) == EXIT_OK
    assert "one-shot" not in capsys.readouterr().out


def test_the_driver_shows_its_view_the_phases_before_the_retraining(tmp_path):
    from qkvsearch.search.campaign.oneshot.phases import _watched

    exp = one_shot_folder(str(tmp_path / "oneshot"), "supernet")
    view = Recorder()
    with _watched(exp, view):
        pass
    assert view.closed and view.seen[-1].summary() == "oneshot: supernet epoch 1 of 3"
    with _watched(exp, None):  # no view (a nested or quiet run): nothing watches
        pass
