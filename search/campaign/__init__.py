"""A campaign on Ray: ``launch`` (launch and resume), ``driver`` (a Tune trial's function), ``bridge``
(Train's reports into Tune), ``searchers``, ``recording`` (the recorder as a Tune callback),
``interrupts``, ``preflight`` and ``costs`` (the checks made before Ray starts)."""
from qkvsearch.search import _legacy


def __getattr__(name: str):
    return _legacy.attribute(__name__, name)
