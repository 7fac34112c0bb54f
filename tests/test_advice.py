"""validate's warnings (hpctf/login/resolving/advice.py) and the extra_sbatch options sbatch
would refuse beside the ones hpctf writes: through the real `hpctf validate`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from tests.conftest import DIGITS, write


def validate(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["validate", str(DIGITS), *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_digits_pinned_to_one_cpu_on_ib_8gpu_warns_about_8_gpus(runs_root: Path) -> None:
    code, out, err = validate("--site", "ib-8gpu", "--set", "resources.cpus_per_task=1")
    assert code == 0, err
    assert out.startswith("ok: ")
    (line,) = err.splitlines()
    assert line == (
        "warning: 1 CPU(s) for 8 GPU(s) per node (cpus_per_task 1 x tasks_per_node 1): site "
        "ib-8gpu wants at least 4 per GPU to keep them fed; set resources.cpus_per_task: 32 "
        "(or leave it to the site)"
    )


def test_the_shipped_examples_take_the_sites_cpus(runs_root: Path) -> None:
    # digits no longer pins cpus_per_task: ib-8gpu's 64 apply, and nothing is said.
    code, _out, err = validate("--site", "ib-8gpu")
    assert code == 0 and err == "", err
    # One worker per GPU with the site's 64 CPUs each: 512 for 8 GPUs, plenty.
    code, _out, err = validate("--site", "ib-8gpu", "--set", "resources.tasks_per_node=8")
    assert code == 0 and "warning" not in err, err


def test_local_sites_never_warn_about_cpus(runs_root: Path) -> None:
    code, _out, err = validate("--site", "local")
    assert code == 0 and err == "", err


def test_ports_among_the_ephemeral_ones_warn(runs_root: Path, tmp_path: Path) -> None:
    sites = write(
        tmp_path / "sites" / "mine.yaml",
        "name: mine\nextends: local-slurm\nport_range: [40000, 50000]\n",
    ).parent
    code, _out, err = validate("--site", "mine", env={"HPCTF_SITE_PATH": str(sites)})
    assert code == 0
    assert "warning: site mine's port_range 40000-50000 overlaps Linux's ephemeral ports " in err
    # The shipped ib-suffix moved out of it.
    code, _out, err = validate("--site", "ib-suffix")
    assert code == 0 and "ephemeral" not in err, err


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("--cpus-per-gpu=8", "sbatch refuses it beside --cpus-per-task"),
        ("--cpus-per-g=8", "sbatch refuses it beside --cpus-per-task"),  # getopt prefixes
        ("--ntasks-per-gpu=1", "sbatch refuses it beside --ntasks-per-node"),
        ("--ntasks-per-tres=1", "sbatch refuses it beside --ntasks-per-node"),
    ],
)
def test_extra_sbatch_that_contradicts_the_rendered_options_is_refused(
    runs_root: Path, item: str, said: str
) -> None:
    code, _out, err = validate("--site", "ib-8gpu", "--set", f"resources.extra_sbatch=[{item}]")
    assert code == 2
    assert said in err
    assert err.count("\n") == 1, err
