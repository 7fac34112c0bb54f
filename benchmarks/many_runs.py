"""Many run directories for the listing benchmarks, written by hpctf's own writers.

A handful of template runs is made the way hpctf makes them (``create_run_dir``: the frozen
config, the script, the code snapshot, the journal's ``created`` record), each taken to one
state by the journal's own writers (:mod:`hpctf.core.run.journal`): done, failed, preempted,
cancelled, gave up, running. The metrics come from a real finished run when there is one. Every
further run is a copy of a template by hard links (the same bytes the writers wrote, without
10,000 fsyncs per kind of file). A sweep is a ``sweep.json`` (its own writer) over such runs.

    .venv/bin/python benchmarks/many_runs.py ROOT COUNT [--sweep POINTS] [--metrics FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctf.core.run import journal
from hpctf.core.run.rundir import RunDir, create_run_dir, plan_run_dir
from hpctf.core.safe_files import write_atomic
from hpctf.core.settings.config import ResolvedConfig

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "examples" / "digits" / "experiment.yaml"


def _done(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    write_atomic(run.done, json.dumps({"step": 100}) + "\n")
    journal.record_ended(run, job, 0, "done")


def _failed(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    journal.record_ended(run, job, 1, "failed")
    journal.record_gave_up(run, job, "failed without progress (checkpoint step 0 -> 0)")


def _preempted(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    journal.record_saved_on_warning(run, job, 50, "TERM")
    journal.record_ended(run, job, 75, "preempted")


def _cancelled(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    journal.record_cancelled(run, [job])
    journal.record_ended(run, job, 130, "cancelled")


def _requeued_then_done(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")
    journal.record_ended(run, job, 1, "failed")
    journal.record_requeued(run, job, "failed: requeue 1 of 2")
    _done(run, job)


def _running(run: RunDir, job: str) -> None:
    journal.record_started(run, job, "node1", "USR2")


# Most of a long-lived runs root has ended; a few runs train now.
STATES: dict[str, Callable[[RunDir, str], None]] = {
    "done": _done,
    "failed": _failed,
    "preempted": _preempted,
    "cancelled": _cancelled,
    "requeued": _requeued_then_done,
    "running": _running,
}
SHARES = ("done",) * 5 + ("failed", "preempted", "cancelled", "requeued") * 1


def config_for(root: Path) -> tuple[ResolvedConfig, str]:
    """The digits example's config on the local site, its runs under ``root``, and its script."""
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.render import render

    env = {**os.environ, "HPCTF_RUNS_ROOT": str(root)}
    config = load_config(DIGITS, "local", ["train.steps=100"], env).config
    return config, render(config, root / "template")


def templates(root: Path, metrics: Path | None) -> dict[str, RunDir]:
    """One run per state, made by hpctf's writers, under ``root``."""
    config, script = config_for(root)
    made: dict[str, RunDir] = {}
    for number, (state, write) in enumerate(STATES.items()):
        run = plan_run_dir(config)
        run = RunDir(run.path.with_name(f"{run.path.name}-{state}"))
        create_run_dir(run, config, script)
        job = str(4242 + number)
        journal.record_submitted(run, job)
        write(run, job)
        if metrics is not None and metrics.is_file():
            shutil.copyfile(metrics, run.metrics)
        made[state] = run
    return made


def copy_by_links(template: Path, to: Path) -> None:
    """``to``: a copy of the run directory ``template``, each file a hard link."""
    for folder, _dirs, files in os.walk(template):
        target = to / os.path.relpath(folder, template)
        target.mkdir(exist_ok=True)
        for name in files:
            os.link(os.path.join(folder, name), target / name)


def many_runs(root: Path, count: int, metrics: Path | None = None) -> list[Path]:
    """``count`` run directories under ``root`` (templates included): mostly ended, 1 % running."""
    made = templates(root / ".templates", metrics)
    paths: list[Path] = []
    for index in range(count):
        state = "running" if index % 100 == 99 else SHARES[index % len(SHARES)]
        path = root / f"run-{index:06d}-{state}"
        copy_by_links(made[state].path, path)
        paths.append(path)
    shutil.rmtree(root / ".templates")  # the links keep the files
    return paths


def a_sweep(root: Path, points: int, metrics: Path | None = None) -> Path:
    """A sweep directory of ``points`` points under ``root``: its ``sweep.json`` written by the
    sweep's own writer, each point a run (mostly done)."""
    from hpctf.login.sweeps.sweep_dir import SweepDir
    from hpctf.login.sweeps.sweep_record import SweepRecord

    sweep = root / f"digits-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    (sweep / "logs").mkdir(parents=True)
    runs = many_runs(sweep, points, metrics)
    record = SweepDir(
        sweep,
        SweepRecord.from_json({
            "name": "digits",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "experiment": str(DIGITS),
            "site": "local",
            "scheduler": "local",
            "max_running": None,
            "points": [
                {"index": i, "values": {"train.seed": str(i)}, "run_dir": str(path)}
                for i, path in enumerate(runs)
            ],
            "arrays": [],
        }),
    )  # fmt: skip
    record.write()
    return sweep


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--sweep", type=int, default=0, metavar="POINTS")
    parser.add_argument("--metrics", type=Path, help="a finished run's metrics.jsonl")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    many_runs(args.root, args.count, args.metrics)
    if args.sweep:
        print(a_sweep(args.root, args.sweep, args.metrics))
    print(f"made {args.count} runs in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
