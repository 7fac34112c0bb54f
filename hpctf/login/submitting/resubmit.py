"""``hpctf resubmit RUN`` and :meth:`hpctf.Run.resubmit`: a new job on a run directory,
resuming from its latest checkpoint (``--from-scratch``: from step 0; ``--set``: continued
with more steps, :mod:`hpctf.login.submitting.extend`). A sweep directory is
:func:`hpctf.login.sweeps.sweep_commands.sweep_resubmit`'s."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import click

from hpctf.core.errors import DamagedRecord, EnvironmentProblem, UserError
from hpctf.core.run import checkpoint_files, journal, ownership, snapshot
from hpctf.core.run.history import RunHistory, read_history
from hpctf.core.run.run_identity import check_not_a_copy, check_owned
from hpctf.core.run.rundir import RunDir, with_snapshot
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.scheduler.slurm import FINAL_STATES
from hpctf.core.search.trial_ref import TRIAL_FILE, read_trial_ref
from hpctf.core.settings.config import ResolvedConfig
from hpctf.login.submitting.extend import extend_run, extended_config
from hpctf.login.submitting.launchers import CLI, Caller, JobLauncher, job_launcher
from hpctf.login.submitting.local_control import local_launcher, wait_for_old_workers
from hpctf.login.submitting.pipeline import start

# A Slurm node list as scontrol writes one: names, ranges in brackets, commas.
_NODELIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\[\],-]*")


def resubmit_run(
    run_dir: Path,
    exclude: str | None = None,
    retry_failed_nodes: bool = False,
    update_code: bool = False,
    from_scratch: bool = False,
    overrides: Sequence[str] = (),
    caller: Caller = CLI,
) -> int:
    """Start a new job on the run at ``run_dir``; the start's exit status (0 once sbatch took
    the job; a local site's workers' status). ``overrides`` (``KEY.PATH=VALUE``) continue a
    done or stopped run with the keys :data:`~hpctf.login.submitting.extend.EXTENDABLE_KEYS`
    names. Everything is checked before anything is written: a UserError leaves the run as
    it was."""
    run = RunDir.open(run_dir)
    check_owned(run, "resubmit")  # its job.sbatch would run as you
    check_not_a_copy(run)  # a copy's script would start the original
    _check_not_a_trial(run)
    history = read_history(run)
    history.require_whole()  # which jobs may still run must come from a whole journal
    config = run.load_config()
    _check_request(run, config, exclude, from_scratch, overrides)
    launcher = job_launcher(config.site)
    history = launcher.adopt_unrecorded(run, history)
    _check_not_running(run, history, launcher)
    claim = _claim(run, launcher.facts.slurm)
    try:
        status = _start_again(
            run,
            config,
            exclude,
            () if retry_failed_nodes else history.failed_nodes,
            update_code,
            from_scratch,
            overrides,
            caller,
        )
    except BaseException:
        ownership.give_up(run.path, claim)
        raise
    if launcher.facts.slurm:
        # The job start_run has just submitted (a record this process wrote since).
        submitted = read_history(run).submissions
        ownership.hand_over(run.path, claim, str(submitted[-1].job_id))
    return status


def _check_not_a_trial(run: RunDir) -> None:
    """A search's trial is run by its array's agents (its script is the array's): resubmitting
    the search resumes it, as itself."""
    try:
        ref = read_trial_ref(run.path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Its script would start a second array's agents beside the search's own: refused.
        raise DamagedRecord(
            f"{run.path / TRIAL_FILE}: damaged ({exc}): the run is a search's trial; "
            "hpctf resubmit SWEEP_DIR resumes it"
        ) from None
    if ref is None and _SEARCH_AGENT in _text_or_empty(run.script):
        raise UserError(
            f"{run.path} is a search's trial without its {TRIAL_FILE}: hpctf resubmit "
            f"{run.path.parent} (its sweep directory) resumes it"
        )
    if ref is not None:
        sweep = Path(ref.journal).parent
        raise UserError(
            f"{run.path} is trial {ref.number} of the search in {sweep}: hpctf resubmit {sweep} "
            "resumes it (its array's tasks resume the trials they held)"
        )


# What only a search's array script runs (templates/sbatch.sh.j2): its agent's next trial.
_SEARCH_AGENT = "-m hpctf search-next"


def _text_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _check_request(
    run: RunDir,
    config: ResolvedConfig,
    exclude: str | None,
    from_scratch: bool,
    overrides: Sequence[str],
) -> None:
    """A UserError when what was asked cannot be done to ``run``; writes nothing."""
    if overrides:
        if from_scratch:
            raise UserError("--set continues a run from its checkpoint; not with --from-scratch")
        extended_config(run, config, overrides)  # refused keys and values: nothing written
    elif run.done.exists():
        raise UserError(
            f"{run.path} is complete ({run.done} exists): nothing to resume; to train it "
            "further: hpctf resubmit RUN --set train.steps=N"
        )
    if exclude is not None and not _NODELIST.fullmatch(exclude):
        raise UserError(f"--exclude {exclude!r} is not a Slurm node list, e.g. node[3-4],node7")
    launcher_for(config.site).check_exclude(exclude, run.path)


def _check_not_running(run: RunDir, history: RunHistory, launcher: JobLauncher) -> None:
    """A UserError while a job of ``run`` may still run: two jobs on one run directory would
    write the same checkpoints. A killed local launcher's workers save and end on their own
    (launcher_watch): waited for rather than a second set started beside them (a live
    launcher is refused by the claim)."""
    if not launcher.facts.slurm:
        if local_launcher(run, history) is None:
            wait_for_old_workers(run)
        return
    for job in history.jobs:
        if job.ended:
            continue
        info = launcher.describe(job.job_id)
        state = info.get("JobState", "") if info else ""
        if state and state not in FINAL_STATES:
            raise UserError(
                f"job {job.job_id} of {run.path} is still {state}; wait for it, or "
                f"stop it with: hpctf cancel {run.path}"
            )


def _claim(run: RunDir, slurm_jobs: bool) -> ownership.Claim:
    """This resubmit's claim on ``run``: atomic, unlike the check before it (of two resubmits
    at one instant, one goes on). On Slurm the claim passes to the job sbatch gives; a local
    run is this process's own."""
    claim = ownership.claim_of("submit" if slurm_jobs else "local")
    owner = ownership.take(run.path, claim, ownership.alive, wait_for_submit_s=0)
    if owner is not None:
        stop = (
            f"stop it with: hpctf cancel {run.path}"
            if slurm_jobs
            else "stop its launcher (Ctrl-C in its terminal, or kill its pid)"
        )
        raise UserError(f"{owner.describe()} owns {run.path}; wait for it, or {stop}")
    return claim


def _start_again(
    run: RunDir,
    config: ResolvedConfig,
    exclude: str | None,
    failed: Sequence[str],
    update_code: bool,
    from_scratch: bool,
    overrides: Sequence[str],
    caller: Caller = CLI,
) -> int:
    """What a resubmit changes, once it owns the run: the extension, the checkpoints set aside,
    the code updated, the nodes left out (``failed``: those that failed under the run, unless
    --retry-failed-nodes); then the start."""
    launcher = launcher_for(config.site)
    if overrides:
        config = extend_run(run, config, overrides)
        click.echo(f"extended: {', '.join(overrides)}; resuming from step {run.checkpoint_step()}")
    if from_scratch:
        discard_checkpoints(run)
    if update_code:
        sources = [source.source for source in snapshot.read(run.path)]
        if not sources:
            raise UserError(f"{run.path} has no code snapshot to update")
        config = with_snapshot(config, run, sources)
        journal.record_code_updated(run, sources)
        for source in snapshot.read(run.path):
            click.echo(f"code: {source.describe()}")
    if (leave_out := launcher.leave_out(exclude, failed)) != exclude:
        click.echo(
            f"note: leaving out {','.join(failed)}, which failed under earlier jobs of the run "
            "(--retry-failed-nodes keeps them)",
            err=True,
        )
        exclude = leave_out
    return start(run, config, exclude, caller)


def discard_checkpoints(run: RunDir) -> None:
    """``resubmit --from-scratch``: the run's checkpoints moved aside (kept, not deleted) and
    the move recorded, so the next start trains from step 0."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        moved = checkpoint_files.set_aside(run.checkpoints, stamp)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot move the checkpoints of {run.path} aside: {exc.strerror or exc}"
        ) from exc
    if moved is None:
        click.echo(f"from scratch: {run.checkpoints} holds no checkpoint", err=True)
        return
    journal.record_checkpoints_discarded(run, moved.name)
    click.echo(f"from scratch: the checkpoints were moved to {moved}; step 0 next", err=True)
