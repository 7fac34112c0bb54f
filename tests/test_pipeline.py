"""The one submission pipeline (issue #31 item 1): plan -> render once -> create -> start, the
same for ``hpctf submit`` and :func:`hpctf.submit`; Slurm's failures typed at the one wrapper
(item 3)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import hpctf
from hpctf.cli import cli
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.run_identity import slurm_comment
from hpctf.core.scheduler import slurm
from hpctf.login import templating
from hpctf.login.submitting import pipeline
from tests.conftest import DIGITS, REPO, write
from tests.fake_slurm import FakeSlurm


def _tree(run_dir: Path) -> dict[str, bytes]:
    """Every file of ``run_dir`` by relative path, normalised for what two submits cannot
    share, and only that: the run directory's own path and name (which hold the second it was
    made; the job is named after it), the journal's file names (a time stamp and the writer's
    pid; kept: the order and the event) and each record's ``time``."""
    files: dict[str, bytes] = {}
    journal = sorted((run_dir / "journal").glob("*.json"))
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(run_dir))
        data = path.read_bytes().replace(str(run_dir).encode(), b"RUN_DIR")
        data = data.replace(run_dir.name.encode(), b"RUN_NAME")  # the job's name
        if path in journal:
            record = json.loads(data)
            record["time"] = "TIME"
            name = f"journal/{journal.index(path)}-{record['event']}"
            data = json.dumps(record, sort_keys=True).encode()
        files[name] = data
    return files


def _only_run(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if (p / "config.json").exists()]
    return run_dir


def test_the_cli_and_python_submit_make_byte_identical_run_directories(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    sets = ["train.steps=7", "resources.nodes=2"]
    args = ["submit", str(DIGITS), "--site", "local-slurm"]
    result = CliRunner().invoke(cli, [*args, *(f"--set={s}" for s in sets)])
    assert result.exit_code == 0, result.output
    by_cli = _only_run(runs_root)
    by_python = hpctf.submit(DIGITS, site="local-slurm", set=sets).path
    assert by_python != by_cli and by_python.parent == runs_root

    cli_files, python_files = _tree(by_cli), _tree(by_python)
    assert sorted(cli_files) == sorted(python_files)
    assert {"config.json", "job.sbatch", "journal/0-created", "journal/1-submitted"} <= set(
        cli_files
    )
    assert [name for name in cli_files if cli_files[name] != python_files[name]] == []
    assert fake_slurm.calls("sbatch") == [
        f"--parsable --comment={slurm_comment(by_cli)} {by_cli / 'job.sbatch'}",
        f"--parsable --comment={slurm_comment(by_python)} {by_python / 'job.sbatch'}",
    ]


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    """Replace ``owner.name`` with a wrapper that records each call's arguments."""
    calls: list[Any] = []
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_submit_renders_once_and_parses_the_site_template_once(
    tmp_path: Path, runs_root: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    sites = tmp_path / "sites"
    template = write(
        sites / "t.sh.j2",
        '{% extends "sbatch.sh.j2" %}{% block setup %}{{ super() }}\n# staged\n{% endblock %}\n',
    )
    write(sites / "tpl.yaml", "name: tpl\nextends: local-slurm\ntemplate: t.sh.j2\n")
    monkeypatch.setenv("HPCTF_SITE_PATH", str(sites))
    os.utime(template, ns=(1, 1))  # a version of the file no earlier test compiled
    renders = _counting(monkeypatch, pipeline, "render")
    parses = _counting(monkeypatch, templating.ENVIRONMENT, "parse")

    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "tpl"])
    assert result.exit_code == 0, result.output
    assert len(renders) == 1
    assert [kw.get("filename") for _, kw in parses] == [str(template)]
    assert "# staged\n" in (_only_run(runs_root) / "job.sbatch").read_text()

    dry = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "tpl", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert len(renders) == 2 and len(parses) == 1  # the file unchanged: compiled once
    assert len(list(runs_root.iterdir())) == 1  # --dry-run stops before create


# --- Slurm's causes, typed at the one wrapper -------------------------------------------------

CAUSES = [
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", 1,
     slurm.SlurmRefused),
    ("slurm_load_jobs error: Invalid job id specified", 1, slurm.SlurmGone),
    ("scontrol: error: Job is no longer pending execution for job 7", 1, slurm.SlurmNotPending),
    ("slurm_requeue error: Job is pending execution", 1, slurm.SlurmAlreadyPending),
    ("sacct: error: Slurm accounting storage is disabled", 1, slurm.SlurmNoAccounting),
    ("squeue: error: Unable to contact slurm controller (connect failure)", 1,
     slurm.SlurmTransient),
    ("sbatch: error: something nobody listed", 1, slurm.SlurmError),
]  # fmt: skip


@pytest.mark.parametrize(("said", "rc", "kind"), CAUSES, ids=[c[2].__name__ for c in CAUSES])
def test_each_slurm_failure_is_typed_by_its_cause(
    fake_slurm: FakeSlurm, said: str, rc: int, kind: type[slurm.SlurmFailure]
) -> None:
    fake_slurm.answer("scontrol", "", said + "\n", rc)
    with pytest.raises(slurm.SlurmFailure) as caught:
        slurm.run_command(["scontrol", "show", "config"])
    assert type(caught.value) is kind
    # A refusal is the user's (exit 2); every other cause is the environment's (exit 3).
    assert isinstance(caught.value, UserError) == (kind is slurm.SlurmRefused)
    assert isinstance(caught.value, EnvironmentProblem) == (kind is not slurm.SlurmRefused)


def test_a_missing_slurm_command_is_an_environment_fault_exit_3(
    tmp_path: Path, runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(slurm.SlurmMissing, match="sbatch not found on PATH"):
        slurm.run_command(["sbatch", "--version"])
    result = CliRunner().invoke(cli, ["submit", str(DIGITS), "--site", "local-slurm"])
    assert result.exit_code == 3
    assert re.fullmatch(r"Error: sbatch not found on PATH: [^\n]*\n", result.output)
    assert not runs_root.exists() or list(runs_root.iterdir()) == []  # nothing left behind


def test_slurm_words_are_read_only_at_the_wrapper_and_no_catch_mixes_causes() -> None:
    """Outside core/scheduler/slurm.py nothing reads a SlurmFailure's output to decide what
    happened (each cause is a type), and no handler catches a Slurm failure and a UserError
    together (an environment fault is no user mistake)."""
    wrapper = REPO / "hpctf" / "core" / "scheduler" / "slurm.py"
    reads = re.compile(r"exc\.(stderr|stdout)|[\"'] (not )?in str\(exc\)")
    mixed = re.compile(r"except \([^)]*Slurm\w*[^)]*UserError|except \([^)]*UserError[^)]*Slurm")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "hpctf").rglob("*.py"))
        if path != wrapper
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line) or mixed.search(line)
    ]
    assert found == []


@pytest.mark.tf
def test_a_rank_that_cannot_join_the_cluster_is_an_environment_fault_naming_the_peers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tensorflow as tf

    from hpctf.compute.cluster import joining
    from hpctf.compute.cluster.spec import cluster_spec
    from hpctf.core.settings.train import Train

    variables = {
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
    }
    spec = cluster_spec(variables, (20000, 30000))

    def unreachable(gpus: int, settings: Train) -> None:
        raise tf.errors.UnavailableError(None, None, "failed to connect to all addresses")

    monkeypatch.setattr(joining, "make_strategy", unreachable)
    monkeypatch.setattr(joining, "configure_failure_detection", lambda spec, settings: None)
    with pytest.raises(EnvironmentProblem) as caught:
        joining.connect(Train(script="fit.py"), spec)
    said = str(caught.value)
    assert said.startswith(f"rank 1 ({spec.workers[1]}) could not join the cluster of 2 worker(s)")
    assert f"chief {spec.workers[0]}" in said and "train.startup_timeout_seconds=" in said
    assert said.endswith("UnavailableError: failed to connect to all addresses")
    assert not isinstance(caught.value, UserError)  # exit 3, not "a bug in hpctf"
