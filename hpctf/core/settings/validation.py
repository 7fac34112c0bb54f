"""Validation against a pydantic model, by key path: pydantic's errors turned into one line per
problem naming file, line and key (with the allowed keys, or a close match), and ``--set
KEY.PATH=VALUE`` overrides typed by the schema at that path before they are merged.

Independent of hpctf's own schemas, like :mod:`hpctf.core.settings.sources`, which reads the files
and records each value's origin.
"""

from __future__ import annotations

import copy
import difflib
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hpctf.core.errors import UserError
from hpctf.core.safe_files import quoted, shortened
from hpctf.core.secrets import MARK
from hpctf.core.settings.sources import KeyPath, Origin, Origins, origin_of, parse_yaml

_M = TypeVar("_M", bound=BaseModel)

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
        message += f" (got {_shown(path, error['input'])})"
    return message


# Keys whose values may be secrets (hpctf.core.secrets): a wrong value is named by its kind,
# never echoed (an error line goes to a terminal, a CI log, a bug report).
_SECRET_KEYS = {"env", "tracking_uri", "webhook"}


def _shown(path: Sequence[str], value: Any) -> str:
    if _SECRET_KEYS & set(path):
        kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "true/false"}
        kind = kinds.get(type(value), f"a {type(value).__name__}")
        return f"{kind}, not shown: it may be a secret"
    return quoted(value)


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
            where, text = default_file, f"{text} (from --set {shortened(origin.detail)})"
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
    if target is str or _text_or_secret(target):
        optional = _accepts_none(annotation_at(model, parts))
        if optional and raw.strip() in {"null", "~"}:
            return None
        return _marked_secret(raw) or raw
    if not raw.strip():
        return ""
    try:
        return parse_yaml(raw)
    except yaml.YAMLError:
        return raw


def _text_or_secret(annotation: Any) -> bool:
    """Whether ``annotation`` is a union of text and the secret type (an ``env:`` value)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return union and str in typing.get_args(annotation)


def _marked_secret(raw: str) -> dict[str, Any] | None:
    """``--set env.DB=!secret TEXT`` (or ``{secret: TEXT}``): the mark, else None."""
    if not raw.lstrip().startswith(("!secret", "{")):
        return None
    try:
        parsed = parse_yaml(raw)
    except yaml.YAMLError:
        return None
    return parsed if isinstance(parsed, dict) and set(parsed) == {MARK} else None


def override_value(model: type[BaseModel], key: str, raw: str) -> Any:
    """The value ``--set KEY=RAW`` gives ``key`` (``train.args.lr``) of ``model``: as
    :func:`apply_overrides` types it (a sweep's point values, typed back)."""
    return _override_value(model, key.split("."), raw)


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
            raise UserError(
                f"--set {quoted(item)}: expected KEY.PATH=VALUE, e.g. resources.nodes=4"
            )
        value = _override_value(model, parts, raw)
        target = result
        for part in parts[:-1]:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {quoted(item)}: {part} is not a mapping")
            target = child
        target[parts[-1]] = value
        if origins is not None:
            path = tuple(parts)
            for known in [k for k in origins if k[: len(path)] == path]:
                del origins[known]
            origins[path] = Origin("--set", key=key, detail=item)
    return result
