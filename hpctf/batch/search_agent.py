"""``hpctf search-next``: the agent of one task of a search's job array, between its trials.

The array's script (``templates/sbatch.sh.j2``, its search variant) loops: ``search-next``
prints the run directory this task trains next, then ``job-start``, ``srun hpctf worker`` and
``job-end`` run it exactly as a single run's script does, then ``search-next --after-run``
again. Each call:

1. reads the trial this task holds (``SWEEP/agents/<task>.json``). A trial whose run ended
   (done, pruned, failed, gave up) is told to the study and dropped. A trial whose run has not
   ended is resumed: the same run directory, never a new trial. After a run (``--after-run``)
   an unfinished trial means job-end requeued this job (a preemption, the walltime) or left the
   run to a resubmit: the task ends (exit 99), and its next start resumes the trial.
2. asks the study for a new trial while fewer than the budget have been asked; records it
   as this task's before its run directory exists, then makes that directory (the base
   experiment with the trial's parameters, :func:`hpctf.core.search.trial_config.with_params`),
   its ``trial.json`` and its ``submitted`` record for this task's job.

Exit status: 0 with the run directory on stdout; 99 when this task has nothing more to do.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import click

from hpctf.core.errors import NOT_STARTING_EXIT, DamagedRecord, EnvironmentProblem, UserError
from hpctf.core.run import journal
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir, create_point, remove_new_run_dir
from hpctf.core.safe_files import write_atomic
from hpctf.core.search import trials
from hpctf.core.search.search_dir import (
    SEARCH_DIR,
    STUDY_NAME,
    Agent,
    agent_file,
    read_agent,
    trial_dir_name,
    write_agent,
)
from hpctf.core.search.study import JOURNAL_FILE, trial_budget
from hpctf.core.search.trial_config import with_params
from hpctf.core.search.trial_ref import TRIAL_FILE, TrialRef, trial_ref_text
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.search import Search


@dataclass(frozen=True)
class ArrayTask:
    """This task of the search's array: the sweep directory, its index, its job handle
    (``<array>_<task>``) and the array's id."""

    sweep: Path
    task: int
    handle: str
    array_job_id: str

    @classmethod
    def of(cls, sweep: Path, env: Mapping[str, str]) -> ArrayTask:
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        handle = journal.job_handle(env)
        if not (array and task and task.isdigit() and handle):
            raise EnvironmentProblem(
                "SLURM_ARRAY_JOB_ID/SLURM_ARRAY_TASK_ID are not set: search-next runs in a "
                "task of a search's job array"
            )
        return cls(sweep.resolve(), int(task), handle, array)


@dataclass(frozen=True)
class Base:
    """The search's base config (resolved once by ``hpctf sweep``), its search and budget."""

    config: ResolvedConfig
    search: Search
    budget: int

    @classmethod
    def read(cls, sweep: Path) -> Base:
        config = RunDir(sweep / SEARCH_DIR).load_config()
        search = config.experiment.sweep
        if search is None:
            raise UserError(f"{sweep / SEARCH_DIR}: the base experiment has no sweep: section")
        return cls(config, search, trial_budget(search))


def next_run(task: ArrayTask, after_run: bool, say: Callable[[str], None]) -> Path | None:
    """The run directory this task trains next, or None when it has nothing more to do
    (the module's docstring says how it is chosen)."""
    base = Base.read(task.sweep)
    journal_file = task.sweep / JOURNAL_FILE
    agent = read_agent(task.sweep, task.task)
    new = False
    while True:
        if agent.holds:
            run = RunDir(_trial_path(task, base, agent))
            ended = _ended(task, base, agent, run)
            if ended is None:
                if after_run:
                    say(
                        f"hpctf: trial {agent.number} is not over; this task ends, its next "
                        "start resumes it"
                    )
                    return None
                if not new:
                    _note_resumed(task, run)
                doing = "takes" if new else "resumes"
                say(f"hpctf: task {task.task} {doing} trial {agent.number}: {run.path}")
                return run.path
            trials.tell(journal_file, base.search, int(str(agent.number)), ended)
            metric = base.search.objective.metric
            said = f": {ended.why}" if ended.value is None else f" ({metric} {ended.value:.6g})"
            say(f"hpctf: trial {agent.number} {ended.end}{said}")
            agent = Agent(task.task, finished=[*agent.finished, int(str(agent.number))])
            write_agent(task.sweep, agent)

        def hold(asked: trials.Asked, agent: Agent = agent) -> None:
            """Recorded under the ask lock, before the run exists: a restart finds its trial."""
            write_agent(task.sweep, _holding(task, base, agent, asked))

        asked = trials.ask(task.sweep, journal_file, base.search, base.budget, hold)
        if asked is None:
            say(f"hpctf: the search's {base.budget} trial(s) are all asked; task {task.task} ends")
            return None
        agent = _holding(task, base, agent, asked)
        after_run, new = False, True  # a new trial: run it


def _holding(task: ArrayTask, base: Base, agent: Agent, asked: trials.Asked) -> Agent:
    """``agent`` holding the trial ``asked``, its run directory the sweep's for its number."""
    path = task.sweep / trial_dir_name(base.config.experiment.name, asked.number)
    return replace(
        agent, number=asked.number, trial_id=asked.trial_id, params=asked.params, run_dir=str(path)
    )


def _trial_path(task: ArrayTask, base: Base, agent: Agent) -> Path:
    """The run directory of the trial ``agent`` holds: the one the sweep names for its
    number, which the record must name too (it is removed when half-made: never a path read
    from a file alone)."""
    path = task.sweep / trial_dir_name(base.config.experiment.name, int(str(agent.number)))
    if Path(str(agent.run_dir)) != path:
        raise DamagedRecord(
            f"{agent_file(task.sweep, task.task)}: trial {agent.number}'s run directory is "
            f"{path}, not {agent.run_dir}"
        )
    return path


def _ended(task: ArrayTask, base: Base, agent: Agent, run: RunDir) -> trials.Outcome | None:
    """How the held trial ended, making its run directory first when the task was stopped
    before it existed; a trial whose parameters the experiment refuses ends failed."""
    if (run.path / TRIAL_FILE).is_file():
        return trials.outcome(run, base.search.objective)
    remove_new_run_dir(run)  # a start stopped half-way through making it: nothing ran there
    try:
        _make_trial_run(task, base, agent, run)
    except UserError as exc:
        return trials.Outcome("fail", why=str(exc))
    return None


def _make_trial_run(task: ArrayTask, base: Base, agent: Agent, run: RunDir) -> None:
    """The trial's run directory: the base with its parameters, the shared code, the array's
    script, ``trial.json`` and the ``submitted`` record of this task's job."""
    config = with_params(base.config, agent.params)
    script = _array_script(task.sweep)
    create_point(run, config, script, (task.sweep / SEARCH_DIR / "code").resolve())
    ref = TrialRef(
        journal=str(task.sweep / JOURNAL_FILE),
        study=STUDY_NAME,
        number=int(str(agent.number)),
        trial_id=int(str(agent.trial_id)),
        params=agent.params,
        objective=base.search.objective,
        pruner=base.search.pruner,
    )
    write_atomic(run.path / TRIAL_FILE, trial_ref_text(ref))
    journal.record_submitted(
        run, task.handle, array_job_id=task.array_job_id, array_task_id=task.task
    )


def _array_script(sweep: Path) -> str:
    """The text of the array's newest script: the one that runs the trial, kept in its run
    directory as a run keeps the script of its job."""
    scripts = sorted(sweep.glob("array-*.sbatch"), key=lambda p: int(p.stem.split("-")[1]))
    return scripts[-1].read_text(encoding="utf-8") if scripts else ""


def _note_resumed(task: ArrayTask, run: RunDir) -> None:
    """A trial resumed by a new job (``hpctf resubmit SWEEP``'s array): its ``submitted``
    record, as a resubmit of the run would write. A requeued job starting again is the same
    job: nothing to add."""
    submitted = read_history(run).submissions
    if submitted and str(submitted[-1].job_id) == task.handle:
        return
    journal.record_submitted(
        run, task.handle, array_job_id=task.array_job_id, array_task_id=task.task
    )


@click.command("search-next", hidden=True)
@click.argument("sweep_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--after-run", is_flag=True, help="This task has just run its trial.")
def search_next(sweep_dir: Path, after_run: bool) -> None:
    """Print the run directory this array task of the search in SWEEP_DIR trains next; exit
    NOT_STARTING_EXIT when it has nothing more to do."""
    # Slurm ends a job by sending SIGTERM to every process of the batch step: this short
    # bookkeeping (ask the study, record the trial, tell it an end) finishes rather than die
    # holding the ask lock or half-way through its records; the batch shell's trap then ends
    # the task, and SIGKILL after the site's KillWait still bounds it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    task = ArrayTask.of(sweep_dir, os.environ)
    path = next_run(task, after_run, say=lambda text: click.echo(text, err=True))
    if path is None:
        sys.exit(NOT_STARTING_EXIT)
    click.echo(str(path))


COMMANDS = (search_next,)
