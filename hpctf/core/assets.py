"""Where the shipped templates/ and site_configs/ are.

In a wheel they are package data (``hpctf/templates``); in a source checkout or an editable
install they sit at the repository root beside the package.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # hpctf/, above core/


def shipped_dir(name: str) -> Path:
    """Return the directory of shipped assets ``name`` ("templates" or "site_configs")."""
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"hpctf is installed without its {name}/ directory")
