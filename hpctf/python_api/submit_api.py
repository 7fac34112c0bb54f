"""``hpctf.submit`` and ``hpctf.sweep``: a run or a sweep started from Python, here or on a
site behind SSH.

A module of its own, above :mod:`hpctf.python_api.run_api` and
:mod:`hpctf.python_api.sweep_api` (a run and a sweep here) and
:mod:`hpctf.python_api.remote_run` (a run and a sweep on the cluster, themselves a
:class:`Run` and a :class:`Sweep`): it picks between them, so none has to import another's
caller.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctf.python_api.run_api import Run, Settings, set_texts, value_text
from hpctf.python_api.sweep_api import Sweep


def submit(
    experiment: str | os.PathLike[str],
    site: str | None = None,
    set: Settings = None,
    echo: bool = False,
) -> Run:
    """``hpctf submit EXPERIMENT [--site SITE] [--set KEY=VALUE ...]``: validate, create the
    run directory and start it. ``set``: ``{"train.steps": 100}`` or ``["train.steps=100"]``.
    On a Slurm site it returns once sbatch took the job (:meth:`Run.wait` waits); on a local
    site once the workers have ended. A local run's worker output goes to its rank logs
    (:meth:`Run.logs`); ``echo=True`` also prints rank 0's here. Ctrl-C (SIGINT) during a
    local run: the workers save an agreed step as under ``hpctf submit``, then
    KeyboardInterrupt is raised (``hpctf resubmit`` or :meth:`Run.resubmit` resumes it)."""
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.launchers import Caller
    from hpctf.login.submitting.pipeline import submit_run
    from hpctf.python_api import remote_run

    remote = remote_run.submit(Path(experiment), site, set_texts(set), os.environ)
    if remote is not None:  # a site behind SSH: the run is on the cluster
        return remote
    config = load_config(Path(experiment), site, set_texts(set), os.environ).config
    submitted = submit_run(config, caller=Caller(echo=echo, interrupt=True))
    assert submitted.created is not None  # not a dry run
    return Run(submitted.created.run.path)


def sweep(
    experiment: str | os.PathLike[str],
    grid: Mapping[str, Sequence[Any]] | None = None,
    site: str | None = None,
    set: Settings = None,
    max_running: int | None = None,
    ranges: Mapping[str, str] | None = None,
    draws: int | None = None,
    seed: int = 0,
    max_points: int | None = None,
    echo: bool = False,
) -> Sweep:
    """``hpctf sweep EXPERIMENT --grid KEY=V1,V2 ...``: one run per point of the product of
    ``grid`` (``{"train.args.lr": [0.01, 0.1]}``), or ``draws`` random points from ``ranges``
    (``{"train.args.lr": "1e-4:1e-1:log"}``); an experiment with a ``sweep:`` section (and no
    grid) is searched, as ``hpctf sweep`` does. On a Slurm site it returns once the job array
    is submitted (:meth:`Sweep.wait` waits); on a local site once every point has run (worker
    output in the rank logs unless ``echo``; Ctrl-C: the point saves, KeyboardInterrupt)."""
    from hpctf.login.submitting.launchers import Caller
    from hpctf.login.sweeps.plan import DEFAULT_MAX_POINTS
    from hpctf.login.sweeps.start import start_any
    from hpctf.python_api import remote_run

    grids = [f"{k}={','.join(value_text(v) for v in vs)}" for k, vs in (grid or {}).items()]
    range_texts = [f"{k}={v}" for k, v in (ranges or {}).items()]
    options = [
        *(f"--grid={g}" for g in grids),
        *(f"--range={r}" for r in range_texts),
        *([f"--random={draws}"] if draws else []),
        f"--seed={seed}",
        f"--max-points={max_points or DEFAULT_MAX_POINTS}",
        *([f"--max-running={max_running}"] if max_running else []),
    ]
    remote = remote_run.sweep(Path(experiment), site, set_texts(set), options, os.environ)
    if remote is not None:  # a site behind SSH: the sweep is on the cluster
        return remote
    record, _ = start_any(
        Path(experiment), grids, range_texts, draws, seed, max_points or DEFAULT_MAX_POINTS,
        site, set_texts(set), max_running, Caller(echo=echo, interrupt=True),
    )  # fmt: skip
    return Sweep(record.path)
