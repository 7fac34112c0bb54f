"""No function over 50 lines anywhere in hpctf, unless its docstring says why it is better
whole: a long function is read in pieces anyway. No module over 400 lines: one concept a
module, and a module a reader holds whole."""

from __future__ import annotations

import ast

from tests.conftest import REPO

LIMIT = 50
MODULE_LIMIT = 400
ROOMS = ["hpctf"]
ELSEWHERE: set[str] = set()


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """The functions of ``source`` longer than ``limit`` lines whose docstring does not say
    why they are better whole."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit and "better whole" not in (ast.get_docstring(node) or ""):
                found.append((node.name, length))
    return found


def module_lines(source: str, limit: int = MODULE_LIMIT) -> int | None:
    """How many lines ``source`` has when that is over ``limit``; None when within it."""
    lines = len(source.splitlines())
    return lines if lines > limit else None


def test_the_check_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def f():\n{body}\n") == [("f", LIMIT + 1)]
    excused = f'def f():\n    """Read top to bottom: better whole."""\n{body}\n'
    assert long_functions(excused) == []


def test_the_check_finds_a_long_module() -> None:
    lines = [f"x{i} = {i}" for i in range(MODULE_LIMIT)]
    assert module_lines("\n".join(lines) + "\n") is None
    assert module_lines("\n".join([*lines, "y = 0"]) + "\n") == MODULE_LIMIT + 1


def test_no_long_function_in_the_rooms_that_read_runs() -> None:
    found = [
        f"{path.relative_to(REPO)}: {name} has {length} lines"
        for room in ROOMS
        for path in sorted((REPO / room).rglob("*.py"))
        if str(path.relative_to(REPO)) not in ELSEWHERE
        for name, length in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def test_no_module_over_400_lines() -> None:
    found = [
        f"{path.relative_to(REPO)} has {lines} lines: split it by concept"
        for room in ROOMS
        for path in sorted((REPO / room).rglob("*.py"))
        if (lines := module_lines(path.read_text(encoding="utf-8"))) is not None
    ]
    assert not found, "\n".join(found)
