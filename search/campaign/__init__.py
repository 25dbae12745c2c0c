"""A campaign on Ray.

    launch, run      the commands launch and resume, and the one run path both take (CampaignRun)
    assemble         the campaign's searcher put together (search.searchers)
    driver, bridge   a Tune trial's function, and Train's reports into Tune
    measured         measured cost, measured in Ray tasks before a proposal becomes a trial
    recording, retention, interrupts, stages, tracking/
                     Tune callbacks: the recorder, what ended trials keep, stop signals, the stages after
                     training, the experiment trackers
    preflight, costs the checks made before Ray starts
    tune_settings    what Tune keeps and writes per trial: the Ray Tune settings a campaign applies
    oneshot/         one-shot search: the supernet's nested campaign, subnets scored on Ray actors, the
                     selection retrained as the campaign's trials
    policies         a quantization policy evaluated on the weights its configuration's trial trained
    front_repeats    once the search ends, the front's configurations trained under more seeds
"""
from qkvsearch import _legacy


def __getattr__(name: str):
    return _legacy.attribute(__name__, name)
