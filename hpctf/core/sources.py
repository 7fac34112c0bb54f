"""Reading configuration sources: YAML files, ``--set`` overrides, and where each value came from.

Independent of hpctf's own schemas (those live in :mod:`hpctf.core.config`): everything here
takes the pydantic model it works for. Errors come out as one line per problem, naming file,
line and key.


YAML is read with a safe loader that follows YAML 1.2's core schema instead of PyYAML's 1.1
one: ``time: 1:00:00`` stays the string Slurm expects (1.1 reads it as the sexagesimal integer
3600), ``NCCL_IB_DISABLE: no`` stays ``"no"`` (1.1: False), ``010`` is ten (1.1: eight), dates
stay strings, and a key given twice in one mapping is an error instead of the last one silently
winning.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hpctf.core.errors import UserError

_M = TypeVar("_M", bound=BaseModel)
KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Origin:
    """Where one value came from: for error messages and ``hpctf render --explain``.

    ``source`` is one of ``default``, ``site``, ``experiment``, ``--set``, ``--site``,
    ``environment`` and ``hpctf``; ``key`` is the key path in that source.
    """

    source: str
    file: str | None = None
    line: int | None = None
    key: str = ""
    detail: str = ""

    def where(self) -> str:
        """``file:line`` (or what stands in for a file), for the front of an error line."""
        if self.file:
            return f"{self.file}:{self.line}" if self.line else self.file
        return self.source

    def __str__(self) -> str:
        if self.source in {"site", "experiment"}:
            text = f"{self.source} {self.where()}"
        elif self.source == "--set":
            text = f"--set {self.detail}"
        elif self.source == "environment":
            text = f"environment {self.detail}"
        else:
            text = self.source + (f": {self.detail}" if self.detail else "")
        return f"{text} ({self.key})" if self.key and self.source != "--set" else text


Origins = dict[KeyPath, Origin]


def origin_of(origins: Mapping[KeyPath, Origin], path: Sequence[str]) -> Origin | None:
    """The origin of ``path`` or of its nearest ancestor that has one."""
    parts = tuple(path)
    while parts:
        if parts in origins:
            return origins[parts]
        parts = parts[:-1]
    return None


# --- loading -------------------------------------------------------------------------------

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_DROPPED_TAGS = {
    _INT_TAG,
    _FLOAT_TAG,
    _BOOL_TAG,
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:value",
}


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key_node.value!r} given twice (first on line "
                        f"{seen[key_node.value]})",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    try:
        return int(text.replace("_", ""), 10)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not a decimal integer", node.start_mark
        ) from None


# Drop PyYAML's YAML 1.1 resolvers for booleans, numbers, timestamps and "="; add 1.2's.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(_INT_TAG, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_Loader.add_constructor(_INT_TAG, _yaml12_int)


def parse_yaml(text: str) -> Any:
    """One YAML value with hpctf's safe loader (YAML 1.2 scalars, no duplicate keys)."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


def _key_lines(root: yaml.Node | None) -> dict[KeyPath, int]:
    """Map each key path in a composed YAML document to its 1-based line."""
    lines: dict[KeyPath, int] = {}

    def walk(node: yaml.Node, path: KeyPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, str(index))] = item.start_mark.line + 1
                walk(item, (*path, str(index)))

    if root is not None:
        walk(root, ())
    return lines


def load_yaml(path: Path) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """Read one YAML mapping safely; return it and the line of every key path in it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise UserError(_not_utf8(path, exc)) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    try:
        # PyYAML checks every character of a str stream when the loader is made, not on load.
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        raise UserError(_unprintable(path, text, exc)) from None
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}{where}: invalid YAML: {problem}") from None
    finally:
        loader.dispose()
    if data is None:
        raise UserError(f"{path}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data, _key_lines(root)


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """One line for a file that is not UTF-8: where its first undecodable byte is."""
    data = exc.object
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return (
        f"{path}:{line}: not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column} "
        f"({exc.reason}); save the file as UTF-8"
    )


def _unprintable(path: Path, text: str, exc: yaml.reader.ReaderError) -> str:
    """One line for a character YAML refuses in a stream (NUL, BEL, DEL, other controls)."""
    line = text.count("\n", 0, exc.position) + 1
    column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    code = exc.character
    escape = f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
    return (
        f"{path}:{line}: invalid YAML: unprintable character U+{code:04X} at column {column}; "
        "a YAML file may hold only printable characters, tabs and line breaks (if you mean "
        f'it, write "{escape}" inside a double-quoted string)'
    )


def file_origins(
    source: str, path: Path | str, lines: Mapping[KeyPath, int], prefix: KeyPath = ()
) -> Origins:
    """Origins for every key path of one file (``source`` is ``site`` or ``experiment``)."""
    return {
        (*prefix, *key): Origin(source, str(path), line, ".".join(key))
        for key, line in lines.items()
    }


# --- the schema, walked by key path --------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the type underneath."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        args = typing.get_args(annotation)
        if args and type(None) in args and origin is not None and origin not in {list, dict}:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def annotation_at(model: type[BaseModel], path: Sequence[str]) -> Any:
    """The schema's type at ``path`` (dotted keys, list indexes), or None if there is none."""
    current: Any = model
    for part in path:
        current = _unwrap(current)
        if _is_model(current):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) in {list, tuple} and part.isdigit():
            current = typing.get_args(current)[0]
        else:
            return None
    return current


def _field_path(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """A pydantic error location as the user's key path: union member tags dropped."""
    path: list[str] = []
    current: Any = model
    for part in loc:
        current = _unwrap(current) if current is not None else None
        if current is None:
            path.append(str(part))
        elif _is_model(current):
            path.append(str(part))
            field = current.model_fields.get(str(part))
            current = field.annotation if field else None
        elif typing.get_origin(current) is dict:
            path.append(str(part))
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) in {list, tuple} and isinstance(part, int):
            path.append(str(part))
            args = typing.get_args(current)
            fixed = typing.get_origin(current) is tuple and len(args) > 1
            current = args[part] if fixed else args[0]
        # anything else names a member of a union (``bool``, ``literal[...]``): not a key
    return path


def _allowed_keys(model: type[BaseModel], path: Sequence[str]) -> list[str]:
    """The keys the model allows beside ``path``'s last part."""
    parent = _unwrap(annotation_at(model, path[:-1]))
    return sorted(parent.model_fields) if _is_model(parent) else []


def _describe(error: Mapping[str, Any], model: type[BaseModel], path: list[str]) -> str:
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, path)
        hint = difflib.get_close_matches(path[-1], allowed, n=1) if path else []
        message = "unknown key"
        if hint:
            message += f" (did you mean {hint[0]!r}?)"
        return message + f"; allowed: {', '.join(allowed)}"
    if error["type"] == "missing":
        return "required key is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "literal_error" and isinstance(error.get("input"), str):
        choices = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        hint = difflib.get_close_matches(error["input"], choices, n=1, cutoff=0.5)
        if hint:
            message += f" (did you mean {hint[0]!r}?)"
    if error["type"] not in {"value_error", "assertion_error"} and "input" in error:
        message += f" (got {error['input']!r})"
    return message


def validation_problems(
    exc: ValidationError,
    model: type[BaseModel],
    origins: Mapping[KeyPath, Origin],
    default_file: str,
    prefix: KeyPath = (),
) -> list[str]:
    """One line per problem: ``file:line: key.path: what was wrong; what is allowed``.

    ``origins`` maps key paths (under ``prefix``) to where they were given; a problem with a
    value from ``--set`` names the file and the flag.
    """
    grouped: dict[KeyPath, list[str]] = {}
    for error in exc.errors():
        loc = _field_path(model, error["loc"])
        message = _describe(error, model, loc)
        bucket = grouped.setdefault(tuple(loc), [])
        if message not in bucket:
            bucket.append(message)
    out = []
    for path, messages in grouped.items():
        key = ".".join(path) or "(top level)"
        origin = origin_of(origins, (*prefix, *path))
        text = " or ".join(messages)
        if origin is None:
            where = default_file
        elif origin.source == "--set":
            where, text = default_file, f"{text} (from --set {origin.detail})"
        else:
            where = origin.where()
        out.append(f"{where}: {key}: {text}")
    return out


def validate_model(
    model: type[_M],
    data: Any,
    origins: Mapping[KeyPath, Origin],
    default_file: str,
) -> _M:
    """``model.model_validate(data)``, or a UserError with one line per problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, model, origins, default_file)
        raise UserError("\n".join(problems)) from None


def _override_value(model: type[BaseModel], parts: Sequence[str], raw: str) -> Any:
    """A ``--set`` value typed by the schema: text for string keys, YAML for the rest."""
    target = _unwrap(annotation_at(model, parts))
    if target is str:
        optional = _accepts_none(annotation_at(model, parts))
        return None if optional and raw.strip() in {"null", "~"} else raw
    if not raw.strip():
        return ""
    try:
        return parse_yaml(raw)
    except yaml.YAMLError:
        return raw


def _accepts_none(annotation: Any) -> bool:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return type(None) in typing.get_args(annotation)


def apply_overrides(
    data: dict[str, Any],
    overrides: Iterable[str],
    model: type[BaseModel],
    origins: Origins | None = None,
) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a copy of data.

    Values are typed by ``model``: a string key takes the text as given (``--set name=007``
    is ``"007"``, ``null`` clears an optional one), other keys parse it as YAML (``4``,
    ``true``, ``[a, b]``). When ``origins`` is given, each overridden
    path (and nothing below it) is recorded as coming from ``--set``.
    """
    result = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or not key or any(not part for part in parts):
            raise UserError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. resources.nodes=4")
        value = _override_value(model, parts, raw)
        target = result
        for part in parts[:-1]:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {item!r}: {part} is not a mapping")
            target = child
        target[parts[-1]] = value
        if origins is not None:
            path = tuple(parts)
            for known in [k for k in origins if k[: len(path)] == path]:
                del origins[known]
            origins[path] = Origin("--set", key=key, detail=item)
    return result
