"""Golden files: a rendered text compared with the one kept under tests/ (tests/golden/ for
single runs, tests/golden-arrays/ for sweeps' and searches' arrays); ``HPCTF_REGENERATE_GOLDEN=1``
writes them anew instead, for a change meant to show there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REGENERATE = bool(os.environ.get("HPCTF_REGENERATE_GOLDEN"))


def check_golden(folder: Path, name: str, text: str) -> None:
    """``text`` is the golden ``folder/name`` (or, regenerating, becomes it)."""
    path = folder / name
    if REGENERATE:
        folder.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.skip(f"regenerated {path.name}")
    assert path.exists(), f"no golden {path.name}: run with HPCTF_REGENERATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} differs from the rendered script; if the change is intended, "
        "regenerate with HPCTF_REGENERATE_GOLDEN=1 and review the diff"
    )
