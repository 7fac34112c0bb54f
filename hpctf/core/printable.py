"""Text from a run (its journal, config, summary lines) made safe to print on a terminal.

A run directory is data its owner controls, and others print it (``hpctf status``, ``runs``,
``logs``, error lines): an escape sequence or a carriage return in a journal entry would
rewrite what another user's terminal shows, and a bidirectional override would reorder it.
Every such character is shown as its escape (``\\x1b``, ``\\r``, ``\\u202e``) instead.
"""

from __future__ import annotations

import re

# C0 controls but the line break, DEL, C1 controls, and Unicode's bidirectional controls.
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, keep_lines: bool = True) -> str:
    """``text`` with every control character escaped; line breaks kept with ``keep_lines``
    (a table, a report), else escaped too (one line)."""
    text = _UNSAFE.sub(_escape, text)
    return text if keep_lines else text.replace("\n", "\\n")
