"""Whether a process is still running, as a test that stopped it checks: a killed process that is not the test's
child is ended once it is a zombie (its parent, or init, reaps it later) or gone."""
from __future__ import annotations


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command's name
    except OSError:
        return False
