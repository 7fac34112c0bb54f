"""Rendering the sbatch script: a pure function of the resolved config and the run directory,
through the one safe Jinja environment (:mod:`hpctf.login.templating`: every value quoted for
where it goes, a site's own template parsed once). ``render --explain``'s notes are here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from hpctf.core.errors import UserError
from hpctf.core.run.rundir import STEP_EXCLUDE
from hpctf.core.secrets import plain_env, secret_env
from hpctf.core.settings import sbatch_options
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.sources import KeyPath, Origin
from hpctf.core.version import VERSION
from hpctf.login.submitting.containers import container_launch
from hpctf.login.templating import ENVIRONMENT, TEMPLATE, ShellCode, site_template


@dataclass(frozen=True)
class ArrayScript:
    """What makes the batch script a sweep's job array: sbatch's ``--array`` value, where the
    array's own output goes, and the run directory of each task, by task index."""

    spec: str
    log_dir: Path
    run_dirs: tuple[Path, ...]
    search: Path | None = None  # a search's sweep directory: each task an agent of its study


def render(
    config: ResolvedConfig, run_dir: Path, array: ArrayScript | None = None,
    code_store: Path | None = None,
) -> str:  # fmt: skip
    """The complete batch script for ``config`` running in ``run_dir``; with ``array``, one
    script for a job array whose task N runs in ``array.run_dirs[N]`` (``run_dir`` is then
    the sweep directory, where the array's output goes) and otherwise does what the single-run
    script does. ``code_store``: a sweep's point, whose ``code/`` links into that store (what
    a container mounts read-only: :mod:`hpctf.login.submitting.containers`)."""
    res = config.experiment.resources
    env = {**config.site.env, **config.experiment.env}
    secret = secret_env(env)  # from RUN_DIR/secrets.env (0600), never the script itself
    job = sbatch_options.ArrayJob(array.spec, array.log_dir) if array else None
    context = {
        "version": VERSION,
        "name": config.experiment.name,
        "site": config.site.name,
        "sbatch_options": sbatch_options.rendered(config, run_dir, job),
        "array": {
            "run_dirs": [str(p) for p in array.run_dirs],
            "search": str(array.search) if array.search else None,
        }
        if array
        else None,
        "extra_sbatch": list(res.extra_sbatch),
        "run_dir": str(run_dir),
        "python": config.python,
        "modules": config.site.modules,
        "venv": config.site.venv,
        "env": sorted((k, v) for k, v in plain_env(env).items() if k not in secret),
        "secrets": sorted(secret),
        "setup": [
            ShellCode(line.rstrip("\n")) for line in (*config.site.setup, *config.experiment.setup)
        ],
        **_launch(config, run_dir, array is not None, code_store),
    }
    if not config.site.template:
        return ENVIRONMENT.get_template(TEMPLATE).render(context)  # a failure: hpctf's bug
    try:
        return site_template(config.site.template).render(context)
    except jinja2.TemplateError as exc:
        raise UserError(f"template {config.site.template}: {exc}") from None


def _launch(
    config: ResolvedConfig, run_dir: Path, array: bool, code_store: Path | None
) -> dict[str, Any]:
    """What the launch block lays out: the workers' steps (and the standby's), the spares."""
    res = config.experiment.resources
    return {
        "nodes": res.nodes,
        "spare_nodes": res.spare_nodes,
        "ntasks": config.ntasks,
        "step_exclude": STEP_EXCLUDE,
        "tasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "warm_standby": config.experiment.train.warm_standby,
        "container": container_launch(config, run_dir, code_store=code_store, array=array),
    }


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
