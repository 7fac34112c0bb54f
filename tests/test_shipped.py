"""Every shipped site x every example, rendered for real: bash -n, shellcheck, sbatch --test-only.

The realistic InfiniBand sites name partitions, accounts, QOS, features and GPU counts the
2-node test cluster does not have. For `sbatch --test-only` each runs through a derived site
(``extends:`` the shipped one) that keeps everything else and swaps only those for what the
cluster has: partition debug, no account/qos/constraint/reservation, at most 2 GPUs, 1 CPU
per task and 1 GB per node (and scheduler slurm, for the local site's script). The "full"
experiment names its own partition, constraint, reservation and dependency, so --set clears
those.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hpctf.login.submitting import scaffold
from tests.conftest import HPCTF, REPO, require_tool

SITES = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))
EXAMPLES = {
    **{p.parent.name: p for p in sorted((REPO / "examples").glob("*/experiment.yaml"))},
    "full": REPO / "tests" / "golden" / "full.yaml",
}
NAMES = sorted([*EXAMPLES, "init"])


def hpctf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HPCTF, *args], env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def examples(tmp_path: Path) -> dict[str, Path]:
    scaffold.write(tmp_path / "init", "local", "init", False, {})
    return {**EXAMPLES, "init": tmp_path / "init" / "experiment.yaml"}


@pytest.fixture
def login_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_SITE_PATH": "",
    }


@pytest.mark.parametrize("example", NAMES)
@pytest.mark.parametrize("site", SITES)
def test_rendered_script_passes_bash_n_and_shellcheck(
    tmp_path: Path, examples: dict[str, Path], login_env: dict[str, str], site: str, example: str
) -> None:
    proc = hpctf(login_env, "render", str(examples[example]), "--site", site)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(proc.stdout)
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run([require_tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0 and lint.stdout == "", lint.stdout


def test_sites_and_examples_are_all_covered(examples: dict[str, Path]) -> None:
    """Spelled out, not globbed: a new site or example must be checked here on purpose."""
    assert SITES == ["ib-8gpu", "ib-apptainer", "ib-pyxis", "ib-suffix", "local", "local-slurm"]
    assert sorted(examples) == ["custom_loop", "digits", "full", "init", "keras_fit", "tfrecords"]


def cluster_site(site: str, directory: Path) -> str:
    """A site that extends ``site`` with what the test cluster has; returns its name."""
    shipped = yaml.safe_load((REPO / "site_configs" / f"{site}.yaml").read_text())
    derived = {
        "name": f"{site}-on-test-cluster",
        "extends": site,
        "scheduler": "slurm",  # `local` renders a script too; dry runs ask Slurm for slurm sites
        "partition": "debug",
        "account": None,
        "qos": None,
        "constraint": None,
        "reservation": None,
        "mem": "1G" if shipped.get("mem") else None,
        "cpus_per_task": 1,
        "gpus_per_node": min(shipped.get("gpus_per_node", 0), 2),
    }
    (directory / f"{derived['name']}.yaml").write_text(yaml.safe_dump(derived))
    return str(derived["name"])


@pytest.mark.slurm
@pytest.mark.parametrize("site", SITES)
def test_sbatch_test_only_accepts_every_site_and_example(
    slurm_cluster: dict[str, str], tmp_path: Path, examples: dict[str, Path], site: str
) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    name = cluster_site(site, sites)
    env = {
        **slurm_cluster,
        "HOME": str(tmp_path / "home"),
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_SITE_PATH": str(sites),
    }
    for example, path in examples.items():
        sets: list[str] = []
        if example == "full":
            for key in ("partition", "constraint", "reservation", "dependency"):
                sets += ["--set", f"resources.{key}=null"]
        proc = hpctf(env, "submit", str(path), "--site", name, "--dry-run", *sets)
        assert proc.returncode == 0, f"{site} x {example}: {proc.stderr}"
        assert "Slurm accepts this job" in proc.stderr, proc.stderr
        assert not (tmp_path / "runs").exists()
