"""``hpctf sweep``, and what ``status``, ``resubmit`` and ``cancel`` do with a sweep directory.

Each point is a whole experiment: ``--set`` of its values on top of the sweep's own ``--set``,
resolved and validated as ``hpctf submit`` does
(:func:`hpctf.login.resolving.loader.load_config`), with a run directory of its own. On a Slurm
site all points go in one job array (several when there are more than MaxArraySize), ``%K``
throttled; the array's script is the single-run template with the run directory picked by the
task's index (:class:`hpctf.login.submitting.render.ArrayScript`).
On a local site the points run one after another, each as ``hpctf submit`` would run it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import journal
from hpctf.core.run.bulk_create import in_shares, record_unsynced
from hpctf.core.run.hours import hours_json, hours_text, summed
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import sync_filesystem, write_atomic
from hpctf.core.scheduler import slurm
from hpctf.core.scheduler.launcher import is_slurm, launcher_for
from hpctf.core.scheduler.slurm import FINAL_STATES
from hpctf.login.reading.hours_view import hours_of
from hpctf.login.reading.slurm_view import job_states, slurm_records
from hpctf.login.submitting.launchers import CLI, Caller, slurm_jobs
from hpctf.login.sweeps.plan import (
    chunks,
)
from hpctf.login.sweeps.sweep_dir import (
    SweepDir,
    array_size_limit,
    new_sweep_path,
    point_documents,
    refuse_unrecorded_arrays,
    status_text,
    unrecorded_arrays,
)
from hpctf.login.sweeps.sweep_record import SweepArray

if TYPE_CHECKING:  # pydantic's models: not imported for `hpctf status`
    from hpctf.core.settings.config import ResolvedConfig


def _sweep_path(config: ResolvedConfig) -> Path:
    """A new sweep directory's path (a seam the hostile-directory tests race)."""
    return new_sweep_path(config)


def array_scripts(
    config: ResolvedConfig,
    sweep_path: Path,
    run_dirs: Sequence[str],
    indices: Sequence[int],
    limit: int,
    max_running: int | None,
) -> Iterator[tuple[tuple[int, ...], str]]:
    """Each array's point indices and script, one array at a time."""
    from hpctf.login.submitting.render import ArrayScript, render  # not for `status SWEEP`

    for chunk in chunks(indices, limit):
        paths = tuple(Path(run_dirs[i]) for i in chunk.indices)
        array = ArrayScript(chunk.spec(max_running), sweep_path / "logs", paths)
        yield chunk.indices, render(config, sweep_path, array)


# Threads that write the points' journal records at once, each over a share of them: each
# record is a few metadata round trips, which on a parallel filesystem one thread would wait
# for 1,000 times in turn (more threads than this only take the GIL from each other).
RECORD_THREADS = 4


def submit_arrays(
    sweep: SweepDir, config: ResolvedConfig, indices: Sequence[int], limit: int
) -> list[str]:
    """Submit the points ``indices`` as job arrays; record each point's ``<array>_<task>`` in
    its journal and each array in sweep.json. Arrays after the first wait for the one before
    (``afterany``), so that no more than ``max_running`` points run at once across arrays."""
    run_dirs = [p["run_dir"] for p in sweep.points]
    scripts = array_scripts(config, sweep.path, run_dirs, indices, limit, sweep.max_running)
    ids: list[str] = []
    for chunk_indices, script in scripts:
        path = sweep.next_script()
        write_atomic(path, script)
        dependency = [
            config.experiment.resources.dependency or "",
            f"afterany:{ids[-1]}" if ids else "",
        ]
        extra = [f"--dependency={','.join(d for d in dependency if d)}"] if ids else []
        job_id = slurm_jobs(config.site).submit_script(
            path, extra, quiet=bool(ids), owner=sweep.path
        )
        _record_submitted([Path(run_dirs[i]) for i in chunk_indices], job_id)
        sweep.record.arrays.append(SweepArray(job_id, str(path), indices=list(chunk_indices)))
        sweep.write()
        ids.append(job_id)
        spread = f"{chunk_indices[0]}-{chunk_indices[-1]}" if len(chunk_indices) > 1 else ""
        click.echo(
            f"submitted job array {job_id}: {len(chunk_indices)} point(s) "
            f"{spread or chunk_indices[0]}"
        )
    return ids


def _record_submitted(tasks: Sequence[Path], job_id: str) -> None:
    """``submitted`` as ``<job_id>_<task>`` in the journal of each of ``tasks`` (the run
    directory of task 0, 1, ...), by :data:`RECORD_THREADS` threads at once, and the
    filesystem synced once."""

    def record(task: int) -> None:
        event = journal.submitted(f"{job_id}_{task}", array_job_id=job_id, array_task_id=task)
        record_unsynced(RunDir(tasks[task]), *event)

    in_shares(record, range(len(tasks)), RECORD_THREADS)
    if tasks:
        sync_filesystem(tasks[0])  # each record atomic on its own, all on disk in one call


def _run_locally(sweep: SweepDir, indices: Sequence[int], caller: Caller = CLI) -> int:
    """Each point in turn, as ``hpctf submit --site local`` runs one; the first non-zero exit
    status, or 0. Ctrl-C stops the sweep (the later points stay unstarted: resubmit runs
    them)."""
    from hpctf.login.submitting.pipeline import start  # not for `status SWEEP`

    first_failure = 0
    for index in indices:
        point = sweep.points[index]
        run = RunDir.open(Path(point["run_dir"]))
        click.echo(f"point {index}: {' '.join(f'{k}={v}' for k, v in point['values'].items())}")
        status = start(run, run.load_config(), caller=caller)
        if status == 130:
            return status
        first_failure = first_failure or status
    return first_failure


def sweep_status(
    path: Path, as_json: bool, sort: str | None = None, top: int | None = None
) -> None:
    """``hpctf status SWEEP_DIR``: one line per point, one squeue (and one sacct) call;
    ``--sort METRIC [--top K]``: best first (:mod:`hpctf.login.sweeps.ranking`)."""
    import json

    from hpctf.login.sweeps.ranking import rank

    record = SweepDir.read(path)
    if record.is_search:
        from hpctf.login.sweeps import search_watch  # pydantic, Optuna: searches only

        search_watch.search_status(path, as_json, sort, top)
        return
    runs = record.facts(every_point=True)
    view = job_states(runs, all_jobs=False)
    documents = point_documents(record, runs, view, time.time())
    hours = hours_of(runs)
    for run, document in zip(runs, documents, strict=True):
        document["hours"] = hours_json(hours[run.path])
    total = summed(hours.values())
    if sort:
        documents = [dict(d) for d in rank(documents, sort, top=top)]
    elif top:
        raise UserError("--top K needs --sort METRIC, e.g. --sort eval.accuracy --top 3")
    if as_json:
        notes = [view.problem] if view.problem else []
        document = {
            "sweep": str(record.path),
            "points": documents,
            "hours": hours_json(total),
            "notes": notes,
        }
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(status_text(record, documents), nl=False)
        click.echo(f"hours: {hours_text(total)} over {len(runs)} point(s)")


def sweep_cancel(path: Path) -> None:
    """``hpctf cancel SWEEP_DIR``: one scancel of every point's open job, recorded per run."""
    record = SweepDir.read(path)
    if not is_slurm(record.record.scheduler):
        raise UserError(f"{record.path} runs on a local site: stop its launcher (Ctrl-C) instead")
    if record.is_search:
        from hpctf.login.sweeps import search_watch  # pydantic, Optuna: searches only

        search_watch.search_cancel(record)
        return
    runs = record.runs()
    open_jobs = {run.run.path: run.history.open_jobs for run in runs}
    every = [job for jobs in open_jobs.values() for job in jobs] + unrecorded_arrays(record)
    if not every:
        click.echo(f"nothing to cancel: no point of {record.path} has an open job")
        return
    slurm.cancel(every)
    for run in runs:
        if open_jobs[run.run.path]:
            journal.record_cancelled(run.run, open_jobs[run.run.path])
    click.echo(
        f"cancelled {len(every)} job(s) of {sum(1 for j in open_jobs.values() if j)} point(s)"
    )


def sweep_resubmit(path: Path, extra_options: dict[str, Any]) -> int:
    """``hpctf resubmit SWEEP_DIR``: a new array over the points that did not finish (same
    throttle); points still queued or running in Slurm are left alone. The exit status: a
    local sweep's points', else 0."""
    record = SweepDir.read(path)
    given = [name for name, value in extra_options.items() if value]
    if given:
        raise UserError(f"{', '.join(given)}: not for a sweep; resubmit its points one by one")
    if record.is_search:
        from hpctf.login.sweeps import search_watch  # pydantic, Optuna: searches only

        return search_watch.search_resubmit(record)
    runs = record.runs()
    unfinished = [i for i, run in enumerate(runs) if not run.run.done.exists()]
    if not unfinished:
        click.echo(f"every point of {record.path} is done: nothing to resume")
        return 0
    config = runs[unfinished[0]].config
    if not launcher_for(config.site).slurm:
        return _run_locally(record, unfinished)
    refuse_unrecorded_arrays(record)
    current = {i: job for i in unfinished if (job := runs[i].job)}
    view = slurm_records(list(current.values()))
    if view.problem:
        raise EnvironmentProblem(f"{view.problem}; cannot tell which points still run")
    busy = [
        i
        for i, job in current.items()
        if job in view.records and view.records[job].state not in FINAL_STATES
    ]
    if busy:
        click.echo(f"note: points {', '.join(map(str, busy))} are still in Slurm; left alone")
    todo = [i for i in unfinished if i not in busy]
    if not todo:
        return 0
    submit_arrays(record, config, todo, array_size_limit(config, dry_run=False)[0])
    return 0
