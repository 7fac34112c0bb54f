"""The one Jinja environment that writes batch scripts (the training job's, the doctor's), and
a site's own template, read, parsed, checked and compiled once per file.

StrictUndefined: a missing value is an error, never an empty string. A ``finalize`` hook
refuses any value reaching the script unless a filter has made it safe for where it goes:

- ``sh``: a shell word, single-quoted (``shlex.quote``); newlines and NUL bytes are refused, so
  a value can never end a comment line or start a command.
- ``sbatch_value``: a plain token for ``#SBATCH`` lines, which sbatch parses itself, without
  shell quoting, splitting at whitespace into further options.
- ``env_name``: an environment variable name.

Integers pass as they are. The only raw shell that reaches a script is the config's ``setup``
lines, which Python hands to the template as :class:`ShellCode`; a template cannot turn any
other value into raw shell. A site may supply its own template (``template:`` in the site
file) that ``{% extends "sbatch.sh.j2" %}`` and overrides its blocks; the same rules hold.

In the login wing, below both :mod:`hpctf.login.resolving` (which checks a site's template
while reading the config) and :mod:`hpctf.login.submitting` (which renders with it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

from hpctf.core.assets import shipped_dir
from hpctf.core.errors import UserError
from hpctf.core.settings import sbatch_options
from hpctf.core.settings.values import ENV_NAME_RE

TEMPLATE = "sbatch.sh.j2"


class Checked(str):
    """A string a filter has made safe for the place in the script it is going."""


class ShellCode(str):
    """Raw shell from the config's ``setup`` lines: the one place shell code is accepted."""


class Rendered(str):
    """A block of the template itself, rendered (``{{ super() }}``): its values were checked."""


class _BlockReference(jinja2.runtime.BlockReference):
    def __call__(self) -> Rendered:
        return Rendered(super().__call__())


class _Context(jinja2.runtime.Context):
    """Marks ``{{ super() }}`` as template output, so a site template may include its parent's
    block; without this the finalize hook could not tell it from an unquoted value."""

    def super(self, name: str, current: Any) -> jinja2.runtime.BlockReference | jinja2.Undefined:
        ref = super().super(name, current)
        if isinstance(ref, jinja2.runtime.BlockReference):
            return _BlockReference(ref.name, ref._context, ref._stack, ref._depth)
        return ref


def sbatch_value(value: Any) -> Checked:
    """A value for an ``#SBATCH --flag=value`` line, or a UserError naming it."""
    text = str(value)
    if not sbatch_options.SBATCH_TOKEN.fullmatch(text):
        raise UserError(
            f"{text!r} cannot go into an #SBATCH line; use {sbatch_options.SBATCH_TOKEN_RULE}"
        )
    return Checked(text)


def shell_quote(value: Any) -> Checked:
    """One single-quoted shell word that stands for ``value`` literally.

    Always quoted, unlike ``shlex.quote`` (which leaves ``=a`` bare: ``export X==a`` is valid
    bash but reads as a typo). Newlines and NUL bytes are refused.
    """
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise UserError(f"{text!r} holds a newline or NUL byte and cannot go into the script")
    return Checked("'" + text.replace("'", "'\"'\"'") + "'")


def env_name(value: Any) -> Checked:
    text = str(value)
    if not ENV_NAME_RE.fullmatch(text):
        raise UserError(f"{text!r} is not an environment variable name")
    return Checked(text)


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` output passes here: only filtered values, ShellCode and ints."""
    if isinstance(value, jinja2.Undefined):
        return value  # StrictUndefined raises as it is written out: name the missing value
    if isinstance(value, Checked | ShellCode | Rendered) or (
        isinstance(value, int) and not isinstance(value, bool)
    ):
        return value
    raise UserError(
        f"template error: {value!r} reached the script without the sh, sbatch_value or "
        "env_name filter"
    )


def _absolute_template(name: str) -> tuple[str, str, Any] | None:
    """Load a site's own template by absolute path (the shipped ones load by name)."""
    path = Path(name)
    if not path.is_absolute() or not path.is_file():
        return None
    mtime = path.stat().st_mtime
    return path.read_text(encoding="utf-8"), str(path), lambda: path.stat().st_mtime == mtime


# Sandboxed: a site's template is data a user may not have written (a shared site directory);
# Jinja's sandbox refuses the attribute walks that reach Python
# (``cycler.__init__.__globals__.os.popen(...)`` ran at `hpctf validate` before).
ENVIRONMENT = SandboxedEnvironment(
    loader=jinja2.ChoiceLoader(
        [
            jinja2.FileSystemLoader(str(shipped_dir("templates"))),
            jinja2.FunctionLoader(_absolute_template),
        ]
    ),
    undefined=jinja2.StrictUndefined,
    finalize=_finalize,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.context_class = _Context
ENVIRONMENT.filters["sh"] = shell_quote
ENVIRONMENT.filters["sbatch_value"] = sbatch_value
ENVIRONMENT.filters["env_name"] = env_name


def site_template(path: str) -> jinja2.Template:
    """The site template at ``path``, ready to render; a UserError unless it is a readable
    template that extends the base one. Read, parsed, checked and compiled once per version of
    the file (its modification time and size), however often a command asks: reading the
    config checks it, rendering uses it."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    return _compiled(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _compiled(path: str, mtime_ns: int, size: int) -> jinja2.Template:
    file = Path(path)
    try:
        source = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        tree = ENVIRONMENT.parse(source, name=file.name, filename=path)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: template syntax error: {exc.message}") from None
    extends = next(tree.find_all(nodes.Extends), None)
    if not (
        extends is not None
        and isinstance(extends.template, nodes.Const)
        and extends.template.value == TEMPLATE
    ):
        raise UserError(
            f'{path}: a site template must start with {{% extends "{TEMPLATE}" %}} and '
            "override blocks (header, sbatch, prologue, environment, setup, launch)"
        )
    code = ENVIRONMENT.compile(tree, name=file.name, filename=path)  # the tree parsed above
    return ENVIRONMENT.template_class.from_code(ENVIRONMENT, code, ENVIRONMENT.make_globals(None))
