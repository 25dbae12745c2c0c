"""Standard output while a command runs (search.cli): one that takes no more, a closed pipe (`| head`), a full
disk (`> /dev/full`), a process started with its stdout closed, ends the command with one line instead of a
traceback, and nothing else the command did (records, reports) is lost.
"""
from __future__ import annotations

import errno
import os
import sys


class OutputFailed(Exception):
    """Standard output took no more: what the command had to say is lost, nothing else."""


class GuardedStdout:
    """sys.stdout while a command runs: the first write or flush that fails raises OutputFailed (the command
    stops: nobody reads what it prints) and is kept in ``failed``; the writes after it are dropped (a log
    line, the interpreter's last flush). Everything else is the stream's own."""

    def __init__(self, stream):
        self.stream, self.failed = stream, None

    def write(self, text: str) -> int:
        return self._guard("write", text)

    def flush(self) -> None:
        self._guard("flush")

    def _guard(self, method: str, *args):
        if self.failed is not None:
            return 0
        try:
            if self.stream is None:  # the process was started with its stdout closed
                raise OSError(errno.EBADF, "standard output is closed")
            return getattr(self.stream, method)(*args)
        except OSError as err:  # BrokenPipeError, ENOSPC, EIO
            self.failed = err
            raise OutputFailed(err) from None

    def silence(self) -> None:
        """Point the process's real stdout at /dev/null, so that the interpreter's last flush of what is still
        buffered neither fails nor prints a traceback (a stream other than the process's own: nothing to do)."""
        if self.stream is None or self.stream is not sys.__stdout__:
            return
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)
