"""The generated parts of the docs: every command from the click group, every experiment and
site key from the schemas ``hpctf schema`` prints, the Python API.

A page holds a block ``<!-- hpctf:commands -->`` ... ``<!-- /hpctf:commands -->`` (or
``hpctf:schema experiment``, ``hpctf:schema site``, ``hpctf:python``, ``hpctf:api Task``)
whose content is what the code says. The content is committed, so the
pages read whole in the repository too; ``python docs/_hooks/reference.py`` writes it anew,
and ``tests/test_docs.py`` fails when a committed block differs from what the code says today.
As an MkDocs hook (``hooks:`` in mkdocs.yml) it fills every block again at every build, so
the site always follows the code. The build also fails (strict mode counts these warnings) on
a reference-style link whose reference is not defined, which Markdown would print as text.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

log = logging.getLogger("mkdocs.hooks.hpctf")

_WHAT = r"commands|python|schema (?:experiment|site)|api (?:Task|Files)"
# A generated block: its opening line, what was generated last (committed), its closing line.
MARKER = re.compile(
    rf"^<!-- hpctf:(?P<what>{_WHAT}) -->\n(?:.*?\n)?<!-- /hpctf:(?P=what) -->$", re.M | re.S
)
DOCS = Path(__file__).resolve().parent.parent
# `[text][ref]` or `[ref][]` left in the HTML: Markdown found no definition for `ref`.
UNDEFINED_REFERENCE = re.compile(r"\[[^\]\n<>]+\]\[[^\]\n<>]*\]")
CODE = re.compile(r"<(code|pre)\b.*?</\1>", re.S)


# --- MkDocs events ----------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return filled(markdown)


def filled(markdown: str) -> str:
    """``markdown`` with every generated block's content made anew from the code."""

    def block(found: re.Match[str]) -> str:
        what = found.group("what")
        body = generated(what).strip("\n")
        return f"<!-- hpctf:{what} -->\n{body}\n<!-- /hpctf:{what} -->"

    return MARKER.sub(block, markdown)


def pages() -> list[Path]:
    """The docs pages that hold a generated block."""
    return sorted(p for p in DOCS.rglob("*.md") if MARKER.search(p.read_text(encoding="utf-8")))


def write_all() -> list[Path]:
    """Fill every page's blocks in place; the pages that changed."""
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = filled(text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def on_page_content(html: str, page: Any, **_: Any) -> str:
    for found in UNDEFINED_REFERENCE.findall(CODE.sub("", html)):
        log.warning("%s: undefined reference link %s", page.file.src_path, found)
    return html


def generated(what: str) -> str:
    if what == "commands":
        return commands_markdown()
    if what == "python":
        return python_markdown()
    kind, _, argument = what.partition(" ")
    if kind == "api":
        return api_markdown(argument)
    return schema_markdown(argument)


# --- commands ---------------------------------------------------------------------------------


def commands_markdown() -> str:
    """Every command of ``hpctf``: a summary table, then each command's ``--help``."""
    from hpctf.cli import cli

    context = click.Context(cli, info_name="hpctf")
    names = cli.list_commands(context)
    commands = [(name, cli.get_command(context, name)) for name in names]
    shown = [(n, c) for n, c in commands if c is not None and not c.hidden]
    internal = [(n, c) for n, c in commands if c is not None and c.hidden]
    top = CliRunner().invoke(_group(), ["--help"], prog_name="hpctf", terminal_width=100)
    usage = top.output.split("\nCommands:")[0].rstrip()  # the table below lists them
    lines = ["```text", usage, "```", ""]
    lines += ["| command | what it does |", "|---|---|"]
    for name, command in shown:
        summary = _cell(_prose(command.get_short_help_str(90)))
        lines.append(f"| [`hpctf {name}`](#hpctf-{name}) | {summary} |")
    lines.append("")
    for name, command in shown:
        lines += _command_section(name, command)
    lines += [
        "## Run by the batch script and on the compute nodes",
        "",
        "These commands are not for your shell: the batch script runs `job-start`, "
        "`job-signal` and `job-end` around `srun`, and every task runs `worker` (or `preflight` "
        "for `hpctf doctor`). `tfconfig` is for debugging inside an allocation.",
        "",
    ]
    for name, command in internal:
        lines += _command_section(name, command, level="###")
    return "\n".join(lines)


def _command_section(name: str, command: click.Command, level: str = "##") -> list[str]:
    result = CliRunner().invoke(_group(), [name, "--help"], prog_name="hpctf", terminal_width=100)
    if result.exit_code != 0:
        raise RuntimeError(f"hpctf {name} --help failed: {result.output}")
    return [f"{level} hpctf {name}", "", "```text", result.output.rstrip(), "```", ""]


def _group() -> click.Group:
    from hpctf.cli import cli

    return cli


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


# --- the user's API -------------------------------------------------------------------------


def api_markdown(name: str) -> str:
    """The fields of ``hpctf.Task`` or ``hpctf.Files``: name, default and the docstring's words
    for it (its ``Attributes:`` section); a field the docstring leaves out fails the build."""
    import dataclasses
    import inspect

    import hpctf.api

    cls = getattr(hpctf.api, name)
    doc = inspect.getdoc(cls) or ""
    summary, _, attributes = doc.partition("Attributes:")
    described: dict[str, str] = {}
    current = ""
    for line in attributes.splitlines():
        entry = re.match(r"^    (\w+): (.*)$", line)
        if entry:
            current = entry.group(1)
            described[current] = entry.group(2)
        elif current and line.strip():
            described[current] += " " + line.strip()
    lines = [_prose(summary), "", "| field | default | what it is |", "|---|---|---|"]
    for item in dataclasses.fields(cls):
        if item.name not in described:
            raise RuntimeError(f"hpctf.{name}'s docstring says nothing of {item.name}")
        if item.default is not dataclasses.MISSING:
            default = f"`{item.default!r}`"
        elif item.default_factory is not dataclasses.MISSING:
            default = f"`{item.default_factory()!r}`"
        else:
            default = "required"
        words = _cell(_prose(described[item.name]))
        lines.append(f"| `{item.name}` | {_cell(default)} | {words} |")
    return "\n".join(lines) + "\n"


def python_markdown() -> str:
    """``hpctf.submit``, ``hpctf.run``, ... and the ``Run`` and ``Sweep`` they return: each
    signature and docstring as the code has them (the names ``hpctf`` exports lazily)."""
    import inspect

    import hpctf

    names = [n for n in getattr(hpctf, "_PYTHON_API", ()) if n not in {"Task", "Files"}]
    if not names:
        raise RuntimeError("hpctf exports no Python API names (_PYTHON_API): update the hook")
    objects = [(n, getattr(hpctf, n)) for n in names]
    functions = [(n, o) for n, o in objects if not inspect.isclass(o)]
    classes = [(n, o) for n, o in objects if inspect.isclass(o)]
    lines: list[str] = []
    for name, function in functions:
        lines += _python_entry(f"hpctf.{name}", function, "##")
    for name, cls in classes:
        lines += [f"## `hpctf.{name}`", "", _paragraphs(inspect.getdoc(cls)), ""]
        for member, value in vars(cls).items():
            if member.startswith("_"):
                continue
            if isinstance(value, property):
                lines += [f"### `{name}.{member}`", "", _paragraphs(inspect.getdoc(value)), ""]
            elif inspect.isfunction(value):
                lines += _python_entry(f"{name}.{member}", value, "###", method=True)
    return "\n".join(lines)


def _python_entry(title: str, function: Any, level: str, method: bool = False) -> list[str]:
    import inspect

    signature = inspect.signature(function)
    if method:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return [
        f"{level} `{title}`",
        "",
        "```python",
        f"{title.rsplit('.', 1)[-1]}{str(signature).replace(chr(39), '')}",
        "```",
        "",
        _paragraphs(inspect.getdoc(function)),
        "",
    ]


def _paragraphs(doc: str | None) -> str:
    return "\n\n".join(_prose(p) for p in (doc or "").split("\n\n"))


# --- schemas ----------------------------------------------------------------------------------


def schema_markdown(kind: str) -> str:
    """Every key of an experiment or site file, a table per mapping, from ``hpctf schema``."""
    result = CliRunner().invoke(_group(), ["schema", kind], prog_name="hpctf")
    if result.exit_code != 0:
        raise RuntimeError(f"hpctf schema {kind} failed: {result.output}")
    schema = json.loads(result.output)
    definitions = schema.get("$defs", {})
    sections: list[str] = []
    _object_section(None, kind, schema, definitions, sections, level=2)
    return "\n".join(sections)


def _resolve(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return definitions[node["$ref"].rsplit("/", 1)[1]]
    return node


def _nested_object(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a key holds (directly, by reference, or as ``X | null``), if any."""
    node = _resolve(node, definitions)
    if node.get("type") == "object" and "properties" in node:
        return node
    for option in node.get("anyOf", []):
        found = _nested_object(option, definitions)
        if found is not None:
            return found
    return None


def _object_section(
    path: str | None,
    kind: str,
    node: dict[str, Any],
    definitions: dict[str, Any],
    sections: list[str],
    level: int,
) -> None:
    heading = "#" * level
    title = f"`{path}`" if path else f"The {kind} file"
    sections += [f"{heading} {title}", ""]
    description = node.get("description")
    if description:
        sections += [_prose(description), ""]
    sections += ["| key | type | default | what it is |", "|---|---|---|---|"]
    nested: list[tuple[str, dict[str, Any]]] = []
    required = set(node.get("required", []))
    for key, value in node.get("properties", {}).items():
        obj = _nested_object(value, definitions)
        name = f"`{key}`"
        if obj is not None:
            child = f"{path}.{key}" if path else key
            nested.append((child, obj))
            name = f"[`{key}`](#{_anchor(child)})"
        default = "required" if key in required else _default(value)
        description = value.get("description") or _first_sentence(obj)
        sections.append(
            f"| {name} | {_cell(_type(value, definitions))} | {_cell(default)} | "
            f"{_cell(_prose(description))} |"
        )
    sections.append("")
    for child, obj in nested:
        _object_section(child, kind, obj, definitions, sections, min(level + 1, 4))


def _first_sentence(obj: dict[str, Any] | None) -> str:
    text = (obj or {}).get("description", "")
    return text.split("\n\n")[0].split(". ")[0].rstrip(".")


def _anchor(path: str) -> str:
    """The id MkDocs' toc gives a heading "`a.b`": punctuation (the dot too) dropped."""
    return re.sub(r"[^\w\- ]", "", path).strip().lower().replace(" ", "-")


def _prose(text: str) -> str:
    """A docstring or description as one Markdown line: ``code`` and Sphinx roles as code,
    and outside code nothing Markdown would read as emphasis or HTML (``__main__``)."""
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", " ".join(text.replace("``", "`").split()))
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = re.sub(r"([_*\[\]<>])", r"\\\1", parts[i])
    return "`".join(parts)


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    return f"`{json.dumps(node['default'])}`"


def _type(node: dict[str, Any], definitions: dict[str, Any]) -> str:
    node = _resolve(node, definitions)
    if "anyOf" in node:
        return " or ".join(dict.fromkeys(_type(o, definitions) for o in node["anyOf"]))
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    kind = node.get("type")
    bounds = _bounds(node)
    if kind == "array":
        if "prefixItems" in node:
            items = ", ".join(_type(i, definitions) for i in node["prefixItems"])
            return f"[{items}]"
        return f"list of {_type(node.get('items', {}), definitions)}"
    if kind == "object":
        if "properties" in node:
            return "mapping (below)"
        values = node.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"mapping of name to {_type(values, definitions)}"
        return "mapping"
    if kind is None:
        return "any"
    return f"{kind}{bounds}"


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    if "minimum" in node:
        parts.append(f">= {node['minimum']:,}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        parts.append(f"<= {node['maximum']:,}")
    if "pattern" in node:  # a long one is Slurm's grammar, which the schema checks for you
        pattern = node["pattern"]
        parts.append(f"matching `{pattern}`" if len(pattern) <= 40 else "Slurm's syntax")
    return f" ({', '.join(parts)})" if parts else ""


if __name__ == "__main__":
    for written in write_all():
        print(f"wrote {written}")
