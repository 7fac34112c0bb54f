"""Resolving an experiment against its site: the one merge of the layers, values and origins
together.

Precedence is ``--set`` > experiment.yaml > site file > defaults, decided in one place
(:func:`merge_resources`) for the value and for where it came from at once, so ``render
--explain`` can never say a value came from somewhere else than it did. A key the experiment
gives, even as ``null``, wins over the site's default: ``--set resources.partition=null`` drops
the site's partition.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.core.errors import UserError
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import (
    SITE_RESOURCE_KEYS,
    Experiment,
    ResolvedConfig,
    Resources,
    Site,
)
from hpctf.core.settings.replicas import batch_split_problem, expected_replicas
from hpctf.core.settings.sbatch_options import option_name
from hpctf.core.settings.sources import KeyPath, Origin, Origins, file_origins, load_yaml, origin_of
from hpctf.core.settings.train import Train
from hpctf.core.settings.validation import apply_overrides, validate_model
from hpctf.core.settings.values import slurm_time_seconds


def script_experiment(script: Path) -> dict[str, Any]:
    """The experiment ``hpctf submit train.py`` makes on the fly: named after the script, which
    it runs (``train.script``); resources and site from the site file, ``--site`` and ``--set``.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", script.stem).lstrip("-_.")[:64] or "script"
    return {"name": name, "train": {"script": script.name}}


def read_experiment(
    path: Path,
    overrides: Iterable[str] = (),
    read: Callable[[Path], tuple[dict[str, Any], dict[KeyPath, int]]] = load_yaml,
) -> tuple[Experiment, Origins]:
    """Load, override and validate one experiment file (a ``.py`` file: the experiment that
    runs it, :func:`script_experiment`); also say where each value came from. ``read`` parses
    the YAML file (a sweep's reads it once: :mod:`hpctf.login.resolving.readings`)."""
    if path.suffix == ".py":
        if not path.is_file():
            raise UserError(f"{path}: no such file")
        data, lines = script_experiment(path), dict[KeyPath, int]()
    else:
        data, lines = read(path)
    origins = file_origins("experiment", path, lines)
    data = apply_overrides(data, overrides, Experiment, origins)
    return validate_model(Experiment, data, origins, str(path)), origins


class ConfigProblems(UserError):
    """Problems found only once experiment and site are combined, by resolved key path.

    The message names the experiment file; :mod:`hpctf.login.resolving.loader` re-words each
    problem with the file and line its value came from (``origins``, from the same merge).
    """

    def __init__(
        self,
        experiment_file: Path | str,
        problems: list[tuple[KeyPath, str]],
        origins: Origins | None = None,
    ) -> None:
        self.problems = problems
        self.origins = origins or {}
        super().__init__("\n".join(f"{experiment_file}: {'.'.join(k)}: {m}" for k, m in problems))


def expand_path(value: str, env: Mapping[str, str]) -> str:
    """``~`` and ``$NAME``/``${NAME}`` expanded from ``env``; ValueError saying what is wrong."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise ValueError(f"{value!r} names the unset variable ${name}")
        return env[name]

    text = re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", variable, value)
    if "$" in text:
        raise ValueError(f"{value!r}: only $NAME and ${{NAME}} expand here")
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME")
        if not home:
            raise ValueError(f"{value!r} starts with ~ but HOME is not set")
        text = home + text[1:]
    return text


@dataclass(frozen=True)
class Loaded:
    """A resolved config and, by resolved key path, where each value came from.

    Keys: ``("name",)``, ``("resources", KEY)``, ``("resources", "extra_sbatch", I)``,
    ``("env", NAME)``, ``("setup", I)``, ``("modules", I)``, ``("python",)``, ``("venv",)``,
    ``("runs_root",)``, ``("run_dir",)``, ``("site",)``, ``("template",)``,
    ``("train", "entry")``, ``("preemption", KEY)``.
    """

    config: ResolvedConfig
    origins: Origins


def _lookup(origins: Origins) -> Callable[..., Origin]:
    def origin(*path: str) -> Origin:
        return origin_of(origins, path) or Origin("default", key=".".join(path))

    return origin


def merge_resources(
    resources: Resources, site: Site, experiment_origins: Origins, site_origins: Origins
) -> tuple[Resources, Origins]:
    """The effective request and the origin of each of its values, decided together.

    A key the experiment gives (even as null) is the experiment's; else the site's default when
    it has one; else the schema's default. ``extra_sbatch`` is the site's items, then the
    experiment's.
    """
    from_experiment, from_site = _lookup(experiment_origins), _lookup(site_origins)
    given = resources.model_fields_set
    update: dict[str, Any] = {}
    origins: Origins = {}
    for key in Resources.model_fields:
        path = ("resources", key)
        if key == "extra_sbatch":
            update[key] = [*site.extra_sbatch, *resources.extra_sbatch]
            extras = [from_site(key, str(i)) for i in range(len(site.extra_sbatch))]
            extras += [from_experiment(*path, str(i)) for i in range(len(resources.extra_sbatch))]
            origins.update({(*path, str(i)): o for i, o in enumerate(extras)})
        elif key in given:
            origins[path] = from_experiment(*path)
        elif key in SITE_RESOURCE_KEYS and getattr(site, key) is not None:
            update[key] = getattr(site, key)
            origins[path] = from_site(key)
        else:
            origins[path] = Origin("default", key=f"resources.{key}")
    return resources.model_copy(update=update), origins


def _other_origins(
    experiment: Experiment,
    experiment_origins: Origins,
    site: Site,
    site_origins: Origins,
    site_choice: Origin,
) -> Origins:
    """Where the values outside ``resources`` came from (keys as in :class:`Loaded`)."""
    from_experiment, from_site = _lookup(experiment_origins), _lookup(site_origins)
    out: Origins = {
        ("name",): from_experiment("name"),
        ("site",): site_choice,
        ("train", "entry"): from_experiment("train", "entry"),
        ("train", "args"): from_experiment("train", "args"),
        ("train", "script"): from_experiment("train", "script"),
    }
    for name in experiment.train.args:
        out[("train", "args", name)] = from_experiment("train", "args", name)
    for name in site.env:
        out[("env", name)] = from_site("env", name)
    for name in experiment.env:
        out[("env", name)] = from_experiment("env", name)
    out[("env", "PYTHONUNBUFFERED")] = Origin("hpctf", detail="worker logs unbuffered")
    setups = [from_site("setup", str(i)) for i in range(len(site.setup))]
    setups += [from_experiment("setup", str(i)) for i in range(len(experiment.setup))]
    out.update({("setup", str(i)): o for i, o in enumerate(setups)})
    out.update(
        {("modules", str(i)): from_site("modules", str(i)) for i in range(len(site.modules))}
    )
    for key in ("venv", "runs_root", "template"):
        out[(key,)] = from_site(key)
    out[("preemption", "warning_seconds")] = from_site("preemption", "warning_seconds")
    out[("preemption", "max_requeues")] = from_site("preemption", "max_requeues")
    if site.python:
        out[("python",)] = from_site("python")
    elif site.venv:
        out[("python",)] = from_site("venv")
    else:
        out[("python",)] = Origin("hpctf", detail="the interpreter running hpctf")
    out[("run_dir",)] = Origin(
        "hpctf", detail=f"a new run directory under runs_root, from {out[('runs_root',)]}"
    )
    return out


def resource_conflicts(resources: Resources, site: Site) -> list[tuple[KeyPath, str]]:
    """Problems only visible once site and experiment are combined: (key path, message)."""
    problems: list[tuple[KeyPath, str]] = []
    if resources.mail_user and not resources.mail_type:
        problems.append(
            (("resources", "mail_user"), "mail_user without mail_type sends nothing; add mail_type")
        )
    gpus = resources.gpus_per_node or 0
    warning = launcher_for(site).warning_seconds
    if warning is not None:
        limit = slurm_time_seconds(resources.time)
        if warning >= limit:
            problems.append(
                (
                    ("resources", "time"),
                    f"{resources.time} ({limit} s) must be longer than site {site.name}'s "
                    f"preemption.warning_seconds ({warning}), or the warning comes at the start",
                )
            )
    for index, option in enumerate(resources.extra_sbatch):
        name = option_name(option)
        if resources.mem and name in {"mem-per-cpu", "mem-per-gpu"}:
            problems.append(
                (
                    ("resources", "extra_sbatch", str(index)),
                    f"{option} conflicts with resources.mem ({resources.mem}); give one of them",
                )
            )
        if site.gpu_request == "gres" and gpus and "gres".startswith(name) and name:
            problems.append(
                (
                    ("resources", "extra_sbatch", str(index)),
                    f"{option} would override --gres=gpu:{gpus}, which hpctf writes for this "
                    "site (gpu_request: gres); use resources.gpus_per_node",
                )
            )
    return problems


def check_script(script: Path, python_path: list[str]) -> str | None:
    """Why ``train.script`` (absolute) cannot run from the run's code snapshot, or None: it
    must be a file inside one of the ``python_path`` directories, which are what is copied."""
    if not script.is_file():
        return f"{script} is not a file"
    if not any(script.is_relative_to(directory) for directory in python_path):
        return (
            f"{script} is outside train.python_path ({', '.join(python_path)}), so it would "
            "not be in the run's copy of the code; add its directory to python_path"
        )
    return None


def expand_site_paths(
    site: Site, env: Mapping[str, str]
) -> tuple[dict[str, Any], list[tuple[KeyPath, str]]]:
    """The site's ``runs_root``, ``venv`` and ``python`` with ``~`` and ``$VARS`` expanded
    from ``env`` (the keys to update), and the problems with them: (key path, message)."""
    site_update: dict[str, Any] = {}
    problems: list[tuple[KeyPath, str]] = []
    for key in ("runs_root", "venv", "python"):
        value = getattr(site, key)
        if value is None:
            continue
        try:
            expanded = expand_path(value, env)
        except ValueError as exc:
            problems.append(((key,), str(exc)))
            continue
        if key == "runs_root" and "%" in expanded:
            # sbatch and srun expand %-patterns (%j, %u, %t, ...) in --output file names, which
            # lie under it: the job's log went elsewhere and the job failed to launch.
            problems.append(
                ((key,), f"{expanded!r} holds '%', which sbatch reads as a file-name pattern "
                 "(%j, %u, ...) in the job's log paths: choose a runs_root without %")
            )  # fmt: skip
            continue
        if key != "runs_root" and not expanded.startswith("/") and (key == "venv" or "/" in value):
            problems.append(
                ((key,), f"{value!r} must be an absolute path (python may be a bare command name)")
            )
        site_update[key] = expanded
    return site_update, problems


def resolve(
    experiment_file: Path,
    experiment: Experiment,
    experiment_origins: Origins,
    site: Site,
    site_origins: Origins,
    site_choice: Origin,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    real: Callable[[Path], Path] = Path.resolve,
) -> Loaded:
    """Combine an experiment with its site, once. Paths become absolute (``real``: a path's
    absolute, symlink-free form; a sweep's remembers them); nothing is written.

    ``env`` (default: ``os.environ``) expands ``~`` and ``$VARS`` in the site's ``venv``,
    ``python`` and ``runs_root``. Raises :class:`ConfigProblems` for combinations that cannot
    work.
    """
    env = os.environ if env is None else env
    train, script_problem = _train_paths(experiment, real(experiment_file).parent, real)
    resources, origins = merge_resources(
        experiment.resources, site, experiment_origins, site_origins
    )
    origins.update(_other_origins(experiment, experiment_origins, site, site_origins, site_choice))
    problems = _combination_problems(experiment, resources, site)
    if script_problem:
        problems.append((("train", "script"), script_problem))
    experiment = experiment.model_copy(update={"train": train, "resources": resources})
    site_update, path_problems = expand_site_paths(site, env)
    problems.extend(path_problems)
    if problems:
        raise ConfigProblems(experiment_file, problems, origins)
    site = site.model_copy(update=site_update)
    config = ResolvedConfig(
        experiment=experiment,
        site=site,
        experiment_file=str(real(experiment_file)),
        python=_interpreter(site, python),
    )
    return Loaded(config, origins)


def _train_paths(
    experiment: Experiment, base: Path, real: Callable[[Path], Path]
) -> tuple[Train, str | None]:
    """``train`` with its python_path and script absolute (from the experiment file's
    directory ``base``), and why the script cannot be run (or None)."""
    python_path = [str(real(base / p)) for p in experiment.train.python_path]
    update: dict[str, Any] = {"python_path": python_path}
    script_problem = None
    if experiment.train.script is not None:
        script = real(base / experiment.train.script)
        update["script"] = str(script)
        script_problem = check_script(script, python_path)
    return experiment.train.model_copy(update=update), script_problem


def _combination_problems(
    experiment: Experiment, resources: Resources, site: Site
) -> list[tuple[KeyPath, str]]:
    """What cannot work in the experiment's request on ``site`` (``resources``: merged)."""
    problems = resource_conflicts(resources, site)
    batch = experiment.train.global_batch_size
    if batch and (split := batch_split_problem(batch, expected_replicas(resources))):
        problems.append((("train", "global_batch_size"), split))
    if resources.spare_nodes and not launcher_for(site).slurm:
        problems.append(
            (
                ("resources", "spare_nodes"),
                f"needs a Slurm site, which allocates the nodes; site {site.name} runs local "
                "processes on this machine: leave it out there (or 0)",
            )
        )
    if experiment.train.restart_every_steps and not launcher_for(site).slurm:
        problems.append(
            (
                ("train", "restart_every_steps"),
                f"needs a Slurm site, which requeues the job; site {site.name} runs local "
                "processes, which are not started again: leave it out there",
            )
        )
    return problems


def _interpreter(site: Site, python: str | None) -> str:
    """The Python the workers run: the site's, its venv's, or this one (``python``)."""
    if site.python:
        return site.python
    if site.venv:
        return str(Path(site.venv) / "bin" / "python")
    return python or sys.executable
