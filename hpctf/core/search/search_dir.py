"""A search's sweep directory: what ``hpctf sweep`` leaves there for the array's agents, and
what each agent records (no Optuna here; both wings read it).

Layout, beside a grid sweep's ``sweep.json``, ``array-<n>.sbatch``, ``logs/`` and
``code/<digest>/``::

    search/config.json      the base experiment, resolved and frozen once (secrets redacted;
    search/secrets.env      their values, 0600), its code/ a link to the sweep's snapshot
    study.journal           the Optuna study (:mod:`hpctf.core.search.study`)
    ask.lock.lock           held while one agent asks the study for a trial and records it
                            in its agents/ file (O_EXCL; Optuna's JournalFileOpenLock)
    agents/<task>.json      the trial array task <task> holds (and those it finished)
    <name>-trial-<NNNN>/    one ordinary run directory per trial, with its trial.json

The agent of an array task holds one trial at a time: it is written here, under the ask lock,
before the trial's run directory is made, so that a task killed at any moment finds its trial
on restart and resumes it (the same run directory), never asking for a new one in its place.
So every trial the study has RUNNING is held by an agent, but one asked by a task killed
between the ask and the record: the next agent to ask adopts it (:func:`held_trials`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctf.core.errors import DamagedRecord
from hpctf.core.safe_files import write_atomic
from hpctf.core.search.trial_ref import read_trial_ref

SEARCH_DIR = "search"
AGENTS_DIR = "agents"
ASK_LOCK = "ask.lock"
STUDY_NAME = "search"
_TRIAL_DIR = re.compile(r"-trial-(\d{4,})$")


def trial_dir_name(name: str, number: int) -> str:
    """``<name>-trial-0007``: sorted by name in trial order up to 10,000 trials."""
    return f"{name}-trial-{number:04d}"


def trial_number(path: Path) -> int | None:
    """The trial number a run directory's name carries, or None."""
    found = _TRIAL_DIR.search(path.name)
    return int(found.group(1)) if found else None


def trial_run_dirs(sweep: Path) -> list[Path]:
    """The trials' run directories in the sweep directory, in trial order (each one that has
    its config; a trial still being made is not yet one)."""
    try:
        children = list(sweep.iterdir())
    except OSError:
        return []
    found = [
        (number, child)
        for child in children
        if (number := trial_number(child)) is not None and (child / "config.json").is_file()
    ]
    return [path for _, path in sorted(found)]


@dataclass
class Agent:
    """What array task ``task`` holds: the trial ``number`` (Optuna's ``trial_id`` in the
    study), its parameters and run directory; ``finished``: the trials it told the study
    about, in order."""

    task: int
    number: int | None = None
    trial_id: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None
    finished: list[int] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.number is not None and self.run_dir is not None


def agent_file(sweep: Path, task: int) -> Path:
    return sweep / AGENTS_DIR / f"{task}.json"


def read_agent(sweep: Path, task: int) -> Agent:
    """Task ``task``'s record; an empty one when it has none yet. A damaged record raises
    DamagedRecord (the agent cannot tell which trial it held: no guess)."""
    path = agent_file(sweep, task)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Agent(task)
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise DamagedRecord(f"{path}: {exc}") from None
    try:
        if not isinstance(data, dict) or int(data["task"]) != task:
            raise ValueError(f"not the record of task {task}")
        run_dir = data.get("run_dir")
        if run_dir is not None and not isinstance(run_dir, str):
            raise ValueError("run_dir is not a path")
        return Agent(
            task=task,
            number=None if data.get("number") is None else int(data["number"]),
            trial_id=None if data.get("trial_id") is None else int(data["trial_id"]),
            params=dict(data.get("params") or {}),
            run_dir=run_dir,
            finished=[int(n) for n in data.get("finished") or []],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedRecord(
            f"{path}: damaged ({exc}): the task cannot tell which trial it held; "
            "restore it or remove it (its trial is then adopted by the next agent that asks)"
        ) from None


def write_agent(sweep: Path, agent: Agent) -> None:
    """Task ``agent.task``'s record, replaced atomically (on disk before this returns)."""
    (sweep / AGENTS_DIR).mkdir(exist_ok=True)
    write_atomic(agent_file(sweep, agent.task), json.dumps(asdict(agent), indent=2) + "\n")


def agents(sweep: Path) -> list[Agent]:
    """Every array task's record, by task (damaged ones left out)."""
    found = []
    for path in sorted((sweep / AGENTS_DIR).glob("*.json")):
        if path.stem.isdigit():
            try:
                found.append(read_agent(sweep, int(path.stem)))
            except DamagedRecord:
                continue
    return sorted(found, key=lambda a: a.task)


def held_trials(sweep: Path) -> set[int] | None:
    """The numbers of the trials the array's agents hold now; None when a record cannot be
    read (then no trial may be taken for an orphan: it may be that record's)."""
    held = set()
    for path in (sweep / AGENTS_DIR).glob("*.json"):
        if not path.stem.isdigit():
            continue
        try:
            agent = read_agent(sweep, int(path.stem))
        except DamagedRecord:
            return None
        if agent.holds and agent.number is not None:
            held.add(agent.number)
    return held


def trial_points(sweep: Path) -> list[dict[str, Any]]:
    """The trials that have a run directory, as a sweep's points: ``index`` (the trial's
    number), ``values`` (its parameters) and ``run_dir``, in trial order."""
    points = []
    for path in trial_run_dirs(sweep):
        try:
            ref = read_trial_ref(path)
        except (OSError, ValueError, KeyError, TypeError):
            ref = None
        number = trial_number(path) if ref is None else ref.number
        params = {} if ref is None else ref.params
        points.append({"index": number, "values": params, "run_dir": str(path)})
    return points
