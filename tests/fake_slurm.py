"""Fake Slurm commands at the subprocess boundary, for the login side's unit tests: squeue,
sacct, scancel, scontrol and sbatch first on PATH (the ``fake_slurm`` fixture of conftest.py),
their answers in Slurm's formats, and a run directory submitted through them."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from hpctf.cli import cli
from tests.conftest import DIGITS


class FakeSlurm:
    """squeue, sacct, scancel, scontrol and sbatch first on PATH: each appends its argv to
    ``calls/<name>`` and answers from ``answers/<name>.{out,err,rc}``."""

    NAMES = ("squeue", "sacct", "scancel", "scontrol", "sbatch")

    def __init__(self, root: Path) -> None:
        self.bin = root / "fakeslurm"
        self.calls_dir = root / "fakeslurm-calls"
        self.answers = root / "fakeslurm-answers"
        for directory in (self.bin, self.calls_dir, self.answers):
            directory.mkdir()
        for name in self.NAMES:
            script = self.bin / name
            script.write_text(
                "#!/bin/sh\n"
                f'echo "$*" >> {self.calls_dir / name}\n'
                f"cat {self.answers / name}.out 2>/dev/null\n"
                f"cat {self.answers / name}.err >&2 2>/dev/null\n"
                f"exit $(cat {self.answers / name}.rc 2>/dev/null || echo 0)\n"
            )
            script.chmod(script.stat().st_mode | stat.S_IEXEC)
        self.answer("sbatch", "4242\n")
        self.answer("sacct", "", "Slurm accounting storage is disabled\n", 1)

    def answer(self, name: str, out: str = "", err: str = "", rc: int = 0) -> None:
        (self.answers / f"{name}.out").write_text(out)
        (self.answers / f"{name}.err").write_text(err)
        (self.answers / f"{name}.rc").write_text(str(rc))

    def calls(self, name: str) -> list[str]:
        path = self.calls_dir / name
        return path.read_text().splitlines() if path.exists() else []

    def forget(self) -> None:
        for path in self.calls_dir.iterdir():
            path.unlink()


def squeue_line(job: str, state: str, reason: str = "None", nodes: str = "node[1-2]") -> str:
    return f"{job}|{state}|{reason}|2026-12-01T04:29:39|1:02|{nodes}\n"


def sacct_line(job: str, state: str, exit_code: str = "0:0") -> str:
    return (
        f"{job}|{state}|None|{exit_code}|2026-12-01T04:29:39|2026-12-01T04:31:00|00:01:21|node1\n"
    )


def new_run(runs_root: Path, fake: FakeSlurm) -> Path:
    """A run directory on the local-slurm site, as `hpctf submit` leaves it (job 4242)."""
    before = set(runs_root.iterdir()) if runs_root.exists() else set()
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 0, result.output
    (path,) = set(runs_root.iterdir()) - before
    return path


def fake_command(bin_dir: Path, name: str, script: str) -> Path:
    """A fake Slurm command that records its argv (one line per call) beside itself."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/{name}.calls\n{script}\n')
    path.chmod(0o755)
    return bin_dir / f"{name}.calls"


def fake_checkpoint(directory: Path, step: int, shards: int = 1) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ckpt-{step}.index").write_bytes(b"i")
    for shard in range(shards):
        (directory / f"ckpt-{step}.data-{shard:05d}-of-{shards:05d}").write_bytes(b"d")
