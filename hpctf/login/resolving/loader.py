"""From an experiment file, a site, ``--set`` flags and the environment to a ResolvedConfig.

The login commands (validate, render, submit) all start here, so they agree on every check.
Alongside the config comes where each of its values came from (``render --explain``, and the
file and line in every error). Pure apart from reading files: the environment is a parameter.
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpctf.core.errors import UserError
from hpctf.core.safe_files import shortened
from hpctf.core.settings.config import Experiment, ResolvedConfig, Site
from hpctf.core.settings.sites import available
from hpctf.core.settings.sources import KeyPath, Origin, Origins, load_yaml
from hpctf.login.resolving.arg_types import type_problems
from hpctf.login.resolving.readings import Readings
from hpctf.login.resolving.resolve import ConfigProblems, Loaded, read_experiment, resolve
from hpctf.login.resolving.tracking_check import tracking_problems
from hpctf.login.templating import site_template


def entry_problem(config: ResolvedConfig) -> str | None:
    """Why ``train.entry`` cannot be found, or None. Never imports the user's module."""
    return _entry_source(config)[0]


def _entry_key(config: ResolvedConfig) -> tuple[object, ...]:
    """Everything :func:`_entry_source`'s answer depends on."""
    train, site = config.experiment.train, config.site
    return (train.entry, tuple(train.python_path), not (site.python or site.venv))


def _entry_source(config: ResolvedConfig) -> tuple[str | None, ast.Module | None]:
    """Why ``train.entry`` cannot be found (or None), and its module parsed when it is a
    ``.py`` source. Never imports the user's module.

    The module is looked for on ``train.python_path``, then (when compute nodes run this same
    interpreter) among what this interpreter can import. Only a ``.py`` source is checked for
    the function, by parsing it.
    """
    entry = config.experiment.train.entry
    if entry is None:  # train.script: the script's own file is checked where it is resolved
        return None, None
    module, _, function = entry.partition(":")
    locations: list[str] | None = list(config.experiment.train.python_path)
    same_python = not (config.site.python or config.site.venv)
    spec = None
    for index, part in enumerate(module.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None and index == 0 and same_python:
            spec = importlib.machinery.PathFinder.find_spec(part, sys.path)
        if spec is None:
            if index == 0 and not same_python:
                return None, None  # may be installed in the compute nodes' environment only
            missing = ".".join(module.split(".")[: index + 1])
            where = ", ".join(config.experiment.train.python_path)
            return f"module {missing} not found (python_path: {where})", None
        locations = list(spec.submodule_search_locations or [])
    if spec is None or not (spec.origin or "").endswith(".py"):
        return None, None
    try:
        tree = ast.parse(Path(str(spec.origin)).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as exc:
        return f"{spec.origin}: cannot parse: {exc}", None
    if function not in _top_level_names(tree) and "__getattr__" not in _top_level_names(tree):
        return f"{spec.origin} defines no {function}", None
    return None, tree


def args_problems(config: ResolvedConfig, tree: ast.Module) -> list[tuple[KeyPath, str]]:
    """``train.args`` against the entry's signature, as parsed from its source: each name the
    function does not take, each value of a type its annotation or default refuses
    (:mod:`hpctf.login.resolving.arg_types`), and each parameter without a default that no
    arg gives. Nothing
    when the entry is not a plain ``def`` (a class, a decorated or reassigned function) or takes
    ``**kwargs``. With ``train.loop: custom`` the first parameter is the session."""
    settings = config.experiment.train
    name = (settings.entry or "").partition(":")[2]
    defined = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign)
        and name in _defined_names(node)
    ]
    if len(defined) != 1 or not isinstance(defined[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    function = defined[0]
    if function.decorator_list or function.args.kwarg is not None:
        return []
    allowed, required = _parameters(function.args, custom=settings.loop == "custom")
    takes = f"{name}() takes " + (", ".join(allowed) if allowed else "no arguments")
    problems: list[tuple[KeyPath, str]] = []
    for key in settings.args:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            problems.append(
                (("train", "args", key), f"unknown argument of {name}(){mean}; {takes}")
            )
    problems += [
        (("train", "args", key), message)
        for key, message in type_problems(name, function.args, settings.args)
        if key in allowed
    ]
    missing = [key for key in required if key not in settings.args]
    if missing:
        problems.append(
            (("train", "args"), f"{name}() needs {', '.join(missing)}, not given; {takes}")
        )
    return problems


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _parameters(arguments: ast.arguments, custom: bool) -> tuple[list[str], list[str]]:
    """The names ``train.args`` may give a ``def`` with ``arguments`` (hpctf passes them by
    keyword), and those it must give (no default). ``custom``: the first parameter is the
    session, which hpctf passes itself."""
    positional = [*arguments.posonlyargs, *arguments.args]
    first_default = len(positional) - len(arguments.defaults)
    required = {a.arg for a in positional[:first_default]}
    required |= {
        a.arg for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is None
    }
    given = positional[1:] if custom else positional
    allowed = [a.arg for a in given if a in arguments.args]  # positional-only: not by keyword
    allowed += [a.arg for a in arguments.kwonlyargs]
    return allowed, [name for name in allowed if name in required]


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    names.add("__getattr__")  # anything may come in: do not judge
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def _site_reference(
    experiment_file: Path,
    site_name: str | None,
    experiment: Experiment | None,
    experiment_origins: Origins,
) -> tuple[str | None, Origin]:
    """Which site to load (from --site, or the experiment's ``site:``) and where that came from."""
    if site_name:
        return site_name, Origin("--site", detail=site_name)
    if experiment is not None:
        return experiment.site, experiment_origins.get(
            ("site",), Origin("experiment", str(experiment_file), key="site")
        )
    try:  # the experiment is invalid: still check its site, to report every problem at once
        data, lines = load_yaml(experiment_file)
    except UserError:
        return None, Origin("experiment", str(experiment_file), key="site")
    site = data.get("site")
    line = lines.get(("site",))
    return (site if isinstance(site, str) else None), Origin(
        "experiment", str(experiment_file), line, "site"
    )


def _read_site(
    experiment_file: Path,
    name: str | None,
    choice: Origin,
    env: Mapping[str, str],
    readings: Readings,
) -> tuple[Site, Origins]:
    """The site ``name`` (chosen where ``choice`` says) and its origins, or a UserError in the
    words of where it was chosen."""
    if not name:
        where = "pass --site" if experiment_file.suffix == ".py" else "add `site:` or pass --site"
        raise UserError(
            f"{experiment_file}: site: no site given; {where}, one of: "
            f"{', '.join(sorted(available(env)))}"
        )
    try:
        path = readings.site_path(name, env)
    except UserError as exc:
        prefix = "--site" if choice.source == "--site" else f"{choice.where()}: site"
        raise UserError(f"{prefix}: {exc}") from None
    return readings.site(path, env)


def load_config(
    experiment_file: Path,
    site_name: str | None,
    overrides: Sequence[str],
    env: Mapping[str, str],
    python: str | None = None,
    readings: Readings | None = None,
) -> Loaded:
    """Validate the experiment and its site, resolve them, and check what can be checked.

    Writes nothing. Raises one UserError holding every problem found, one line each.
    ``readings``: files already read by an earlier call of the same command (a sweep's points);
    the answer and the errors are the same as without.
    """
    readings = readings or Readings()
    experiment, experiment_origins, site, site_origins, choice = _read_inputs(
        experiment_file, site_name, overrides, env, readings
    )
    try:
        loaded = resolve(
            experiment_file,
            experiment,
            experiment_origins,
            site,
            site_origins,
            choice,
            python,
            env,
            readings.real,
        )
    except ConfigProblems as exc:
        lines = [
            _located(exc.origins, path, message, experiment_file) for path, message in exc.problems
        ]
        raise UserError("\n".join(lines)) from None
    _check_resolved(loaded, experiment_file, readings)
    return loaded


def _read_inputs(
    experiment_file: Path,
    site_name: str | None,
    overrides: Sequence[str],
    env: Mapping[str, str],
    readings: Readings,
) -> tuple[Experiment, Origins, Site, Origins, Origin]:
    """The experiment (``overrides`` applied) and its site, each with its origins, and where
    the site was chosen; one UserError with the problems of both."""
    problems: list[str] = []
    experiment: Experiment | None = None
    experiment_origins: Origins = {}
    try:
        experiment, experiment_origins = read_experiment(experiment_file, overrides, readings.yaml)
    except UserError as exc:
        problems.append(str(exc))
    name, choice = _site_reference(experiment_file, site_name, experiment, experiment_origins)
    site: Site | None = None
    site_origins: Origins = {}
    if name or experiment is not None:
        try:
            site, site_origins = _read_site(experiment_file, name, choice, env, readings)
        except UserError as exc:
            problems.append(str(exc))
    if problems or experiment is None or site is None:
        raise UserError("\n".join(problems))
    if env.get("HPCTF_RUNS_ROOT"):
        site = site.model_copy(update={"runs_root": env["HPCTF_RUNS_ROOT"]})
        site_origins[("runs_root",)] = Origin(
            "environment", key="runs_root", detail="HPCTF_RUNS_ROOT"
        )
    return experiment, experiment_origins, site, site_origins, choice


def _check_resolved(loaded: Loaded, experiment_file: Path, readings: Readings) -> None:
    """The checks of a resolved config: the site's template (parsed here once, for render),
    the training entry and its ``train.args``, the trackers; a UserError at the first kind
    that fails, each problem located."""
    config, origins = loaded.config, loaded.origins
    if config.site.template:
        try:
            site_template(config.site.template)  # parsed once: render uses it
        except UserError as exc:
            raise UserError(_located(origins, ("template",), str(exc), experiment_file)) from None
    problem, tree = readings.entry(_entry_key(config), lambda: _entry_source(config))
    if problem:
        raise UserError(_located(origins, ("train", "entry"), problem, experiment_file))
    wrong = args_problems(config, tree) if tree is not None else []
    wrong = wrong or tracking_problems(config)
    if wrong:
        raise UserError(
            "\n".join(_located(origins, path, message, experiment_file) for path, message in wrong)
        )


def _located(origins: Mapping[KeyPath, Origin], path: KeyPath, message: str, file: Path) -> str:
    """``file:line: key: message`` for a problem with a resolved value."""
    origin = origins.get(path)
    key = ".".join(path)
    if origin is None or origin.source == "default":
        return f"{file}: {key}: {message}"
    if origin.source == "--set":
        return f"{file}: {key}: {message} (from --set {shortened(origin.detail)})"
    if origin.source == "site" and origin.key != key:
        return f"{origin.where()}: {origin.key}: {message}"
    return f"{origin.where()}: {key}: {message}"
