"""The remote section: ``hpctf status`` of 1,000 runs from a laptop through SSH (a real
sshd on this machine, tests/sshd.py, over the open multiplexed connection) against the same
command run on the login side. Needs root (sshd, and its throwaway user)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import DIGITS, BenchError, Harness, median, say

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/sshd.py

RUNS = 1000
GOAL_S = 2.0


def make_runs(runs: Path, count: int) -> None:
    """``count`` run directories (config, script, code, the journal's created record) under
    ``runs``, as ``hpctf render -o`` leaves them, in one process."""
    from hpctf.core.run.rundir import RunDir, create_run_dir
    from hpctf.login.resolving.loader import load_config
    from hpctf.login.submitting.render import render

    env = {**os.environ, "HPCTF_RUNS_ROOT": str(runs)}
    config = load_config(DIGITS, "local-slurm", [], env).config
    for index in range(count):
        run = RunDir(runs / f"digits-{index:04d}")
        create_run_dir(run, config, render(config, run.path))


class RemoteBench(Harness):
    def remote(self) -> dict[str, Any]:
        from tests import sshd

        why = sshd.usable()
        if why:
            raise BenchError(f"remote: {why}")
        checkout = sshd.reachable_checkout()  # the clone may sit where the login user cannot read
        setup = sshd.set_up(None, checkout)
        try:
            count = 20 if self.sizes.login_runs == 1 else RUNS
            say(f"remote: {count} run directories on the cluster side")
            make_runs(setup.runs, count)
            owner = sshd.ensure_user()
            subprocess.run(["chown", "-R", f"{owner.pw_uid}:{owner.pw_gid}", str(setup.runs)],
                           check=True)  # fmt: skip
            laptop = [*self.hpctf, "status", "--site", "cluster", "--all"]
            login_side = {**setup.env, "HPCTF_ON_LOGIN": "1"}
            commands = {
                "through ssh": (laptop, setup.env),
                "on the login side": (laptop, login_side),
            }

            def once(argv: list[str], env: dict[str, str]) -> float:
                started = time.perf_counter()
                proc = subprocess.run(argv, env=env, capture_output=True, check=False)
                if proc.returncode != 0:
                    raise BenchError(f"{' '.join(argv)}: {proc.stderr.decode()[-2000:]}")
                if proc.stdout.decode().count("digits-") < count:
                    said = (proc.stdout[-300:] + proc.stderr[-300:]).decode(errors="replace")
                    raise BenchError(f"status listed fewer than {count} runs: {said}")
                return time.perf_counter() - started

            for argv, env in commands.values():  # opens the connection; warms both sides
                once(argv, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(max(3, self.sizes.login_runs // 3)):
                for name, (argv, env) in commands.items():
                    times[name].append(round(once(argv, env), 4))
        finally:
            setup.stop()
            sshd.release_checkout(checkout)
        ssh, local = median(times["through ssh"]), median(times["on the login side"])
        self.row(
            benchmark=f"remote: `hpctf status` of {count} runs through SSH",
            hpctf=f"{ssh:.3f} s",
            baseline=f"{local:.3f} s (the same command on the login side)",
            result=f"{ssh / local:.2f}x; +{ssh - local:.3f} s",
            goal=f"<= {GOAL_S} s",
            met=ssh <= GOAL_S,
        )
        return {"runs": count, "times_s": times, "median_ssh_s": ssh, "median_login_s": local,
                "goal_s": GOAL_S, "met": ssh <= GOAL_S}  # fmt: skip
