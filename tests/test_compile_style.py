"""What ``model.compile`` takes, in a Task: each spelling resolves (and computes one value per
example), or is refused in one line saying what to write instead. TensorFlow, no strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.tf

keras = pytest.importorskip("keras")
np = pytest.importorskip("numpy")

from hpctf.compute.users_code.compile_style import (  # noqa: E402 -- after the skip
    resolve_loss,
    resolve_metrics,
    resolve_optimizer,
)
from hpctf.core.errors import UserError  # noqa: E402

Y = np.array([[1.0], [3.0]], dtype="float32")
P = np.array([[2.0], [1.0]], dtype="float32")
LABELS = np.array([0, 2])
LOGITS = np.array([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0]], dtype="float32")


def my_loss(y_true: Any, y_pred: Any) -> Any:
    return keras.ops.mean(abs(y_true - y_pred), axis=-1)


def values(function: Callable[[Any, Any], Any], y: Any = Y, p: Any = P) -> list[float]:
    return [round(float(v), 4) for v in keras.ops.convert_to_numpy(function(y, p))]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("mse", [1.0, 4.0]),
        ("mae", [1.0, 2.0]),
        (keras.losses.MeanSquaredError(), [1.0, 4.0]),  # default reduction: made per example
        (keras.losses.MeanAbsoluteError(reduction="sum"), [1.0, 2.0]),
        (my_loss, [1.0, 2.0]),
    ],
    ids=["name mse", "name mae", "object", "object reduction sum", "function"],
)
def test_losses_resolve_to_one_value_per_example(given: Any, expected: list[float]) -> None:
    assert values(resolve_loss(given)) == expected


def test_a_keras_loss_object_is_copied_not_changed() -> None:
    given = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    resolved = resolve_loss(given)
    assert given.reduction == "sum_over_batch_size" and resolved is not given
    assert len(values(resolved, LABELS, LOGITS)) == 2
    assert len(values(resolve_loss("sparse_categorical_crossentropy"), LABELS, LOGITS)) == 2


def test_optimizers_by_name_or_object() -> None:
    assert isinstance(resolve_optimizer("adam"), keras.optimizers.Adam)
    sgd = keras.optimizers.SGD(0.1)
    assert resolve_optimizer(sgd) is sgd


@pytest.mark.parametrize(
    ("metrics", "loss", "expected"),
    [
        (["mae"], "mse", {"mae": [1.0, 2.0]}),
        (["mae", "mse"], "mse", {"mae": [1.0, 2.0], "mse": [1.0, 4.0]}),
        ([keras.metrics.MeanAbsoluteError()], "mse", {"mean_absolute_error": [1.0, 2.0]}),
        ([my_loss], "mse", {"my_loss": [1.0, 2.0]}),
        ({"err": "mae", "mine": my_loss}, "mse", {"err": [1.0, 2.0], "mine": [1.0, 2.0]}),
        ((), "mse", {}),
    ],
    ids=["names", "two names", "mean metric object", "function", "mapping", "none"],
)
def test_metrics_resolve_to_named_per_example_functions(
    metrics: Any, loss: Any, expected: dict[str, list[float]]
) -> None:
    resolved = resolve_metrics(metrics, loss)
    assert {name: values(fn) for name, fn in resolved.items()} == expected


@pytest.mark.parametrize(
    "loss",
    [
        "sparse_categorical_crossentropy",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
    ],
)
def test_accuracy_is_picked_after_the_loss_as_compile_does(loss: Any) -> None:
    (accuracy,) = resolve_metrics(["accuracy"], loss).values()
    assert values(accuracy, LABELS, LOGITS) == [1.0, 0.0]


# (what was given, the words the one line must hold)
REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    ("optimizer name", lambda: resolve_optimizer("adamm"), "its name ('adam', 'sgd'"),
    ("optimizer class", lambda: resolve_optimizer(keras.optimizers.Adam), "Adam(1e-3)"),
    ("loss name", lambda: resolve_loss("msee"), "is not a Keras loss name; give a Keras loss"),
    ("loss class", lambda: resolve_loss(keras.losses.MeanSquaredError), "is not a loss; give"),
    ("loss arity", lambda: resolve_loss(lambda y: y), "cannot be called as <lambda>(y_true,"),
    ("metrics a string", lambda: resolve_metrics("mae", "mse"), "give a list (['mae'])"),
    ("metric name", lambda: resolve_metrics(["maee"], "mse"), "is not a Keras metric name"),
    ("accuracy unknown", lambda: resolve_metrics(["accuracy"], "mse"), "'binary_accuracy'"),
    ("stateful metric", lambda: resolve_metrics([keras.metrics.AUC()], "mse"), "AUC keeps"),
    ("metric twice", lambda: resolve_metrics(["mae", "mae"], "mse"), "'mae' given twice"),
]


@pytest.mark.parametrize(("make", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_what_cannot_be_used_is_refused_in_one_line(make: Callable[[], Any], words: str) -> None:
    with pytest.raises(UserError) as caught:
        make()
    assert "\n" not in str(caught.value) and words in str(caught.value), str(caught.value)


def test_a_loss_returning_one_value_per_batch_is_refused_in_one_line() -> None:
    """Found while the step is traced, before it runs; one line, not AutoGraph's frames."""
    import tensorflow as tf

    from hpctf.api import Task
    from hpctf.compute.loop.training import make_train_step
    from hpctf.compute.users_code.attribution import region

    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
    task = Task(
        model=model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=lambda y, p: keras.ops.mean(keras.losses.mean_squared_error(y, p)),
        train_data=lambda: None,
    )
    step = make_train_step(tf.distribute.get_strategy(), task, 2, jit_compile=False)
    batches = iter(tf.data.Dataset.from_tensor_slices((Y, P)).batch(2))
    with pytest.raises(UserError) as caught, region():
        step(batches)
    assert str(caught.value) == (
        "Task loss returned one value for the whole batch: return one value per example (hpctf "
        "averages over the global batch), or give a Keras loss name or object (any reduction)"
    )


@pytest.mark.parametrize(
    ("callbacks", "words"),
    [
        (keras.callbacks.EarlyStopping(), "give a list of keras.callbacks.Callback objects"),
        ([print], "builtin_function_or_method is not a keras.callbacks.Callback"),
        ([keras.callbacks.BackupAndRestore("/tmp/x")], "leave out BackupAndRestore: hpctf resumes"),
        ([keras.callbacks.TensorBoard()], "leave out TensorBoard: hpctf writes TensorBoard"),
    ],
    ids=["not a list", "not a callback", "BackupAndRestore", "TensorBoard"],
)
def test_callbacks_that_cannot_be_used_are_refused_in_one_line(callbacks: Any, words: str) -> None:
    from hpctf.compute.users_code.task_callbacks import TaskCallbacks

    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
    with pytest.raises(UserError) as caught:
        TaskCallbacks(callbacks, model, "adam", True, 10, 5)
    assert "\n" not in str(caught.value) and words in str(caught.value), str(caught.value)


def test_file_writing_callbacks_run_on_the_chief_only(tmp_path: Any) -> None:
    from hpctf.compute.users_code.task_callbacks import TaskCallbacks

    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
    stop = keras.callbacks.EarlyStopping()
    csv = keras.callbacks.CSVLogger(str(tmp_path / "h.csv"))
    assert TaskCallbacks([stop, csv], model, None, True, 10, 5).callbacks == [stop, csv]
    others = TaskCallbacks([stop, csv], model, None, False, 10, 5)
    assert others.callbacks == [stop] and not others.batch_hooks
    assert TaskCallbacks([keras.callbacks.TerminateOnNaN()], model, None, False, 10, 5).batch_hooks


def test_metric_directions_are_what_fit_reads_and_auto_mode_callbacks_get_them() -> None:
    from hpctf.compute.users_code.compile_style import metric_directions
    from hpctf.compute.users_code.task_callbacks import TaskCallbacks

    given = ["accuracy", "mae", keras.metrics.SparseCategoricalAccuracy(name="sca"), my_loss]
    directions = metric_directions(given, "sparse_categorical_crossentropy")
    assert directions == {"accuracy": "up", "mae": "down", "sca": "up"}
    assert metric_directions({"top_acc": my_loss, "err": "mse"}, "mse") == {
        "top_acc": "up",  # tf_keras's rule by name
        "err": "down",
    }
    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
    watch = [
        keras.callbacks.EarlyStopping(monitor="val_accuracy"),
        keras.callbacks.ReduceLROnPlateau(monitor="val_mae"),
        keras.callbacks.EarlyStopping(monitor="val_accuracy", mode="min"),  # the user's word
        keras.callbacks.EarlyStopping(monitor="val_unknown"),
    ]
    TaskCallbacks(watch, model, None, True, 10, 5, directions=directions)
    assert [c.mode for c in watch] == ["max", "min", "min", "auto"]
    watch[0]._set_monitor_op()  # what its first on_epoch_end calls
    assert watch[0].monitor_op.__name__ == "greater"
