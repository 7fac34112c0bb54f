"""A worker's standard output and error redacted of the run's secrets.

A rank log is a file others may read (the run directory is shared with a team, Slurm writes
``--output`` with the job's umask). What the user's code prints there -- a ``print`` of a
connection string, an exception's text, a library's warning quoting a token -- passes
:func:`hpctf.core.secrets.redact` like hpctf's own lines. Python-level writes only: what
TensorFlow's C++ writes to the file descriptors directly cannot be seen here.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from hpctf.core.secrets import redact


class RedactedStream:
    """``stream`` with every text written through :func:`redact`; the rest (``fileno``,
    ``flush``, ``isatty``, ``encoding``...) is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)  # what the caller gave: print() and logging check nothing else

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def redact_standard_streams() -> None:
    """From now on, ``sys.stdout`` and ``sys.stderr`` of this process are redacted (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactedStream):
            setattr(sys, name, RedactedStream(stream))
