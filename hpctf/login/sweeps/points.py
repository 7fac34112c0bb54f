"""A sweep's points, each resolved and checked as ``hpctf submit`` checks one
(:func:`hpctf.login.resolving.loader.load_config`), and its batch script checked to be the
first point's (:class:`OneScript`). Writes nothing.

A point costs one ``load_config`` (about 0.2 ms), so a 100,000-point dry run is 20 s of one
core: the points of a dry run, which keeps none of their configs, are checked by a few forked
processes at once (:func:`check`), each over a contiguous part of them, and the problems
merged in point order, so the error is the one a single process would give.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hpctf.core.errors import UserError
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.resolving.loader import load_config
from hpctf.login.resolving.readings import Readings
from hpctf.login.submitting.render import render
from hpctf.login.sweeps.plan import Point

# A stand-in run directory: every point's script, rendered for it, must be the same script.
_SAME_SCRIPT = Path("/hpctf-sweep-point")
# Problems listed before "and N more": a bad key refuses every point alike.
_SHOWN_PROBLEMS = 10
# Fewer points than this are checked in this process: a forked checker costs ~50 ms to start.
PARALLEL_FROM = 4000
MAX_PROCESSES = 16


def _first_line(exc: UserError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _refuse(problems: Sequence[str]) -> None:
    if problems:
        more = len(problems) - _SHOWN_PROBLEMS
        shown = [*problems[:_SHOWN_PROBLEMS], *([f"... and {more} more"] if more > 0 else [])]
        raise UserError("\n".join(shown))


def script_inputs(config: ResolvedConfig) -> tuple[object, ...]:
    """What :func:`hpctf.login.submitting.render.render` reads of ``config``: the site, the
    interpreter and the experiment's name, resources, env and setup (never train, checkpoint
    or tracking: tests/test_sweep.py checks it)."""
    experiment = config.experiment
    return (
        config.site,
        config.python,
        experiment.name,
        experiment.resources,
        experiment.env,
        experiment.setup,
    )


class OneScript:
    """One job array runs one script: refuses, point by point, keys that change it (an #SBATCH
    line, env, setup, the site). Train, checkpoint and other config-only keys can be swept.

    The script is a function of :func:`script_inputs` (and the run directory) alone, so a
    point whose inputs equal the first point's has its script; only a point whose inputs
    differ is rendered (rendering every point was a quarter of a sweep's plan)."""

    def __init__(self, first: Point, config: ResolvedConfig) -> None:
        self.first, self.config, self.inputs = first, config, script_inputs(config)
        self._script: str | None = None

    def check(self, point: Point, config: ResolvedConfig) -> None:
        if script_inputs(config) == self.inputs:
            return
        if self._script is None:
            self._script = render(self.config, _SAME_SCRIPT)
        if render(config, _SAME_SCRIPT) != self._script:
            differ = [k for k, v in point.values.items() if self.first.values.get(k) != v]
            raise UserError(
                f"--grid/--range {', '.join(differ)}: changes the batch script (an #SBATCH line, "
                "env, setup or the site), but one job array runs one script for every point; "
                "sweep keys under train or checkpoint, or submit those points separately"
            )


# A run directory's path that every quoting filter leaves as it is, inside its quotes.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./=+,:@%-]+")
# Stands for a point's run directory (and its name, the job's name) in the one script
# rendered for all: no path has it.
_STAND_IN_NAME = "hpctf-run-dir-of-the-point-0b5e3f1d"
_STAND_IN = f"/{_STAND_IN_NAME}"


def point_scripts(
    configs: Sequence[ResolvedConfig], paths: Sequence[Path], code_store: Path
) -> list[str]:
    """Each point's own batch script (its run directory ``paths[i]``, its code a link into the
    sweep's ``code_store``: what a site's container mounts read-only), rendered once: the
    script is a function of :func:`script_inputs` and the run directory alone, so the first
    point's is rendered for a stand-in directory and each point whose inputs are the first's
    and whose path no quoting changes gets it with its own path (and name) put in. Checked
    against the first and the last point rendered in full (a site's template could use the
    path in some other way): where either differs, each script is rendered; so is any point
    whose inputs or path are not of that kind."""
    if not configs:
        return []

    def rendered(config: ResolvedConfig, path: Path) -> str:
        return render(config, path, code_store=code_store)

    first = script_inputs(configs[0])
    shared = rendered(configs[0], Path(_STAND_IN))
    scripts = [
        shared.replace(_STAND_IN, str(path)).replace(_STAND_IN_NAME, path.name)
        if _PLAIN_PATH.fullmatch(str(path)) and script_inputs(config) == first
        else rendered(config, path)
        for config, path in zip(configs, paths, strict=True)
    ]
    for i in {0, len(configs) - 1}:
        if scripts[i] != rendered(configs[i], paths[i]):
            return [rendered(c, p) for c, p in zip(configs, paths, strict=True)]
    return scripts


@dataclass
class _Pass:
    """One pass over points: how to resolve one, and what was found."""

    experiment: Path
    site_name: str | None
    overrides: Sequence[str]
    readings: Readings
    single_key: bool  # one key swept: a point is one value, refused as a value, once
    problems: list[tuple[int, str]] = field(default_factory=list)
    stop: tuple[int, str] | None = None  # the point that stops the pass, and why

    def resolved(self, points: Sequence[Point]) -> Iterator[tuple[Point, ResolvedConfig]]:
        """Each point that resolves, with its config; the others' problems kept. Ends at the
        first point of a one-key sweep that is refused (said once, as a refused value)."""
        for point in points:
            try:
                sets = [*self.overrides, *point.sets()]
                loaded = load_config(
                    self.experiment, self.site_name, sets, os.environ, readings=self.readings
                )
            except UserError as exc:
                if self.single_key:
                    ((key, value),) = point.values.items()
                    why = f"--grid/--range {key}: value {value!r} refused: {_first_line(exc)}"
                    self.stop = (point.index, why)
                    return
                self.problems.append(
                    (point.index, f"point {point.index} ({point.label()}): {_first_line(exc)}")
                )
                continue
            yield point, loaded.config

    def checked(self, points: Sequence[Point], script: OneScript) -> None:
        """Resolve and check ``points`` against ``script``, keeping nothing."""
        for point, config in self.resolved(points):
            try:
                script.check(point, config)
            except UserError as exc:
                self.stop = (point.index, str(exc))
                return

    def outcome(self) -> None:
        """The UserError a pass in point order ends with, if any."""
        if self.stop is not None:
            raise UserError(self.stop[1])
        _refuse([text for _, text in sorted(self.problems)])


def check(
    experiment: Path,
    site_name: str | None,
    overrides: Sequence[str],
    points: Sequence[Point],
    keep: bool,
) -> tuple[ResolvedConfig, list[ResolvedConfig]]:
    """The first point's config and (``keep``) every point's, or one UserError listing what
    was refused: with several keys swept, each value on its own first (a bad value named once,
    not once per point), then each point; and the first point whose script is not the first
    point's."""
    keys: dict[str, dict[str, None]] = {}  # each key's values, in order, once
    for point in points:
        for key, value in point.values.items():
            keys.setdefault(key, {})[value] = None
    readings = Readings()  # the files are read and parsed once, not once per point
    if len(keys) > 1:  # with one key, each point is one value: checked once, below
        _refuse(_value_problems(experiment, site_name, overrides, keys, readings))
    work = _Pass(experiment, site_name, overrides, readings, single_key=len(keys) == 1)
    configs: list[ResolvedConfig] = []
    script: OneScript | None = None
    rest: Sequence[Point] = ()
    for point, config in work.resolved(points):
        if script is None:
            script = OneScript(point, config)
            rest = points[point.index + 1 :]  # a point's index is its place in the sweep
            if not keep and len(rest) >= PARALLEL_FROM and _processes() > 1:
                _in_processes(work, rest, script)
                break
        try:
            script.check(point, config)
        except UserError as exc:
            work.stop = (point.index, str(exc))
            break
        if keep:
            configs.append(config)
    work.outcome()
    assert script is not None  # every point refused: outcome() raised
    return script.config, configs


def _value_problems(
    experiment: Path,
    site_name: str | None,
    overrides: Sequence[str],
    keys: dict[str, dict[str, None]],
    readings: Readings,
) -> list[str]:
    problems = []
    for key, values in keys.items():
        for value in values:
            try:
                sets = [*overrides, f"{key}={value}"]
                load_config(experiment, site_name, sets, os.environ, readings=readings)
            except UserError as exc:
                problems.append(
                    f"--grid/--range {key}: value {value!r} refused: {_first_line(exc)}"
                )
                break  # an unknown key refuses every value alike: say it once
    return problems


def _processes() -> int:
    """How many processes may check points: the cores this process may use, where fork is
    there to start them (they inherit what was read, instead of reading it again)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_PROCESSES))


# What the forked checkers work on: set just before they are forked, inherited by them.
_FORKED: tuple[_Pass, Sequence[Point], OneScript] | None = None


def _in_processes(work: _Pass, points: Sequence[Point], script: OneScript) -> None:
    """Check ``points`` in forked processes, each a contiguous part; their problems (and the
    earliest point that stops a pass) merged into ``work`` as one pass in order finds them."""
    global _FORKED
    count = _processes()
    size = -(-len(points) // count)
    parts = [(start, min(start + size, len(points))) for start in range(0, len(points), size)]
    _FORKED = (work, points, script)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=len(parts), mp_context=context) as pool:
            found = list(pool.map(_check_part, parts))
    finally:
        _FORKED = None
    for problems, stop in found:
        work.problems.extend(problems)
        if stop is not None and (work.stop is None or stop[0] < work.stop[0]):
            work.stop = stop


def _check_part(part: tuple[int, int]) -> tuple[list[tuple[int, str]], tuple[int, str] | None]:
    """In a forked checker: the points ``part`` (start, end) of :data:`_FORKED`, checked."""
    assert _FORKED is not None
    work, points, script = _FORKED
    mine = _Pass(work.experiment, work.site_name, work.overrides, work.readings, work.single_key)
    mine.checked(points[part[0] : part[1]], script)
    return mine.problems, mine.stop
