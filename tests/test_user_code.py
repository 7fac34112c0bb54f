"""The fourth cause: an exception from the user's code is named as the user's, with file:line;
hpctf's own stays a bug. Pure (user modules written to tmp_path), but for one traced loss."""

from __future__ import annotations

import importlib
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hpctf.compute.users_code import attribution as user_code
from hpctf.compute.users_code.attribution import UserCodeError, call, region, whose
from hpctf.core.run import journal
from hpctf.core.run.history.decisions import after_end, before_start
from hpctf.core.run.history.runstate import run_state
from hpctf.login.reading.run_report import _end
from tests.journal_records import BUDGETS, SUBMITTED, ended, started

SEQ = """\
import json


def build(units=32, lr=0.001):
    return {"units": units, "lr": lr}


def broken(units=32):
    return {"units": units}["lr"]


def parse(text):
    return json.loads(text)


def calls_hpctf():
    from hpctf.compute.users_code import attribution as user_code
    return user_code.culprit(None)
"""


@pytest.fixture
def seq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    (tmp_path / "seq.py").write_text(SEQ)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("seq")
    sys.modules.pop("seq", None)


def test_a_misspelled_argument_names_the_entry_and_its_signature(seq: ModuleType) -> None:
    with pytest.raises(UserCodeError) as caught:
        call("train.entry seq:build", seq.build, units=8, lrr=0.1)
    assert caught.value.line == (
        "your code raised TypeError at seq.py:4 in train.entry seq:build: build() got an "
        "unexpected keyword argument 'lrr'; it takes build(units=32, lr=0.001)"
    )
    assert (caught.value.error, caught.value.at) == ("TypeError", "seq.py:4")
    assert isinstance(caught.value.__cause__, TypeError)


def test_an_exception_inside_the_users_function_names_their_line(seq: ModuleType) -> None:
    with pytest.raises(UserCodeError) as caught:
        call("train.entry seq:broken", seq.broken)
    assert caught.value.line == "your code raised KeyError at seq.py:9 in broken: 'lr'"
    # Raised in the standard library, called from the user's line: theirs, at their line.
    with pytest.raises(UserCodeError) as caught:
        call("train_data", seq.parse, "{")
    assert caught.value.line.startswith("your code raised JSONDecodeError at seq.py:13 in parse: ")
    # A library function given as the user's own (no frame of theirs below): theirs, named.
    with pytest.raises(UserCodeError) as caught:
        call("train_data", json.loads, "{")
    assert re.fullmatch(
        r"your train_data raised JSONDecodeError at json/decoder\.py:\d+ in raw_decode: "
        r"Expecting property name enclosed in double quotes: line 1 column 2 \(char 1\)",
        caught.value.line,
    ), caught.value.line


def test_hpctf_s_own_frame_is_hpctf_s_bug(seq: ModuleType) -> None:
    """The user's code called hpctf, and hpctf's frame raised: not the user's."""
    with pytest.raises(AttributeError):
        call("train.entry seq:calls_hpctf", seq.calls_hpctf)
    with pytest.raises(AttributeError), region():
        seq.calls_hpctf()
    # A TypeError raised by hpctf's own code (no user frame at all) stays hpctf's.
    with pytest.raises(TypeError), region():
        user_code.short_path(None)  # type: ignore[arg-type]


def test_region_attributes_and_keeps_hpctf_s_errors_as_they_are(seq: ModuleType) -> None:
    with pytest.raises(UserCodeError) as caught, region():
        seq.broken()
    assert caught.value.at == "seq.py:9"
    from hpctf.core.errors import UserError

    with pytest.raises(UserError), region():
        raise UserError("a user error stays one line")


def test_a_syntax_error_in_the_users_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "typo.py").write_text("def build(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserCodeError) as caught:
        call("train.entry typo:build", importlib.import_module, "typo")
    assert caught.value.line.startswith("your code raised SyntaxError at typo.py:1 in <module>")


def test_whose_frame() -> None:
    assert whose(user_code.__file__) == "hpctf"
    assert whose(pytest.__file__) == "library"
    assert whose(textwrap.__file__) == "library"
    assert whose("/tmp/__autograph_generated_fileabc.py") == "library"
    assert whose(__file__) == "user"


def test_the_report_shows_the_users_traceback_records_and_exits_65(
    seq: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[dict[str, Any]] = []

    class Run:
        def record(self, event: str, **fields: Any) -> None:
            records.append({"event": event, **fields})

    class Spec:
        journal_job, node, task_index = "41", "node017", 3

    with pytest.raises(UserCodeError) as caught:
        call("train.entry seq:broken", seq.broken)
    assert user_code.report(caught.value, Run(), Spec()) == 65
    shown = capsys.readouterr().out
    assert 'seq.py", line 9, in broken' in shown and "KeyError: 'lr'" in shown
    assert "attribution.py" not in shown  # hpctf's frames around the call are left out
    assert records == [
        {
            "event": journal.USER_CODE_FAILED,
            "job_id": "41",
            "node": "node017",
            "rank": 3,
            "error": "KeyError",
            "at": "seq.py:9",
            "line": "your code raised KeyError at seq.py:9 in broken: 'lr'",
        }
    ]


LINE = "your code raised KeyError at seq.py:9 in broken: 'lr'"
RAISED = {"event": journal.USER_CODE_FAILED, "job_id": "7", "rank": 1, "line": LINE}


@pytest.mark.parametrize("step", [0, 100])
def test_a_start_the_users_code_stopped_is_not_requeued(step: int) -> None:
    """With or without progress: the same code raises again; the failure budget is untouched
    and the run's why is the user's line, not srun's exit status."""
    events = [SUBMITTED, started(0), RAISED, ended("failed", step, 143)]
    state = run_state(events)
    assert (state.state, state.why) == ("failed", LINE)
    decision = after_end(state, BUDGETS)
    assert (decision.go, decision.gave_up) == (False, True)
    assert decision.why == f"{LINE}; not requeued: fix it and run hpctf resubmit"
    assert _end(state.starts[0], None) == f"{LINE} (step {step}, exit 143, SIGTERM)"
    # Resubmitted after each of four such ends: no start is refused for the failure budget (2).
    resubmits = [SUBMITTED] + [e for _ in range(4) for e in (*events[1:], SUBMITTED)]
    assert before_start(run_state(resubmits), BUDGETS).go
    assert run_state([*resubmits[:-1], *events[1:]]).failure_requeues == 0
    # Before the start, it belongs to no start.
    assert run_state([SUBMITTED, RAISED, started(0), events[-1]]).starts[0].user_code is None


@pytest.mark.tf
def test_a_loss_traced_by_tensorflow_is_attributed_to_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AutoGraph runs a generated copy of the loss; the user's file:line is in its message."""
    (tmp_path / "lossy.py").write_text(
        "import tensorflow as tf\n\n\ndef loss(y, p):\n    return tf.abs(y - p) + missing\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tensorflow as tf

    lossy = importlib.import_module("lossy")
    strategy = tf.distribute.get_strategy()

    @tf.function
    def step(x: Any) -> Any:
        return strategy.run(lossy.loss, args=(x, x))

    with pytest.raises(UserCodeError) as caught, region():
        step(tf.constant([1.0]))
    assert caught.value.line == (
        "your code raised NameError at lossy.py:5 in loss: name 'missing' is not defined"
    )


@pytest.mark.tf
def test_a_keras_loss_given_labels_of_the_wrong_shape_is_the_users() -> None:
    """Raised inside Keras while hpctf's step is traced: nothing of the user's below, but the
    loss is theirs (hpctf called it through loss_call): named as theirs, at Keras's line."""
    import keras
    import tensorflow as tf

    from hpctf.api import Task
    from hpctf.compute.loop.training import make_train_step

    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(4)])
    task = Task(
        model=model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=lambda: None,
    )
    step = make_train_step(tf.distribute.get_strategy(), task, 2, jit_compile=False)
    one_hot = tf.data.Dataset.from_tensor_slices(([[1.0, 2.0, 3.0]] * 2, [[0.0, 1.0, 0.0]] * 2))
    with pytest.raises(UserCodeError) as caught, region():
        step(iter(one_hot.batch(2)))
    assert re.fullmatch(
        r"your Task loss raised ValueError at keras/src/backend/tensorflow/nn\.py:\d+ in "
        r"sparse_categorical_crossentropy: Argument `output` must have rank \(ndim\) "
        r"`target\.ndim - 1`\. .*",
        caught.value.line,
    ), caught.value.line
