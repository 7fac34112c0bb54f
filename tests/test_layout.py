"""The test suite's own rules: no test module imports another (shared helpers live in
conftest.py and the helper modules beside it: fake_slurm, journal_records, slurm_jobs,
entries)."""

from __future__ import annotations

import ast
import re

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


def _wing_rows() -> dict[str, str]:
    """ARCHITECTURE.md's wing table: each wing's folder (``login``) and its rooms cell."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `hpctf/([a-z_]+)/` \|.*\| ([^|]*) \|$", text, re.M)
    return dict(rows)


def test_the_architecture_table_names_every_room_of_each_wing_and_no_other() -> None:
    """Every folder of a wing (a room) is in its row of ARCHITECTURE.md's table, and every
    room the row names is there: the one-page map cannot drift from the code."""
    rows = _wing_rows()
    assert set(rows) == {"login", "batch", "compute", "core"}, rows
    for wing, cell in rows.items():
        folder = REPO / "hpctf" / wing
        rooms = {p.name for p in folder.iterdir() if p.is_dir() and any(p.glob("*.py"))}
        named = set(re.findall(r"`([a-z_]+)/`", cell))
        modules = set(re.findall(r"`([a-z_]+)`", cell))
        said = f"{wing}: the table names {sorted(named)}, the code has {sorted(rooms)}"
        assert named == rooms, said
        gone = sorted(m for m in modules if not (folder / f"{m}.py").is_file())
        assert not gone, f"{wing}: the table names modules that are not there: {gone}"


def test_every_module_a_docstring_points_to_exists() -> None:
    """``:mod:`hpctf.x.y``` and ``:mod:`.y``` in hpctf's docstrings and comments name modules
    that exist: a room renamed or merged leaves no stale pointer behind."""
    stale = []
    for path in sorted((REPO / "hpctf").rglob("*.py")):
        package = path.parent.relative_to(REPO).as_posix().replace("/", ".")
        for name in re.findall(r":mod:`~?([A-Za-z0-9_.]+)`", path.read_text(encoding="utf-8")):
            dotted = f"{package}{name}" if name.startswith(".") else name
            if not dotted.startswith("hpctf"):
                continue
            where = REPO / dotted.replace(".", "/")
            if not (where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()):
                stale.append(f"{path.relative_to(REPO)}: {name}")
    assert not stale, "\n".join(stale)
