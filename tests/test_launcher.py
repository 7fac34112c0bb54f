"""The launcher type (hpctf.core.scheduler.launcher): what differs between Slurm and local sites,
asked of one object; no scheduler name compared anywhere else."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hpctf.core.errors import UserError
from hpctf.core.scheduler.launcher import LocalLauncher, SlurmLauncher, is_slurm, launcher_for
from hpctf.core.settings.sites import load_named_site
from tests.conftest import REPO

LAUNCHER_MODULES = {
    Path("hpctf/core/scheduler/launcher.py"),
    Path("hpctf/login/submitting/launchers.py"),
}
COMPARISON = re.compile(r"""scheduler\W{0,4}\s*(==|!=|\bin\b)|(==|!=)\s*["'](slurm|local)["']""")


def test_no_scheduler_comparison_outside_the_launcher_modules() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "hpctf").rglob("*.py"))
        if path.relative_to(REPO) not in LAUNCHER_MODULES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if COMPARISON.search(line)
    ]
    assert found == []


def test_the_local_launcher_warns_never_and_leaves_no_node_out() -> None:
    launcher = launcher_for(load_named_site("local", os.environ))
    assert isinstance(launcher, LocalLauncher) and not launcher.slurm
    assert launcher.warning_seconds is None and launcher.container is None
    assert launcher.leave_out(None, ["node3"]) is None
    assert launcher.test_only("#!/bin/bash\n") is False  # nothing to ask
    launcher.check_exclude(None, Path("/runs/r"))
    with pytest.raises(UserError, match="--exclude needs a Slurm site; /runs/r runs on a local"):
        launcher.check_exclude("node3", Path("/runs/r"))


def test_the_slurm_launcher_warns_as_the_site_says_and_leaves_failed_nodes_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = load_named_site("local-slurm", os.environ)
    launcher = launcher_for(site)
    assert isinstance(launcher, SlurmLauncher) and launcher.slurm
    assert launcher.warning_seconds == site.preemption.warning_seconds
    launcher.check_exclude("node3", Path("/runs/r"))
    assert launcher.leave_out(None, []) is None
    assert launcher.leave_out("node1", []) == "node1"
    assert launcher.leave_out("node1", ["node3", "node4"]) == "node1,node3,node4"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launcher.test_only("#!/bin/bash\n") is False  # no sbatch on PATH: not asked
    assert (is_slurm("slurm"), is_slurm("local"), is_slurm(None)) == (True, False, False)
