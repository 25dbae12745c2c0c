"""A campaign on Ray.

    launch, run      the commands launch and resume, and the one run path both take (CampaignRun)
    assemble         the campaign's searcher put together (search.searchers)
    driver, bridge   a Tune trial's function, and Train's reports into Tune
    measured         measured cost, measured in Ray tasks before a proposal becomes a trial
    recording, retention, interrupts, stages, tracking/
                     Tune callbacks: the recorder, what ended trials keep, stop signals, the stages after
                     training, the experiment trackers
    preflight, costs the checks made before Ray starts
"""
from qkvsearch.search import _legacy


def __getattr__(name: str):
    return _legacy.attribute(__name__, name)
