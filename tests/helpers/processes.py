"""Whether a process is still running, as a test that stopped it checks (the rule static export waits on: a killed
process that is not the test's child has ended once it is a zombie or gone)."""
from qkvsearch.search.analysis.static_export import process_running as running  # noqa: F401
