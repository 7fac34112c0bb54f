"""hpctf from Python (issue #20): ``import hpctf`` stays light, the API goes through the CLI's
functions (a fake sbatch/scontrol/squeue at the subprocess boundary), ``resubmit --set``
extends a done run, ``status SWEEP --sort`` ranks the points. The real runs are in
tests/test_notebook.py (the test cluster) and tests/test_extend_local.py (local workers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import hpctf
from hpctf.cli import cli
from hpctf.core.errors import UserError
from hpctf.core.run import journal
from hpctf.core.run.history.runstate import run_state
from hpctf.core.run.rundir import RunDir
from hpctf.login.sweeps.ranking import default_mode, rank
from tests.conftest import DIGITS, REPO, write
from tests.fake_slurm import FakeSlurm, squeue_line


def test_import_hpctf_is_light_and_the_api_loads_on_first_use() -> None:
    code = (
        "import sys, hpctf\n"
        "light = not any(m in sys.modules for m in ('tensorflow', 'click', 'hpctf.python_api'))\n"
        "print(light, hpctf.submit.__module__, hpctf.Sweep.__name__, 'tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "hpctf.python_api.submit_api", "Sweep", "False"]
    with pytest.raises(AttributeError):
        hpctf.nothing  # noqa: B018


def test_a_run_from_python_submits_reads_and_extends_through_the_cli_functions(
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    run = hpctf.submit(DIGITS, site="local-slurm", set={"train.steps": 300})
    assert run.path.parent == runs_root and len(fake_slurm.calls("sbatch")) == 1
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "Priority"))
    document = run.status()
    assert (document["job"], document["state"], document["slurm"]["state"]) == (
        "4242", "queued", "PENDING"
    )  # fmt: skip
    cli_json = CliRunner().invoke(cli, ["status", str(run.path), "--json"])
    assert json.loads(cli_json.stdout)["runs"][0].keys() == document.keys()
    with pytest.raises(TimeoutError):
        run.wait(timeout=0.2, poll=0.1)
    assert [r.path for r in hpctf.runs()] == [run.path]
    with pytest.raises(UserError, match="no log for rank 0"):
        run.logs()

    # The run ends done at step 300, with metrics rows.
    rows = [{"step": 300, "loss": 0.1}, {"step": 300, "eval": {"accuracy": 0.9}}]
    write(run.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    write(run.path / "DONE", '{"step": 300, "eval": {"accuracy": 0.9}}\n')
    RunDir(run.path).record("started", job_id="4242", step=0)
    RunDir(run.path).record("ended", job_id="4242", exit_code=0, reason="done", step=300)
    fake_slurm.answer("squeue", "")
    assert run.wait(poll=0.1, check=True) == "done"
    # One row per step, its training and evaluation values together.
    assert run.metrics(frame=False) == [{"step": 300, "loss": 0.1, "eval": {"accuracy": 0.9}}]

    # A key that changes the model: refused in one line naming it, nothing written.
    with pytest.raises(UserError) as refused:
        run.resubmit(set={"train.args.hidden": 8, "train.steps": 600})
    assert str(refused.value).startswith("--set train.args.hidden: a resubmit may change only ")
    assert "\n" not in str(refused.value)
    cli_refused = CliRunner().invoke(cli, ["resubmit", str(run.path), "--set", "resources.nodes=1"])
    assert cli_refused.exit_code == 2 and "--set resources.nodes: a resubmit" in cli_refused.output
    assert (run.path / "DONE").exists() and len(fake_slurm.calls("sbatch")) == 1

    # More steps: config rewritten, DONE taken away (kept in the journal), a new job.
    run.resubmit(set={"train.steps": 600})
    assert len(fake_slurm.calls("sbatch")) == 2 and not (run.path / "DONE").exists()
    config = json.loads((run.path / "config.json").read_text())
    assert config["experiment"]["train"]["steps"] == 600
    events = [json.loads(p.read_text()) for p in sorted((run.path / "journal").iterdir())]
    extended = next(e for e in events if e["event"] == journal.EXTENDED)
    assert extended["changes"] == {"train.steps": [300, 600]}
    assert extended["previous_done"]["step"] == 300
    assert run_state(events).state == "queued"  # no longer done: a start after it must be
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING", "Priority"))
    text = CliRunner().invoke(cli, ["status", str(run.path)]).stdout
    assert "extended: " in text and "train.steps 300 -> 600" in text
    assert run.status()["total_steps"] == 600


def test_rank_orders_points_by_a_metric_best_first_missing_last() -> None:
    points = [
        {"index": 0, "eval": {"accuracy": 0.5, "loss": 0.9}, "loss": 1.0},
        {"index": 1, "eval": {}, "loss": None},
        {"index": 2, "eval": {"accuracy": 0.8, "loss": 0.3}, "loss": 2.0},
        {"index": 3, "eval": {"accuracy": 0.7, "loss": 0.1}, "loss": 0.5},
    ]
    assert [p["index"] for p in rank(points, "eval.accuracy")] == [2, 3, 0, 1]
    assert [p["index"] for p in rank(points, "eval.loss")] == [3, 2, 0, 1]  # loss: lowest
    assert [p["index"] for p in rank(points, "accuracy", "min", top=2)] == [0, 3]
    assert [p["index"] for p in rank(points, "loss")] == [3, 0, 2, 1]
    assert [p["index"] for p in rank(points, "accuracy:min")] == [0, 3, 2, 1]
    assert [p["index"] for p in rank(points, "eval.loss:max")] == [0, 2, 3, 1]
    with pytest.raises(UserError, match="min or max"):
        rank(points, "eval.loss:lowest")
    with pytest.raises(UserError, match=r"expected eval\.NAME"):
        rank(points, "evl.accuracy")
    # Points of a fit script: their evaluations keep Keras's names (val_accuracy).
    fitted = [{"index": i, "eval": {"val_accuracy": a}} for i, a in enumerate([0.2, 0.9, 0.5])]
    assert [p["index"] for p in rank(fitted, "eval.accuracy")] == [1, 2, 0]


def test_status_sweep_sort_top_ranks_the_points(
    runs_root: Path,
    fake_slurm: FakeSlurm,
) -> None:
    fake_slurm.answer("scontrol", "MaxArraySize            = 1001\n")
    grid = {"train.seed": [0, 1, 2], "train.args.learning_rate": [0.01]}
    grid |= {"train.scale_learning_rate": [True], "name": ["007"]}
    sweep = hpctf.sweep(DIGITS, grid=grid, site="local-slurm")
    # The values as the grid gave them: int, float, bool, and a string key's text.
    assert [p.values for p in sweep.points] == [
        {"train.seed": i, "train.args.learning_rate": 0.01, "train.scale_learning_rate": True,
         "name": "007"}
        for i in range(3)
    ]  # fmt: skip
    assert [type(v) for v in sweep.points[0].values.values()] == [int, float, bool, str]
    for point, accuracy in zip(sweep.points, (0.7, 0.9, 0.8), strict=True):
        write(point.run.path / "DONE", json.dumps({"step": 300, "eval": {"accuracy": accuracy}}))
    best = sweep.best("eval.accuracy")
    assert best is not None and best.index == 1 and best.run.path == sweep.points[1].run.path
    assert best.values["train.seed"] == 1 and best.values["train.args.learning_rate"] == 0.01
    result = CliRunner().invoke(
        cli, ["status", str(sweep.path), "--sort", "eval.accuracy", "--top", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert [p["index"] for p in json.loads(result.stdout)["points"]] == [1, 2]
    text = CliRunner().invoke(cli, ["status", str(sweep.path), "--sort", "eval.accuracy"]).stdout
    assert [line.split()[0] for line in text.splitlines()[2:5]] == ["1", "2", "0"]
    top_alone = CliRunner().invoke(cli, ["status", str(sweep.path), "--top", "2"])
    assert top_alone.exit_code == 2 and "--top K needs --sort" in top_alone.output


@pytest.mark.parametrize(
    ("metric", "mode"),
    [("eval.mae", "min"), ("eval.val_rmse", "min"), ("eval.sparse_categorical_crossentropy",
     "min"), ("eval.perplexity", "min"), ("eval.auc", "max"), ("eval.accuracy", "max")],
)  # fmt: skip
def test_lower_is_better_for_keras_error_metrics_by_name(metric: str, mode: str) -> None:
    assert default_mode(metric) == mode
