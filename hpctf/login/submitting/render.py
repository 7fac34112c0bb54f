"""Rendering the sbatch script: a pure function of the resolved config and the run directory.

One Jinja environment for the whole program, with StrictUndefined (a missing value is an
error, never an empty string) and a ``finalize`` hook that refuses any value reaching the
script unless a filter has made it safe for where it goes:

- ``sh``: a shell word, single-quoted (``shlex.quote``); newlines and NUL bytes are refused, so
  a value can never end a comment line or start a command.
- ``sbatch_value``: a plain token for ``#SBATCH`` lines, which sbatch parses itself, without
  shell quoting, splitting at whitespace into further options.
- ``env_name``: an environment variable name.

Integers pass as they are. The only raw shell that reaches the script is the config's
``setup`` lines, which Python hands to the template as :class:`ShellCode`; a template cannot
turn any other value into raw shell. A site may supply its own template (``template:`` in the
site file) that ``{% extends "sbatch.sh.j2" %}`` and overrides its blocks; the same rules hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes

from hpctf import __version__
from hpctf.core.assets import shipped_dir
from hpctf.core.errors import UserError
from hpctf.core.secrets import secret_env
from hpctf.core.settings import sbatch_options
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.sources import KeyPath, Origin
from hpctf.core.settings.values import ENV_NAME_RE
from hpctf.login.submitting.containers import container_launch

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


ENVIRONMENT = jinja2.Environment(
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


def check_site_template(path: str) -> None:
    """A UserError unless ``path`` is a readable template that extends the base one."""
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


@dataclass(frozen=True)
class ArrayScript:
    """What makes the batch script a sweep's job array: sbatch's ``--array`` value, where the
    array's own output goes, and the run directory of each task, by task index."""

    spec: str
    log_dir: Path
    run_dirs: tuple[Path, ...]


def render(config: ResolvedConfig, run_dir: Path, array: ArrayScript | None = None) -> str:
    """The complete batch script for ``config`` running in ``run_dir``; with ``array``, one
    script for a job array whose task N runs in ``array.run_dirs[N]`` (``run_dir`` is then
    only where the array's output goes) and otherwise does what the single-run script does."""
    res = config.experiment.resources
    env = {**config.site.env, **config.experiment.env}
    secret = secret_env(env)  # from RUN_DIR/secrets.env (0600), never the script itself
    job = sbatch_options.ArrayJob(array.spec, array.log_dir) if array else None
    context = {
        "version": __version__,
        "name": config.experiment.name,
        "site": config.site.name,
        "sbatch_options": sbatch_options.rendered(config, run_dir, job),
        "array": {"run_dirs": [str(p) for p in array.run_dirs]} if array else None,
        "extra_sbatch": list(res.extra_sbatch),
        "run_dir": str(run_dir),
        "python": config.python,
        "modules": config.site.modules,
        "venv": config.site.venv,
        "env": sorted((k, v) for k, v in env.items() if k not in secret),
        "secrets": sorted(secret),
        "setup": [
            ShellCode(line.rstrip("\n")) for line in (*config.site.setup, *config.experiment.setup)
        ],
        "nodes": res.nodes,
        "tasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "container": container_launch(config, run_dir),
    }
    name = TEMPLATE
    if config.site.template:
        check_site_template(config.site.template)
        name = config.site.template
    try:
        return ENVIRONMENT.get_template(name).render(context)
    except jinja2.TemplateError as exc:
        if name == TEMPLATE:
            raise  # a bug in hpctf's own template, not a user mistake
        raise UserError(f"template {name}: {exc}") from None


# --- render --explain ------------------------------------------------------------------------

_COLUMN = 48


def _annotate(line: str, origin: Origin | None) -> str:
    if origin is None:
        return line
    return f"{line.ljust(_COLUMN - 1)} # <- {origin}"


def explain(script: str, config: ResolvedConfig, origins: Mapping[KeyPath, Origin]) -> str:
    """``script`` with where each value came from beside its ``#SBATCH`` and shell lines.

    The notes are comments (``# <- site .../gpu.yaml:12 (partition)``) that neither sbatch
    nor bash reads, so the annotated script still runs. Setup lines get their note on a line
    of its own above them: a comment cannot safely follow arbitrary shell code.
    """
    extra = list(config.experiment.resources.extra_sbatch)
    modules = list(config.site.modules)
    setup = [item.rstrip("\n") for item in (*config.site.setup, *config.experiment.setup)]
    out: list[str] = []
    extra_index = module_index = setup_index = 0
    in_setup = False  # after the base template's "# setup:" comment
    raw_lines = 0  # lines of the current setup item still to copy untouched
    for line in script.split("\n"):
        if line.startswith("# setup: raw shell"):
            in_setup = True
        if in_setup and setup_index < len(setup) and line == setup[setup_index].split("\n")[0]:
            out.append(f"# setup line(s) below <- {origins.get(('setup', str(setup_index)))}")
            raw_lines = setup[setup_index].count("\n") + 1
            setup_index += 1
        if raw_lines:
            out.append(line)  # raw shell: a trailing comment could change what it means
            raw_lines -= 1
            continue
        origin: Origin | None = None
        if line.startswith("#SBATCH "):
            token = line.split()[1]
            flag = sbatch_options.option_name(token)
            if extra_index < len(extra) and token == extra[extra_index]:
                origin = origins.get(("resources", "extra_sbatch", str(extra_index)))
                extra_index += 1
            elif flag in sbatch_options.EXPLAINED_BY:
                origin = origins.get(sbatch_options.EXPLAINED_BY[flag])
        elif line.startswith("export "):
            key = line[len("export ") :].split("=", 1)[0]
            origin = origins.get(("env", key))
        elif line.startswith("module load ") and module_index < len(modules):
            origin = origins.get(("modules", str(module_index)))
            module_index += 1
        elif line.startswith("RUN_DIR="):
            origin = origins.get(("run_dir",))
        elif line.startswith("PYTHON="):
            origin = origins.get(("python",))
        elif line.startswith("source ") and "/bin/activate" in line:
            origin = origins.get(("venv",))
        out.append(_annotate(line, origin))
    last_sbatch = max((i for i, line in enumerate(out) if line.startswith("#SBATCH ")), default=0)
    out[last_sbatch + 1 : last_sbatch + 1] = _dropped_defaults(config, origins)
    return "\n".join(out)


def _dropped_defaults(config: ResolvedConfig, origins: Mapping[KeyPath, Origin]) -> list[str]:
    """A note for each site default the experiment or ``--set`` removed with null: no
    ``#SBATCH`` line says so otherwise."""
    notes = []
    resources = config.experiment.resources
    for option in sbatch_options.OPTIONS:
        if option.key is None or option.key[0] != "resources" or option.flag == "gres":
            continue
        key = option.key[1]
        site_value = getattr(config.site, key, None)
        origin = origins.get(option.key)
        if (
            getattr(resources, key) is None
            and site_value
            and origin
            and origin.source
            in {
                "experiment",
                "--set",
            }
        ):
            notes.append(
                _annotate(f"# --{option.flag}: none", origin)
                + f", dropping site {config.site.name}'s {site_value!r}"
            )
    return notes
