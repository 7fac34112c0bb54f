"""``hpctf.submit``: one run submitted from Python, here or on a site behind SSH.

A module of its own, above both :mod:`hpctf.python_api.run_api` (a run here) and
:mod:`hpctf.python_api.remote_run` (a run on the cluster, itself a :class:`Run`): it picks
between the two, so neither has to import the other's caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctf.python_api.run_api import Run, Settings, set_texts


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
