"""The campaign's records (the lowest layer of ``qkvsearch.search``): ``layout`` (files, statuses,
reserved keys, the campaign file's reader), ``epochs_csv`` (the per-trial epochs file), ``readers``
(``read_trials``), ``recorder`` (their only writer). Loads neither Ray nor torch."""
from qkvsearch import _legacy


def __getattr__(name: str):
    return _legacy.attribute(__name__, name)
