"""ARCHITECTURE.md's claims about the package's shape, checked over its source: the wings
import only the core and the core no wing, no two rooms import each other, no function is over
60 lines without saying why, Slurm's commands run only through the one wrapper, and a process
exits only at the CLI's edge and the worker's leaving."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "hpctf"
WINGS = ("login", "batch", "compute")
# The one place each of these may appear (ARCHITECTURE.md, "one place" claims).
SLURM_COMMANDS = {"sbatch", "squeue", "scancel", "scontrol", "sacct", "sinfo", "srun", "sprio"}
# The one wrapper: slurm.py runs every command (run_command), slurm_queries.py builds the
# queries' argv beside it.
SLURM_WRAPPER = "hpctf/core/scheduler/"
EXIT_EDGES = {"hpctf/cli.py", "hpctf/__main__.py", "hpctf/compute/process/leaving.py"}
# A forked child that must not run on when its launcher is gone (os._exit before exec).
CHILD_BEFORE_EXEC = {"hpctf/login/submitting/local.py"}


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path, ast.parse(path.read_text(encoding="utf-8"))


def imported(name: str, path: Path, tree: ast.Module) -> Iterator[tuple[str, int]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno
            # `from hpctf.x import room` names a module too
            yield from ((f"{target}.{alias.name}", node.lineno) for alias in node.names)


def room_of(module: str) -> str | None:
    """hpctf.<wing>.<room> for a module inside a room folder, hpctf.<wing> for a wing's own
    modules, hpctf.<module> for one at the package's top, hpctf for the package itself; None
    outside hpctf."""
    parts = module.split(".")
    if parts[0] != "hpctf":
        return None
    if len(parts) >= 3 and (PACKAGE / parts[1] / parts[2]).is_dir():
        return ".".join(parts[:3])
    # A wing's own modules, and each module at the package's top (cli, api, keras: the CLI's
    # edge and the user's imports are different things), are rooms of their own.
    return ".".join(parts[:2])


def room_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path, tree in modules():
        source = room_of(name)
        for target, line in imported(name, path, tree):
            room = room_of(target)
            if (
                room
                and source
                and room != source
                and (PACKAGE / Path(*room.split(".")[1:])).exists()
            ):
                edges.setdefault((source, room), []).append(f"{path.relative_to(REPO)}:{line}")
    return edges


def test_no_two_rooms_import_each_other() -> None:
    edges = room_edges()
    pairs = [
        f"{a} <-> {b}: {edges[a, b][0]} / {edges[b, a][0]}"
        for a, b in itertools.combinations(sorted({r for e in edges for r in e}), 2)
        if (a, b) in edges and (b, a) in edges
    ]
    assert not pairs, "rooms importing each other:\n" + "\n".join(pairs)


def wing(room: str) -> str:
    parts = room.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_core_imports_no_wing_and_no_wing_another() -> None:
    arrows = [
        f"{where}: {source} -> {target}"
        for (source, target), places in room_edges().items()
        for where in places[:1]
        if wing(source) in (*WINGS, "core")
        and wing(target) in WINGS
        and wing(target) != wing(source)
    ]
    assert not arrows, "imports across wings or up from the core:\n" + "\n".join(arrows)


def test_slurm_commands_run_only_through_the_wrapper() -> None:
    found = []
    for _, path, tree in modules():
        where = str(path.relative_to(REPO))
        if where.startswith(SLURM_WRAPPER):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS:
                    found.append(f"{where}:{node.lineno}: {first.value}")
    assert not found, "Slurm commands outside core/scheduler/:\n" + "\n".join(found)


def exits(tree: ast.AST) -> Iterator[int]:
    """Lines that end the process: sys.exit / os._exit / exit() calls and raise SystemExit."""
    for node in ast.walk(tree):
        call = node.func if isinstance(node, ast.Call) else None
        named = (isinstance(call, ast.Attribute) and call.attr in ("exit", "_exit")) or (
            isinstance(call, ast.Name) and call.id in ("exit", "SystemExit")
        )
        raised = isinstance(node, ast.Raise) and "SystemExit" in ast.dump(node.exc or ast.Pass())
        if named or raised:
            yield node.lineno


def is_command(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A click command: the CLI's edge, where an exit status is the command's answer."""
    return any("command" in ast.dump(decorator) for decorator in function.decorator_list)


def test_a_process_exits_only_at_the_edges() -> None:
    found = []
    for _, path, tree in modules():
        where = str(path.relative_to(REPO))
        if where in EXIT_EDGES | CHILD_BEFORE_EXEC:
            continue
        edge = {
            line
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and is_command(node)
            for line in exits(node)
        }
        found += [f"{where}:{line}" for line in exits(tree) if line not in edge]
    assert not found, (
        "a process exits outside a command, the CLI's edge and the worker's leaving:\n"
        + "\n".join(found)
    )


def test_the_checks_find_what_they_look_for() -> None:
    source = ast.parse(
        "import sys\n"
        "def f():\n    sys.exit(3)\n"
        "@click.command()\ndef g():\n    sys.exit(2)\n"
        "x = ['sbatch', '--parsable']\n"
    )
    assert list(exits(source)) == [3, 6]
    commands = [n for n in ast.walk(source) if isinstance(n, ast.FunctionDef) and is_command(n)]
    assert [c.name for c in commands] == ["g"]
    assert room_of("hpctf.compute.loop.session") == "hpctf.compute.loop"
    assert room_of("hpctf.cli") == "hpctf.cli"
    assert room_of("hpctf") == "hpctf"


@pytest.mark.tf
def test_a_custom_loop_imports_session_from_hpctf_itself() -> None:
    """``from hpctf import Session`` is the public door (examples/custom_loop), and ``import
    hpctf`` alone still imports no TensorFlow."""
    code = (
        "import sys, hpctf\n"
        "assert 'tensorflow' not in sys.modules and 'Session' in hpctf.__all__\n"
        "from hpctf import Session\n"
        "from hpctf.compute.loop import session\n"
        "assert Session is session.Session\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_no_room_imports_the_package_itself() -> None:
    """The package's face (``hpctf/__init__.py``) re-exports the Python API, which imports the
    login wing: a room that imports ``hpctf`` itself draws an arrow back up (the version comes
    from ``hpctf.core.version``)."""
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path, tree in modules()
        if wing(room_of(name) or "") in (*WINGS, "core")
        for target, line in imported(name, path, tree)
        if target == "hpctf" or (target.startswith("hpctf.") and room_of(target) == "hpctf")
    ]
    assert not found, "imports of the package itself from inside it:\n" + "\n".join(found)
