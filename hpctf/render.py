"""Rendering the sbatch script: a pure function of the resolved config and the run directory.

One Jinja environment for the whole program, with StrictUndefined (a missing value is an
error, never an empty string) and two filters: ``sh`` (shell-quote every value that reaches a
shell line) and ``sbatch_value`` (admit only plain tokens into ``#SBATCH`` lines, which sbatch
parses itself without shell quoting rules).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jinja2

from hpctf import __version__
from hpctf.assets import shipped_dir
from hpctf.config import ResolvedConfig
from hpctf.errors import UserError

_SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:/=@%+-]+$")
TEMPLATE = "sbatch.sh.j2"


def sbatch_value(value: Any) -> str:
    """A value for an ``#SBATCH --flag=value`` line, or a UserError naming it."""
    text = str(value)
    if not _SBATCH_TOKEN.match(text):
        raise UserError(
            f"{text!r} cannot go into an #SBATCH line; use letters, digits and _.,:/=@%+- only"
        )
    return text


def shell_quote(value: Any) -> str:
    return shlex.quote(str(value))


ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(shipped_dir("templates"))),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters["sh"] = shell_quote
ENVIRONMENT.filters["sbatch_value"] = sbatch_value


def sbatch_options(config: ResolvedConfig, run_dir: Path) -> list[tuple[str, str | int]]:
    """The ``#SBATCH`` options, in Slurm's names, in a stable order."""
    res = config.experiment.resources
    options: list[tuple[str, str | int]] = [
        ("job-name", config.experiment.name),
        ("nodes", res.nodes),
        ("ntasks-per-node", res.tasks_per_node),
        ("cpus-per-task", res.cpus_per_task),
        ("time", res.time),
    ]
    if config.partition:
        options.append(("partition", config.partition))
    if config.gpus_per_node:
        options.append(("gpus-per-node", config.gpus_per_node))
    options.append(("output", f"{run_dir}/logs/slurm-%j.out"))
    return options


def render(config: ResolvedConfig, run_dir: Path) -> str:
    """The complete batch script for ``config`` running in ``run_dir``."""
    res = config.experiment.resources
    env = {**config.site.env, **config.experiment.env}
    context = {
        "version": __version__,
        "name": config.experiment.name,
        "site": config.site.name,
        "sbatch_options": sbatch_options(config, run_dir),
        "run_dir": str(run_dir),
        "python": config.python,
        "modules": config.site.modules,
        "venv": config.site.venv,
        "env": sorted(env.items()),
        "nodes": res.nodes,
        "tasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
    }
    return ENVIRONMENT.get_template(TEMPLATE).render(context)
