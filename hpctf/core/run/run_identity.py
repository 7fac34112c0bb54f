"""A run directory knows where it was made: a copy or a move is refused, not run.

``cp -a RUN copy; hpctf resubmit copy`` submitted ``copy/job.sbatch``, whose ``RUN_DIR=`` still
named ``RUN``: the job trained and journalled in the original while the copy stayed ``queued``
for ever, and the "still running" guard read only the copy. The journal's first record
(``created``) names the directory it was made in; every command that would start or stop the
run's jobs (resubmit, cancel, the batch script's ``job-start``, each worker) checks it first.

Why a copy is refused rather than taken on as a new run: it holds the other run's journal (its
job ids, starts and requeue budgets), its config points at the other run's code snapshot and its
script at the other directory. Re-rendering would have to rewrite all three and still show the
other run's history as its own; a new run from the experiment is one command.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hpctf.core.errors import UserError
from hpctf.core.run.history import made_in
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import someone_elses


def check_not_a_copy(run: RunDir) -> None:
    """A UserError (one line) when ``run`` is not the directory it was created as."""
    original = made_in(run)
    if original is None or _same(original, run.path):
        return
    raise UserError(
        f"{run.path} is a copy of the run directory {original} (or was moved from there): its "
        "script, config and journal name that one, so it cannot run or be cancelled as it is; "
        f"continue the original with hpctf resubmit {original}, or start a new run with "
        "hpctf submit EXPERIMENT"
    )


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and a.samefile(b))
    except OSError:
        return False


def check_owned(run: RunDir, action: str) -> None:
    """A UserError unless the caller owns ``run``'s directory: in a shared runs root another
    user's run is theirs to ``action`` (a resubmit would sbatch their job.sbatch as you, a
    cancel record their run cancelled). Reading it (status, logs, plot) needs no such check."""
    name = someone_elses(run.path)
    if name is None:
        return
    raise UserError(
        f"{run.path} is {name}'s run: hpctf {action} acts only on runs of your own (ask {name}, "
        "or submit the experiment as a run of yours)"
    )


def slurm_comment(path: Path) -> str:
    """The ``--comment`` hpctf gives every job it submits for the run or sweep directory
    ``path``: a submit killed while sbatch ran leaves a job its journal never heard of, which
    ``cancel`` and ``resubmit`` find in Slurm's queue by this comment
    (:meth:`hpctf.login.submitting.launchers.SlurmJobs.adopt_unrecorded`)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return f"hpctf:{digest}"
