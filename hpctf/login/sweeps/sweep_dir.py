"""A sweep directory and what ``hpctf status SWEEP_DIR`` says of it.

Layout::

    <runs_root>/<name>-sweep-<time>/
      sweep.json              every point (index, values, run dir) and every array submitted
      array-<n>.sbatch        the job array scripts, in the order they were submitted
      logs/                   each array's own output (slurm-<array>_<task>.out)
      code/<digest>/          the code snapshot, once for every point (named by its content:
                              hpctf.core.run.snapshot.take_shared), read-only
      <name>-<values>/        one ordinary run directory per point, its code/ a link to the
                              snapshot: it holds only what is its own (config, script, journal)

A point's run directory is a run like any other (config, journal, checkpoints): every command
that takes a RUN_DIR works on it (``hpctf resubmit POINT --update-code`` gives it a copy of
its own). Its jobs are recorded as ``<array>_<task>``
(:func:`hpctf.batch.job_commands._job_id` says why).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.listing import RunFacts
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.run.run_index import Index
from hpctf.core.run.rundir import free_path, runs_root
from hpctf.core.safe_files import write_atomic
from hpctf.core.scheduler import slurm_queries
from hpctf.core.scheduler.slurm import SlurmFailure
from hpctf.core.search.search_dir import trial_points
from hpctf.core.secrets import redact_data
from hpctf.login.reading.run_report import format_table, run_document
from hpctf.login.reading.runs import RunRecord, listed
from hpctf.login.reading.slurm_view import SlurmView, slurm_text
from hpctf.login.sweeps.plan import SLURM_DEFAULT_MAX_ARRAY_SIZE
from hpctf.login.sweeps.sweep_record import DamagedSweepRecord, NewerSweepRecord, SweepRecord

if TYPE_CHECKING:  # pydantic's models: not imported for `hpctf status`
    from hpctf.core.settings.config import ResolvedConfig

SWEEP_FILE = "sweep.json"


def is_sweep_dir(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass
class SweepDir:
    """A sweep directory and its ``sweep.json``
    (:class:`~hpctf.login.sweeps.sweep_record.SweepRecord`, read and written here only)."""

    path: Path
    record: SweepRecord

    @classmethod
    def read(cls, path: Path) -> SweepDir:
        """The sweep at ``path``; a UserError, one line naming the file, when it is none, not
        yours to read, damaged or of a newer hpctf."""
        file = path / SWEEP_FILE
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(
                f"{path}: not a sweep directory (no {SWEEP_FILE}); pass the directory that "
                "`hpctf sweep` printed"
            ) from None
        except PermissionError:
            raise UserError(
                f"{file}: not yours to read (permission denied): ask its owner"
            ) from None
        except (OSError, ValueError) as exc:
            raise UserError(f"{file}: damaged sweep record: {_one_line(exc)}") from None
        try:
            record = SweepRecord.from_json(data)
        except NewerSweepRecord as exc:
            raise UserError(f"{file}: {exc}") from None
        except DamagedSweepRecord as exc:
            raise UserError(f"{file}: damaged sweep record: {exc}") from None
        return cls(path.resolve(), record)

    def write(self) -> None:
        """sweep.json, which others may read: a secret given by --set (``env.HF_TOKEN=...``)
        or swept by --grid is written ``***`` (the points' own configs keep it, in their
        secrets.env)."""
        write_atomic(self.path / SWEEP_FILE, sweep_text(redact_data(self.record.to_json())))

    @property
    def data(self) -> dict[str, Any]:
        """The record as sweep.json holds it, a copy for reading only (for callers outside
        the sweeps room: write through :attr:`record`)."""
        return self.record.to_json()

    @property
    def is_search(self) -> bool:
        """A search (an experiment's ``sweep:``): its points are its trials' runs."""
        return self.record.is_search

    @cached_property
    def _grid_points(self) -> list[dict[str, Any]]:
        return [point.to_json() for point in self.record.points]

    @property
    def points(self) -> list[dict[str, Any]]:
        """Every point (index, values, run_dir): a grid's from sweep.json, a search's from its
        trials' run directories (:func:`hpctf.core.search.search_dir.trial_points`: index is
        the trial's number)."""
        if self.is_search:
            return trial_points(self.path)
        return list(self._grid_points)

    @property
    def max_running(self) -> int | None:
        return self.record.max_running or None

    def next_script(self) -> Path:
        return self.path / f"array-{len(self.record.arrays)}.sbatch"

    def runs(self) -> list[RunRecord]:
        """Every point's run, read in full (for commands that act on them)."""
        return [RunRecord.read(Path(point["run_dir"])) for point in self.points]

    def facts(self, every_point: bool = False) -> list[RunFacts]:
        """The points, as a listing shows them, through the sweep directory's own index
        (:mod:`hpctf.core.run.run_index`): those that can be read (a line on stderr for each
        that cannot), or with ``every_point`` each point in order (a UserError for the first
        that is no run)."""
        index = Index(self.path)
        # sweep.json names each point by its absolute path: no resolving (a stat per part).
        paths = [Path(os.path.abspath(point["run_dir"])) for point in self.points]
        if not every_point:
            runs = listed(index, paths)
        else:
            runs = []
            for path in paths:
                facts = index.facts(path)
                if facts is None:
                    raise UserError(f"{path}: not a run directory (no config.json)")
                runs.append(facts)
        index.save(keep=(r.path for r in runs))
        return runs


def unrecorded_arrays(sweep: SweepDir) -> list[str]:
    """The job arrays Slurm holds for ``sweep`` (by their comment,
    :func:`~hpctf.core.run.run_identity.slurm_comment`) that its sweep.json does not name: a
    sweep or resubmit stopped while sbatch ran. One squeue call."""
    recorded = {array.job_id for array in sweep.record.arrays}
    found = slurm_queries.commented_jobs(slurm_comment(sweep.path))
    return sorted({job.split("_")[0] for job in found} - recorded)


def refuse_unrecorded_arrays(sweep: SweepDir) -> None:
    """A UserError while Slurm holds an array of ``sweep`` that sweep.json does not name: a
    new array beside it would train its points twice."""
    if arrays := unrecorded_arrays(sweep):
        raise UserError(
            f"job array {', '.join(arrays)} of {sweep.path} is in Slurm's queue but not in its "
            f"sweep.json (a command stopped while sbatch ran): hpctf cancel {sweep.path} stops "
            "it, then resubmit"
        )


def sweep_text(data: Mapping[str, Any]) -> str:
    """``sweep.json``'s text: a key a line, and each point (each array) a line of its own.
    json's indented writer is pure Python, 20 times slower than its compact one: with every
    point's values indented it was a tenth of a 1,000-point sweep's submit."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"    {json.dumps(item)}" for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def point_documents(
    sweep: SweepDir, runs: Sequence[RunFacts], view: SlurmView, now: float
) -> list[dict[str, Any]]:
    """One mapping per point: index, values, run dir, and what ``hpctf status`` says of its
    run (state, Slurm, step, loss), its last and best evaluation. ``runs``: the points'
    facts, in the order of the sweep's points."""
    documents = []
    for point, run in zip(sweep.points, runs, strict=True):
        document = run_document(run, view, now)
        documents.append(
            {
                "index": point["index"],
                "values": point["values"],
                "run_dir": point["run_dir"],
                "job": document["job"],
                "slurm": document["slurm"],
                "state": document["state"],
                "why": document["why"],
                "step": document["step"],
                "total_steps": document["total_steps"],
                "loss": document["loss"],
                "eval": run.last_eval,
                "best_eval": run.best_eval,
            }
        )
    return documents


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def summary(documents: Sequence[Mapping[str, Any]]) -> str:
    """``3 points: 2 done, 1 running``."""
    counts = Counter(d["state"] for d in documents)
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(documents)} points: {states}"


def sweep_document(sweep: SweepDir, runs: Sequence[RunFacts]) -> dict[str, Any]:
    """A sweep as one row of ``hpctf status``: its points' states counted (from their
    journals; ``runs`` are its points, read)."""
    arrays = sweep.record.arrays
    return {
        "sweep": sweep.path.name,
        "path": str(sweep.path),
        "site": sweep.record.site,
        "created": sweep.record.created,
        "job": arrays[-1].job_id if arrays else None,
        "points": len(sweep.points),
        "states": dict(sorted(Counter(run.state.state for run in runs).items())),
    }


def status_text(sweep: SweepDir, documents: Sequence[Mapping[str, Any]]) -> str:
    """One line per point: values, job, Slurm, state, step, loss, last evaluation."""
    rows = []
    for d in documents:
        step = "-" if d["step"] is None else f"{d['step']}/{d['total_steps'] or '?'}"
        evaluation = " ".join(f"{k} {_number(v)}" for k, v in d["eval"].items()) or "-"
        values = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in d["values"].items())
        rows.append(
            (
                str(d["index"]),
                values,
                d["job"] or "-",
                slurm_text(d["slurm"]),
                d["state"],
                step,
                _number(d["loss"]),
                evaluation,
            )
        )
    header = ("POINT", "VALUES", "JOB", "SLURM", "STATE", "STEP", "LOSS", "EVAL")
    text = f"sweep {sweep.path.name}: {summary(documents)}\n"
    text += format_table(header, rows)
    for d in documents:
        if d["why"]:
            text += f"point {d['index']}: {d['state']}: {d['why']}\n"
    return text


def find_sweeps(root: Path) -> list[SweepDir]:
    """The sweep directories directly under ``root``, newest first; damaged ones skipped."""
    try:
        children = [c for c in root.iterdir() if is_sweep_dir(c)]
    except OSError:
        return []
    sweeps = []
    for child in children:
        try:
            sweeps.append(SweepDir.read(child))
        except UserError:
            continue
    return sorted(sweeps, key=lambda s: s.record.created or "", reverse=True)


def claim_sweep_dir(plan: Callable[[], Path]) -> Path:
    """Create the sweep directory ``plan()`` names (with its ``logs/``), or the next one it
    names when another sweep of the same experiment took that name in the same second: the
    mkdir is the claim, as for a run directory
    (:meth:`hpctf.login.submitting.pipeline.RunJob.create`)."""
    for _ in range(100):
        path = plan()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create {path}: {exc.strerror}") from exc
        try:
            (path / "logs").mkdir()
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create {path / 'logs'}: {exc.strerror}") from exc
        return path
    raise UserError(f"no free sweep directory name under {plan().parent}")


def array_size_limit(config: ResolvedConfig, dry_run: bool) -> tuple[int, str]:
    """The most tasks one array may have and where that number came from."""
    if config.site.sweep.max_array_size:
        return config.site.sweep.max_array_size, f"site {config.site.name}: sweep.max_array_size"
    try:
        return slurm_queries.max_array_size(), "the cluster's MaxArraySize"
    except SlurmFailure as exc:
        if not dry_run:
            raise
        return SLURM_DEFAULT_MAX_ARRAY_SIZE, f"Slurm's default MaxArraySize (not asked: {exc})"


def new_sweep_path(config: ResolvedConfig) -> Path:
    """A free path for a new sweep directory: ``<name>-sweep-<time>`` in the runs root."""
    base = f"{config.experiment.name}-sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return free_path(runs_root(config), base, "sweep directory")
