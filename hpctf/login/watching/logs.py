"""``hpctf logs``: one rank's log across every start of a run, a separator where each start
begins; ``-f`` follows the live job, and the next one after a requeue, until the run ends.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import click

from hpctf.core.errors import UserError
from hpctf.core.printable import printable
from hpctf.core.run.history import RunHistory, RunStatus, Start
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import open_regular
from hpctf.login.reading.run_report import local_launcher_gone
from hpctf.login.reading.run_site import run_site_option
from hpctf.login.reading.runs import FINAL_RUN_STATES, RunRecord
from hpctf.login.reading.slurm_view import slurm_records, watch_share

# The first line every worker writes at each start (hpctf.compute.start.runtime.run_worker).
WORKER_HEADER = re.compile(
    rb"^\d\d:\d\d:\d\d rank \d+: host \S+ pid \d+ \(SLURMD_NODENAME [^)]*\) SLURM_PROCID "
)


def worker_starts(history: RunHistory) -> list[tuple[int, Start]]:
    """The starts (numbered from 1) that ran the worker: not those that ``job-start`` stopped
    at once (:attr:`hpctf.core.run.history.Start.refused`)."""
    return [(n, s) for n, s in enumerate(history.starts, 1) if not s.refused]


def separator(number: int, start: Start, rank: int) -> str:
    # The journal's time is data its owner wrote: escaped (hpctf.core.printable).
    # A start that lost a node (resources.spare_nodes) names it: the next start ran without it.
    lost = f"; node(s) {','.join(start.lost_nodes)} lost" if start.lost_nodes else ""
    return (
        printable(
            f"===== start {number}: job {start.job_id}, rank {rank}, started "
            f"{start.started_at}, from step {start.step}{lost} =====",
            keep_lines=False,
        )
        + "\n"
    )


class LogReader:
    """One rank's log across every start of its run, with a separator where each start
    begins (at the worker's first line), optionally only one job's part."""

    def __init__(
        self, run: RunDir, rank: int, job: str | None, shown_bytes: int | None = None
    ) -> None:
        self.run = run
        # The most of the log shown from its end on the first read (``hpctf ui``'s tail).
        self.shown_bytes = SHOWN_BYTES if shown_bytes is None else shown_bytes
        self.rank = rank
        self.job = job
        self.position = 0
        self.headers = 0
        self.showing = job is None  # before the first start's line: everything, unless --job
        self.pending = b""

    def read(self, history: RunHistory, final: bool = False) -> Iterator[str]:
        """The text the log gained since the last call, separators included. Call with the
        history read BEFORE the log, so every start whose lines are read is already known.
        Read in chunks (a huge log in bounded memory); a log shorter than what was read of it
        (truncated, as logrotate's copytruncate does) is said and read again from its start;
        a log that is not a regular file (a FIFO, a device) is one line (a UserError)."""
        path = self.run.rank_log(self.rank)
        try:
            handle = open_regular(path, f"rank {self.rank}'s log")
        except FileNotFoundError:
            return
        starts = worker_starts(history)
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if size < self.position:
                yield (
                    f"hpctf: {printable(str(path), keep_lines=False)} was truncated to {size:,} "
                    f"bytes after {self.position:,} were read: reading it from its start\n"
                )
                self.position, self.pending = 0, b""
            if self.position == 0 and size > self.shown_bytes:
                yield (
                    f"hpctf: {printable(str(path), keep_lines=False)} is {size:,} bytes: its "
                    f"last {_size_text(self.shown_bytes)} follow\n"
                )
                self.position = size - self.shown_bytes
                handle.seek(self.position)
                handle.readline()  # from the first whole line on
                self.position = handle.tell()
                # The starts whose headers are in the part left out: the n-th header is the
                # n-th start's, counted from the log's beginning.
                shown = sum(1 for line in handle if WORKER_HEADER.match(line))
                self.headers = max(len(starts) - shown, 0)
                self.showing = self.job is None
            handle.seek(self.position)
            while chunk := handle.read(CHUNK_BYTES):
                self.position += len(chunk)
                lines = (self.pending + chunk).split(b"\n")
                self.pending = lines.pop()
                yield from self._shown(lines, starts)
        if final and self.pending:
            lines, self.pending = [self.pending], b""
            yield from self._shown(lines, starts)

    def _shown(self, lines: list[bytes], starts: list[tuple[int, Start]]) -> Iterator[str]:
        for line in lines:
            if WORKER_HEADER.match(line):
                self.headers += 1
                # The n-th worker header begins the n-th start that ran the worker; a header
                # the journal does not know of yet belongs to its latest start.
                index = min(self.headers, len(starts)) - 1
                if starts:
                    number, start = starts[index]
                    self.showing = self.job is None or start.job_id == self.job
                else:
                    number, start = self.headers, Start(job_id="?", step=0)
                    self.showing = self.job is None
                if self.showing:
                    yield separator(number, start, self.rank)
            if self.showing:
                yield line.decode("utf-8", errors="replace") + "\n"


def _size_text(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


# What one read of a log takes at a time: its memory, whatever the log's size.
CHUNK_BYTES = 1 << 20
# The most of a log shown from its end: a log bigger than this (a planted or runaway one) is
# shown by its tail, in bounded time.
SHOWN_BYTES = 64 << 20


def batch_output(run: RunDir, history: RunHistory, job_id: str) -> Path | None:
    """Job ``job_id``'s own output (the batch shell's: job-start's line at each start, srun's
    and job-end's), appended across its starts: ``slurm-<id>.out``, an array task's under its
    own SLURM_JOB_ID. None when there is none."""
    ids = [job_id, *history.slurm_job_ids(job_id)]
    for found in ids:
        path = run.logs / f"slurm-{found}.out"
        if re.fullmatch(r"\d+", found) and path.is_file():
            return path
    return None


def _job_alive(run: RunRecord) -> bool | None:
    """Whether Slurm still runs or holds the run's current job (None: it did not answer)."""
    if not run.slurm or run.job is None:
        return False
    # A watcher: the user's shared view of the queue, not a query of its own each look.
    view = slurm_records([run.job], shared_s=watch_share([run.run.path]))
    record = view.records.get(run.job)
    if record is not None:
        return not record.final
    return False if view.answered else None


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Which task's log.")
@click.option("--job", "job_id", metavar="ID", help="Only the part written by job ID.")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing, across requeues, until the run ends."
)
@run_site_option
def logs(
    run_dir: Path, rank: int, job_id: str | None, follow: bool, site_name: str | None
) -> None:
    """Print one rank's log of RUN_DIR across every start, a separator line where each begins.

    With -f, follow the live job, and the next one after a requeue, until the run is done,
    failed, gave up or was cancelled (Slurm is asked at most every 30 s, and only while the
    journal alone cannot tell).
    """
    run = RunRecord.read(run_dir)
    check_request(run, rank, job_id, follow)
    reader = LogReader(run.run, rank, job_id)
    if follow:
        _follow(run_dir, reader)
    else:
        _print_once(run, reader, job_id)


def check_request(run: RunRecord, rank: int, job_id: str | None, follow: bool) -> None:
    """A UserError for a job the run never had, or a rank without a log (while following, only
    once the run is over: a rank's log may come with its start)."""
    path = run.run.rank_log(rank)
    if job_id is not None and job_id not in run.state.jobs:
        raise UserError(
            f"{run.run.path}: no job {job_id}; its jobs: {', '.join(run.state.jobs) or 'none yet'}"
        )
    if not path.exists() and (not follow or run.state.state in FINAL_RUN_STATES):
        ranks = sorted(p.stem.split("-")[1] for p in run.run.logs.glob("rank-*.log"))
        raise UserError(
            f"{path}: no log for rank {rank}; ranks with logs: {', '.join(ranks) or 'none yet'}"
        )


def _print_once(run: RunRecord, reader: LogReader, job_id: str | None) -> None:
    """The rank's log as it is, and with ``job_id`` that job's own output after it."""
    for text in reader.read(run.history, final=True):
        click.echo(text, nl=False)
    output = batch_output(run.run, run.history, job_id) if job_id is not None else None
    if output is not None:
        click.echo(f"===== job {job_id}: its own output, every start ({output}) =====")
        click.echo(output.read_text(encoding="utf-8", errors="replace"), nl=False)


def _follow(run_dir: Path, reader: LogReader) -> None:
    """Print the rank's log as it grows, across requeues, until the run is over."""
    next_check = 0.0
    gone = 0
    last_state = ""
    while True:
        current = RunRecord.read(run_dir)
        for text in reader.read(current.history):
            click.echo(text, nl=False)
        state = current.state.state
        # The start ended; a requeue may follow.
        stopped = state in (RunStatus.FAILED, RunStatus.PREEMPTED)
        if state != last_state:  # a failed start: ask soon, once job-end had time to requeue
            gone, last_state = 0, state
            next_check = min(next_check, time.monotonic() + (3 if stopped else 30))
        over = state in FINAL_RUN_STATES - {RunStatus.FAILED}
        # A local launcher gone from this host recorded no end (SIGKILL, a full disk): over.
        launcher = local_launcher_gone(current.run.path, current.slurm, state)
        over = over or launcher is not None
        if not over and time.monotonic() >= next_check:
            # The journal cannot always tell: a failed start may be requeued by Slurm itself
            # (a node failure), and a job killed hard never records its end.
            alive = _job_alive(current) if current.slurm else not stopped
            if stopped:
                over = alive is not True
            else:
                gone = gone + 1 if alive is False else 0
                over = gone >= 2
            next_check = time.monotonic() + (10 if stopped else 30)
        if over:
            for text in reader.read(RunRecord.read(run_dir).history, final=True):
                click.echo(text, nl=False)
            return
        time.sleep(1)
