"""Who owns a run directory: at most one job (or local launch, or resubmit on its way to a job)
trains it at a time, however it was started.

Slurm's ``--dependency=singleton`` (the rendered script's, with a job name unique to the run)
keeps a user's second job on one run waiting; this claim is for what Slurm cannot see: a
second job started while the first is held or pending, a job of another user, a local launch,
two ``hpctf resubmit`` at one instant (issue #24: check-then-act let both submit).

A claim is one small JSON file per generation, ``RUN_DIR/owner/<generation>.json``; the owner
is the highest generation. A new owner takes generation N+1 only when generation N's owner is
gone (its job final or forgotten by Slurm, its process dead, its resubmit too old), by a hard
link of a file of its own to that name: ``link(2)`` is atomic on local filesystems, NFS and
Lustre, so of two contenders for N+1 exactly one wins, and the other reads the winner. On NFS
a retransmitted LINK can report EEXIST for a link that was made: as open(2) advises for
lock files over NFS, the link count of our own file then tells (2: we won). No flock or fcntl
lock: unreliable on parallel filesystems, and gone with the node that held it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctf.core.errors import EnvironmentProblem
from hpctf.core.scheduler import slurm

# A job id as Slurm writes it: a job, or an array task (<array>_<task>). Nothing else read from
# the run directory reaches a Slurm command.
JOB_ID = re.compile(r"^\d+(_\d+)?$")
# How long a resubmit's claim stands without turning into its job's (sbatch hangs no longer:
# the wrapper's timeout is 60 s).
SUBMIT_CLAIM_S = 90.0


LOCAL_LAUNCH = "local"  # a Claim's kind for `hpctf submit --site local`'s launcher


@dataclass(frozen=True)
class Claim:
    """One owner: a Slurm job (``kind`` job, ``job_id``), a local launch (``local``: the
    launcher's ``pid`` on ``host``) or an ``hpctf resubmit`` until sbatch answers (``submit``)."""

    kind: str
    host: str
    pid: int
    uid: int
    time: float
    job_id: str | None = None
    generation: int = 0

    @property
    def local_launch(self) -> bool:
        """Whether a local launcher (``hpctf submit --site local``) holds the run."""
        return self.kind == LOCAL_LAUNCH

    def describe(self) -> str:
        if self.kind == "job":
            return f"job {self.job_id}"
        what = "hpctf resubmit" if self.kind == "submit" else "a local run"
        return f"{what} (pid {self.pid} on {self.host})"

    def same_owner(self, other: Claim) -> bool:
        if self.kind == "job" or other.kind == "job":
            return self.kind == other.kind and self.job_id == other.job_id
        return (self.kind, self.host, self.pid) == (other.kind, other.host, other.pid)


def claim_of(kind: str, job_id: str | None = None) -> Claim:
    """A claim by this process (``kind`` local or submit) or by job ``job_id`` (``job``)."""
    return Claim(kind, socket.gethostname(), os.getpid(), os.getuid(), time.time(), job_id)


def claims_dir(run_path: Path) -> Path:
    return run_path / "owner"


def _read(path: Path, generation: int) -> Claim | None:
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        claim = Claim(
            kind=str(data["kind"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            uid=int(data["uid"]),
            time=float(data["time"]),
            job_id=None if data.get("job_id") is None else str(data["job_id"]),
            generation=generation,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if claim.kind not in ("job", "local", "submit"):
        return None
    if claim.kind == "job" and not JOB_ID.fullmatch(claim.job_id or ""):
        return None
    return claim


def _name(generation: int) -> str:
    return f"{generation:06d}.json"


def current(run_path: Path) -> tuple[int, Claim | None]:
    """The highest generation and its claim (None: no claim yet, or a damaged file, which
    names no live owner). The listing is a hint (an NFS client may cache it): names past it
    are probed one by one."""
    folder = claims_dir(run_path)
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    numbers = [int(n[:-5]) for n in names if re.fullmatch(r"\d{6}\.json", n)]
    top = max(numbers, default=0)
    while (folder / _name(top + 1)).exists():
        top += 1
    return top, (_read(folder / _name(top), top) if top else None)


def _link(run_path: Path, generation: int, claim: Claim) -> bool:
    """Create generation ``generation`` as ``claim``, atomically; False if it exists."""
    folder = claims_dir(run_path)
    data = {k: v for k, v in asdict(claim).items() if k != "generation"}
    own = folder / f".{claim.host}.{claim.pid}.{time.monotonic_ns()}.tmp"
    try:
        folder.mkdir(exist_ok=True)
        # O_EXCL: never through a link someone planted at the name (hpctf.core.safe_files).
        fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data))
        try:
            os.link(own, folder / _name(generation))
            return True
        except FileExistsError:
            return own.stat().st_nlink == 2  # the NFS retransmit case (open(2), O_EXCL)
        finally:
            own.unlink(missing_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot claim {run_path}: {exc.strerror or exc}") from exc


def take(
    run_path: Path,
    mine: Claim,
    alive: Callable[[Claim], bool],
    wait_for_submit_s: float = SUBMIT_CLAIM_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Claim | None:
    """Make ``mine`` the owner of the run at ``run_path``, unless another owner is ``alive``:
    returns None when ``mine`` owns it (already, or now), else the live owner. A resubmit's
    claim is waited for (``wait_for_submit_s``) while it lasts: it becomes its job's claim
    once sbatch answers, and that job may be this one."""
    deadline = time.monotonic() + wait_for_submit_s
    while True:
        generation, owner = current(run_path)
        if owner is not None and owner.same_owner(mine):
            return None
        if owner is not None and alive(owner):
            if owner.kind == "submit" and mine.kind == "job" and time.monotonic() < deadline:
                sleep(0.5)
                continue
            return owner
        if _link(run_path, generation + 1, mine):
            return None


def hand_over(run_path: Path, mine: Claim, job_id: str) -> None:
    """The resubmit that owns the run (``mine``) passes it to the job sbatch gave it."""
    generation, owner = current(run_path)
    if owner is not None and owner.same_owner(mine):
        _link(run_path, generation + 1, Claim(**{**asdict(mine), "kind": "job", "job_id": job_id}))


def give_up(run_path: Path, mine: Claim) -> None:
    """A resubmit that submitted nothing leaves its claim behind it: the run has no owner."""
    generation, owner = current(run_path)
    if owner is not None and owner.same_owner(mine):
        (claims_dir(run_path) / _name(generation)).unlink(missing_ok=True)


def process_alive(claim: Claim) -> bool:
    """Whether the process of a local or submit claim may still live: on this host, its pid
    runs; elsewhere nobody here can tell, so a submit claim lives its time and a local one
    lives on (the line naming it says how to free the run)."""
    if claim.kind == "submit" and time.time() - claim.time > SUBMIT_CLAIM_S:
        return False
    if claim.host != socket.gethostname():
        return True
    try:
        os.kill(claim.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(claim.pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits for its parent to reap it (a killed launcher whose
    parent is busy or gone): it trains nothing. Linux's /proc tells; elsewhere, no."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def alive(claim: Claim) -> bool:
    """Whether ``claim``'s owner may still train the run: a job that Slurm has not ended (any
    state but a final one; forgotten by slurmctld means ended), a process that may live
    (:func:`process_alive`). Raises SlurmFailure when Slurm cannot answer."""
    if claim.kind != "job":
        return process_alive(claim)
    info = slurm.job_info(str(claim.job_id))
    return info is not None and info.get("JobState", "") not in slurm.FINAL_STATES
