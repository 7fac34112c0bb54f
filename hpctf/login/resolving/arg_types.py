"""``train.args`` values against the types the entry's signature says, read from its source
(never imported): an annotation of ``int``, ``float``, ``str`` or ``bool`` (``X | None`` and
``Optional[X]`` also take ``null``), else the type of a literal default (``lr=0.01``: float).
Anything else (a class, a list, no annotation and no default, ``None`` as default) is not
judged. An int is a float's value too, and a numeric default takes either; a bool is never
a number. Used at validate, submit and
sweep (:func:`hpctf.login.resolving.loader.args_problems`), so ``--grid
train.args.lr=abc`` is refused before a job is submitted.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bool": (bool,),
    "number": (int, float),  # told by a default only: ``lr=1`` may well be given 0.5
}


def expected_types(arguments: ast.arguments) -> dict[str, tuple[str, bool, str]]:
    """Per parameter whose type can be told: (type name, whether null is allowed, what said so:
    ``annotation`` or ``default <literal>``)."""
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults: dict[str, ast.expr | None] = dict.fromkeys((a.arg for a in positional), None)
    defaults.update(zip((a.arg for a in positional[len(positional) - len(arguments.defaults) :]),
                        arguments.defaults, strict=True))  # fmt: skip
    defaults.update((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                               strict=True))  # fmt: skip
    found: dict[str, tuple[str, bool, str]] = {}
    for arg in [*positional, *arguments.kwonlyargs]:
        annotated = _annotation(arg.annotation) if arg.annotation is not None else None
        default = defaults.get(arg.arg)
        if annotated is not None:
            found[arg.arg] = (*annotated, "annotation")
        elif default is not None and (literal := _literal(default)) is not None:
            kind = type(literal).__name__
            kind = "number" if kind in ("int", "float") else kind
            if kind in _TYPES:
                found[arg.arg] = (kind, False, f"default {ast.unparse(default)}")
    return found


def _annotation(node: ast.expr) -> tuple[str, bool] | None:
    """``float`` -> (float, False); ``float | None``, ``Optional[float]`` -> (float, True)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "float": a string
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.Name) and node.id in _TYPES:
        return node.id, False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        nones = [s for s in sides if isinstance(s, ast.Constant) and s.value is None]
        rest = [s for s in sides if s not in nones]
        if len(nones) == 1 and len(rest) == 1 and (inner := _annotation(rest[0])) is not None:
            return inner[0], True
        return None
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name | ast.Attribute)
        and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "Optional"
        and (inner := _annotation(node.slice)) is not None
    ):
        return inner[0], True
    return None


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def type_problems(
    function: str, arguments: ast.arguments, args: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """``(key, message)`` for each value of ``args`` whose type the signature refuses."""
    expected = expected_types(arguments)
    problems = []
    for key, value in args.items():
        if key not in expected:
            continue
        kind, nullable, said = expected[key]
        if value is None and nullable:
            continue
        if isinstance(value, _TYPES[kind]) and not (kind != "bool" and isinstance(value, bool)):
            continue
        problems.append(
            (key, f"{value!r} is not {'an' if kind == 'int' else 'a'} {kind}: {function}() "
                  f"takes {key} as {kind}{' or null' if nullable else ''} (its {said})")
        )  # fmt: skip
    return problems
