"""The step protocol on its own (hpctf/compute/loop/control.py), one process, the other ranks'
votes given: what a step calls for, the agreed save on a warning and its journal record, a
save by time, a prune, the progress record. Each adapter (the built-in loop, hpctf.Session,
fit's callback) runs the same protocol on real workers in its own tests (test_training,
test_preemption, test_fit_scripts, test_fit_own_step, test_pruning_local)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIGITS

pytestmark = pytest.mark.tf


class Votes:
    """The preemption watch as the other ranks would answer it: the signal some rank got and
    whether some rank voted for a save by time, at the next agreement."""

    def __init__(self) -> None:
        self.signal = 0
        self.save = False
        self.asked: list[float] = []

    def agree(self, step_seconds: float, save_vote: bool = False) -> Any:
        from hpctf.compute.loop.agreement import Agreement

        self.asked.append(step_seconds)
        return Agreement(self.signal, 0.01, self.save or save_vote)


def _control(tmp_path: Path, **train: Any) -> tuple[Any, Votes, Path]:
    import keras
    import tensorflow as tf

    from hpctf.compute.cluster.spec import cluster_spec
    from hpctf.compute.loop.cadence import Cadence
    from hpctf.compute.loop.control import Parts, TrainingControl
    from hpctf.compute.records.chief_records import ChiefRecords
    from hpctf.core.run.rundir import RunDir
    from hpctf.login.resolving.loader import load_config

    config = load_config(DIGITS, "local", [], {"HOME": str(tmp_path)}).config
    settings = config.experiment.train.model_copy(update=train)
    checkpoint = config.experiment.checkpoint.model_copy(
        update={"every_steps": 100, "every_seconds": None, "asynchronous": False}
    )
    run_dir = tmp_path / "run"
    (run_dir / "journal").mkdir(parents=True)
    run = RunDir(run_dir)
    env = {"SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "1", "SLURM_NTASKS": "1",
           "SLURM_PROCID": "0", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}  # fmt: skip
    spec = cluster_spec(env, (20000, 30000))
    votes = Votes()
    control = TrainingControl(
        settings,
        checkpoint,
        run,
        spec,
        Parts(tf.distribute.get_strategy(), lambda v: [v], votes, None, ChiefRecords(run, True)),  # type: ignore[arg-type]
        cadence=Cadence(10, 100, 300),
        warning_seconds=None,
        examples_per_step=64,
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert control.track({"model": model}) == 0
    return control, votes, run_dir


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "journal").glob("*.json"))]


def test_a_warning_at_an_agreement_is_saved_at_that_step_recorded_then_exit_75(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctf.compute.loop import control as control_module
    from hpctf.compute.loop.preemption import Preempted

    bounded: list[int] = []  # the exit bound the worker sets (os._exit: not in this process)
    monkeypatch.setattr(control_module, "exit_later", bounded.append)
    control, votes, run_dir = _control(tmp_path, preemption_check_every_steps=5)
    for step in range(1, 5):
        control.step_done(step, {"loss": 1.0})
    assert votes.asked == [] and control.saved_step == 0  # no agreement before step 5
    votes.signal = signal.SIGUSR2
    with pytest.raises(Preempted) as stopped:
        control.step_done(5, {"loss": 1.0})
    assert stopped.value.code == 75 and bounded == [75]
    assert control.saved_step == 5 and (run_dir / "checkpoints" / "ckpt-5.index").exists()
    (record,) = [e for e in _events(run_dir) if e["event"] == "saved_on_warning"]
    assert (record["step"], record["signal"]) == (5, "USR2")


def test_a_save_by_time_is_one_agreed_step_and_progress_is_recorded(tmp_path: Path) -> None:
    control, votes, run_dir = _control(tmp_path, preemption_check_every_steps=5)
    votes.save = True  # some rank's checkpoint.every_seconds ran out
    for step in range(1, 11):
        control.step_done(step, {"loss": 0.5})
    assert control.saved_step == 10  # steps 5 and 10: the agreements, each saved once
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved == ["ckpt-10.index", "ckpt-5.index"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r.get("step") == 10 and "loss" in r]
    assert logged["loss"] == 0.5 and logged["total_steps"] == 300 and "steps_per_s" in logged


def test_a_prune_saves_its_step_once_and_the_last_step_finishes_despite_a_warning(
    tmp_path: Path,
) -> None:
    control, votes, run_dir = _control(tmp_path, preemption_check_every_steps=1000)
    control.step_done(7, {"loss": 0.5})
    control.prune(7)
    control.prune(7)  # saved once: the step is on disk already
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-7.index"
    ]
    assert control.agree_to_prune(True) is False  # no trial: nothing to agree on
    votes.signal = signal.SIGTERM
    control.step_done(300, {"loss": 0.1})  # the last step: saved, finished, not preempted
    assert control.saved_step == 300
    assert not [e for e in _events(run_dir) if e["event"] == "saved_on_warning"]
