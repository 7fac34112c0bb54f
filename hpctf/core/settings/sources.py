"""Reading configuration sources: YAML files with the line of every key, and where each value
came from (:class:`Origin`). Validating against a schema and typing ``--set`` overrides is
:mod:`hpctf.core.settings.validation`. Independent of hpctf's own schemas
(:mod:`hpctf.core.settings.config`).

YAML is read with a safe loader that follows YAML 1.2's core schema instead of PyYAML's 1.1
one: ``time: 1:00:00`` stays the string Slurm expects (1.1 reads it as the sexagesimal integer
3600), ``NCCL_IB_DISABLE: no`` stays ``"no"`` (1.1: False), ``010`` is ten (1.1: eight), dates
stay strings, and a key given twice in one mapping is an error instead of the last one silently
winning.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpctf.core.errors import UserError
from hpctf.core.safe_files import read_bounded, shortened
from hpctf.core.secrets import MARK

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
            text = f"--set {shortened(self.detail)}"
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


# Bounds on what one YAML document may be, so a hostile or broken file is one line, in well
# under a second: nesting (PyYAML composes recursively: 100,000 nested "[" was a RecursionError,
# "a bug in hpctf") and values with aliases expanded (10 levels of 9 aliases is 9**10 values in
# 300 bytes: the key-line walk grew to 8.1 GB in 60 s). Config files are far below both.
MAX_DEPTH = 100
# An experiment or site file is a page of settings: 1 MiB is thousands of lines, and a bigger
# one (or /dev/zero) is refused before PyYAML spends minutes on it.
MAX_FILE_BYTES = 1 << 20
MAX_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars, duplicate keys refused, and nesting and
    alias expansion bounded (:data:`MAX_DEPTH`, :data:`MAX_VALUES`)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        # Refused while scanning, not only while composing: the scanner looks up to 1,024
        # characters ahead for a simple key on every "[", which took 0.4 s of CPU before the
        # composer's bound was reached on 100,000 nested "[".
        if self.flow_level >= MAX_DEPTH:
            raise yaml.scanner.ScannerError(
                None,
                None,
                f"nested deeper than {MAX_DEPTH} levels",
                self.get_mark(),
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node

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


def _check_expansion(root: yaml.Node) -> None:
    """A ComposerError when ``root`` holds more than :data:`MAX_VALUES` values with every alias
    expanded, or an alias inside its own anchor. Each node is counted once (memoized), so this
    takes time linear in the document, whatever the aliases multiply to."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to a value that holds it", node.start_mark
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        open_nodes.discard(key)
        if total > MAX_VALUES:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"more than {MAX_VALUES:,} values once its aliases (*name) are expanded; "
                "write the values out, or use fewer aliases",
                node.start_mark,
            )
        sizes[key] = total
        return total

    size(root)


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


def _secret(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
    """``!secret VALUE``: loaded as ``{secret: VALUE}``, the mark the settings read as a secret
    (hpctf.core.settings.values.Secret); the same for a value given as JSON or ``--set``."""
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, "!secret takes one value (a string or a number)", node.start_mark
        )
    # The value's own type as if untagged: !secret 22 is the number 22 (then "22" in env).
    plain_style = node.style in (None, "")  # quoted or a block: a string
    implicit = (plain_style, not plain_style)
    resolved = loader.resolve(yaml.ScalarNode, node.value, implicit)  # type: ignore[no-untyped-call]
    plain = yaml.ScalarNode(resolved, node.value, node.start_mark, node.end_mark, node.style)
    return {MARK: loader.construct_object(plain)}


_Loader.add_constructor("!secret", _secret)


def parse_yaml(text: str) -> Any:
    """One YAML value with hpctf's safe loader (YAML 1.2 scalars, no duplicate keys)."""
    # A copy of the value parsed once: a sweep types the same few ``--set`` texts for each of
    # thousands of points, and parsing was a quarter of its plan (issue #21).
    return copy.deepcopy(_parse_once(text))


@functools.lru_cache(maxsize=4096)
def _parse_once(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


def _key_lines(root: yaml.Node | None) -> dict[KeyPath, int]:
    """Map each key path in a composed YAML document to its 1-based line."""
    lines: dict[KeyPath, int] = {}
    walked: set[int] = set()

    def walk(node: yaml.Node, path: KeyPath) -> None:
        # An alias names a node already walked: its keys have their lines under the anchor, and
        # walking it again per alias multiplies (origin_of falls back to the alias's own key).
        if id(node) in walked:
            return
        walked.add(id(node))
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
        text = read_bounded(path, MAX_FILE_BYTES, "a YAML file").decode("utf-8")
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
