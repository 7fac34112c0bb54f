"""Experiment and site files are input too: YAML is bounded (nesting, aliases) so a hostile
file is one line, fast and small; and the batch shell's contract (its environment, where and as
whom it runs) cannot be changed through env or extra_sbatch."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from tests.conftest import DIGITS

# --- bounded YAML ------------------------------------------------------------------------------


def alias_bomb(levels: int = 10, aliases: int = 9) -> str:
    """``aliases ** levels`` strings in a few hundred bytes, under train.args."""
    lines = ["name: bomb", "train:", "  args:"]
    lines.append(f"    a0: &a0 [{', '.join(['lol'] * aliases)}]")
    for level in range(1, levels + 1):
        lines.append(f"    a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * aliases)}]")
    return "\n".join(lines) + "\n"


# The peak is Python's own allocations (tracemalloc), not ru_maxrss: Linux keeps ru_maxrss
# across execve (getrusage(2)), so a child of a pytest process that has imported TensorFlow
# reports the parent's ~590 MB. An address-space limit ends a regression quickly instead of
# letting it take the machine's memory.
MEASURE = """
import resource, sys, time, tracemalloc
from pathlib import Path
from hpctf.core.errors import UserError
from hpctf.core.settings.sources import load_yaml
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
tracemalloc.start()
began = time.perf_counter()
try:
    load_yaml(Path(sys.argv[1]))
    said = "loaded"
except UserError as exc:
    said = str(exc)
print(time.perf_counter() - began)
print(tracemalloc.get_traced_memory()[1] >> 20)
print(said)
"""


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (alias_bomb(), 9, "more than 100,000 values once its aliases (*name) are expanded"),
        # The same under a key the schema does not know: refused before the schema looks.
        (alias_bomb().replace("train:\n  args:", "unknown:\n  more:"), 9, "more than 100,000"),
        ("name: deep\nx: " + "[" * 100_000 + "]" * 100_000 + "\n", 2, "nested deeper than 100"),
        ("[" * 100_000, 1, "nested deeper than 100 levels"),
        ("{a: " * 100_000, 1, "nested deeper than 100 levels"),
        ("- " * 100_000, 1, "nested deeper than 100 levels"),
        ("a: &a [*a]\n", 1, "an alias refers to a value that holds it"),
    ],
    ids=[
        "alias-bomb",
        "alias-bomb-unknown-key",
        "deep-nesting",
        "deep-unclosed",
        "deep-mappings",
        "deep-block-sequences",
        "recursive",
    ],
)
def test_hostile_yaml_is_one_line_fast_and_small(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    import subprocess
    import sys

    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=True
    )
    seconds, peak_mb, said = proc.stdout.splitlines()
    assert said.startswith(f"{path}:{line}: invalid YAML: {problem}"), said
    assert float(seconds) < 1.0 and int(peak_mb) < 200, (seconds, peak_mb)
    # Through the CLI: one line, exit 2 (a bug would be exit 70 with a traceback).
    result = CliRunner().invoke(cli, ["validate", str(path), "--site", "local"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def test_aliases_within_the_bound_still_work(tmp_path: Path) -> None:
    from hpctf.core.settings.sources import load_yaml

    path = tmp_path / "e.yaml"
    path.write_text(
        "base: &base {lr: 0.1, steps: 10}\ntrain:\n  args:\n    <<: *base\n    b: *base\n"
    )
    data, lines = load_yaml(path)
    assert data["train"]["args"] == {"lr": 0.1, "steps": 10, "b": {"lr": 0.1, "steps": 10}}
    assert lines[("train", "args", "b")] == 5 and lines[("base", "lr")] == 1


# --- the batch shell's contract ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("SLURM_JOB_ID", "Slurm sets it for the job"),
        ("SLURM_PROCID", "Slurm sets it for the job"),
        ("SRUN_CPUS_PER_TASK", "srun reads it as its own options"),
        ("SBATCH_TIMELIMIT", "sbatch reads it as the job's options"),
        ("HPCTF_RUNS_ROOT", "hpctf sets it"),
        ("BASH_ENV", "bash reads it to run a file in every shell the job starts"),
        ("ENV", "sh reads it"),
        ("CUDA_VISIBLE_DEVICES", "Slurm and hpctf choose the GPUs"),
        ("TF_CONFIG", "set by hpctf itself"),
    ],
)
@pytest.mark.parametrize("where", ["experiment", "site"])
def test_env_names_slurm_or_hpctf_own_are_refused(
    tmp_path: Path, runs_root: Path, name: str, why: str, where: str
) -> None:
    import yaml

    experiment = yaml.safe_load(DIGITS.read_text())
    experiment["train"]["python_path"] = [str(DIGITS.parent)]
    site = "local-slurm"
    if where == "experiment":
        experiment["env"] = {name: "1"}
    else:
        site_file = tmp_path / "mysite.yaml"
        site_file.write_text(
            yaml.safe_dump({"name": "mysite", "extends": "local-slurm", "env": {name: "1"}})
        )
        site = str(site_file)
    experiment_file = tmp_path / "e.yaml"
    experiment_file.write_text(yaml.safe_dump(experiment))
    result = CliRunner().invoke(cli, ["validate", str(experiment_file), "--site", site])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and name in result.output and why in result.output
    fine = CliRunner().invoke(
        cli, ["validate", str(experiment_file), "--site", "local-slurm", "--set", "env={}"]
    )
    assert where == "site" or fine.exit_code == 0, fine.output


@pytest.mark.parametrize(
    "item",
    ["--chdir=/tmp", "-D /tmp", "-D/tmp", "--uid=0", "--gid=0", "--get-user-env",
     "--open-mode=truncate", "--open-mode append", "--export-file=/tmp/env"],
)  # fmt: skip
def test_extra_sbatch_may_not_change_where_how_or_as_whom_the_batch_shell_runs(
    runs_root: Path, item: str
) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "validate",
            str(DIGITS),
            "--site",
            "local-slurm",
            "--set",
            f"resources.extra_sbatch=[{item}]",
        ],
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "which hpctf manages" in result.output
