"""The test suite's own rules: no test module imports another (shared helpers live in
conftest.py and the helper modules beside it: fake_slurm, journal_records, slurm_jobs,
entries)."""

from __future__ import annotations

import ast

from tests.conftest import REPO


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.name}:{node.lineno}: {name}"
                for name in names
                if name.startswith("tests.test_")
            ]
    assert not found, "move what is shared into tests/conftest.py or a helper:\n" + "\n".join(found)


def test_the_layout_page_names_every_room_and_no_room_that_is_gone() -> None:
    """docs/reference/layout.md is the map of hpctf/: every module and folder of the package
    is named there (in backticks: `rundir`, `history/`, `cli.py`), and every folder it names
    (`name/`) exists. A room added or moved without the map fails here."""
    import re

    text = (REPO / "docs" / "reference" / "layout.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\.py|/)?`", text))
    package = REPO / "hpctf"
    rooms = [
        p for p in package.rglob("*")
        if "__pycache__" not in p.parts
        and ((p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or p.is_dir())
        and not (p.is_dir() and not any(p.glob("*.py")))
    ]  # fmt: skip
    unnamed = sorted(str(p.relative_to(REPO)) for p in rooms if p.stem not in named)
    assert not unnamed, f"not on docs/reference/layout.md: {unnamed}"
    folders = set(re.findall(r"`([a-z_]+)/`", text))
    present = {p.name for p in [*package.rglob("*"), *REPO.iterdir()] if p.is_dir()}
    assert folders <= present, f"named on layout.md, not there: {sorted(folders - present)}"
