"""One canary per private name of another package that hpctf uses (hpctf/compute/compat/ and
the login side's Jinja ``super()``): each fails, naming the capability and the versions, when
an upgrade moved or removed its name, so the upgrade announces itself here rather than on a
cluster. The tables of what each was checked against are in the compat modules' docstrings."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from hpctf.compute.compat import probe
from hpctf.compute.compat import tensorflow_internals as internals

pytestmark = pytest.mark.tf

CHECKED = "checked against tensorflow-cpu 2.16.2-2.21.0, keras 3.15.1, python 3.10-3.13"


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def versions() -> str:
    names = ("tensorflow-cpu", "tensorflow", "keras", "tf_keras", "jinja2")
    found = [f"{n} {_installed(n)}" for n in names if _installed(n) != "none"]
    return ", ".join([*found, f"python {platform.python_version()}"])


def gone(capability: str, name: str, detail: object = "") -> str:
    """The canary's message: which capability, which name, which versions."""
    extra = f" ({detail})" if detail else ""
    return (
        f"{capability}: {name} is gone{extra} with {versions()} ({CHECKED}); move it in "
        "hpctf/compute/compat/ and add the version to its table"
    )


def sing(capability: str, name: str, check: Callable[[], object]) -> Any:
    """``check()``'s value, or a failure naming the capability when it raises."""
    try:
        return check()
    except (AttributeError, ImportError, TypeError, KeyError, NotImplementedError) as exc:
        pytest.fail(gone(capability, name, f"{type(exc).__name__}: {exc}"), pytrace=False)


def test_coordination_config_proto() -> None:
    module = internals.coordination_config()
    assert module is not None, gone("failure detection", "coordination_config_pb2")
    job = module.CoordinatedJob(name="worker", num_tasks=2)
    assert job.num_tasks == 2, gone("failure detection", "CoordinatedJob")


def test_configure_coordination_service() -> None:
    from tensorflow.python.eager import context

    method = getattr(context.context(), "configure_coordination_service", None)
    assert callable(method), gone("failure detection", "context().configure_coordination_service")
    names = set(method.__code__.co_varnames)
    wanted = {"service_type", "service_leader", "coordinated_jobs", "heartbeat_timeout_in_ms"}
    wanted |= {"cluster_register_timeout_in_ms", "shutdown_barrier_timeout_in_ms"}
    assert wanted <= names, gone(
        "failure detection", "configure_coordination_service's keywords", wanted - names
    )


def test_prefer_unique_instance_key() -> None:
    from tensorflow.python.distribute import cross_device_utils

    launcher = sing(
        "fixed collective keys",
        "cross_device_utils.CollectiveReplicaLauncher",
        lambda: cross_device_utils.CollectiveReplicaLauncher,
    )
    flag = sing(
        "fixed collective keys",
        "CollectiveReplicaLauncher._prefer_unique_instance_key",
        lambda: launcher._prefer_unique_instance_key,
    )
    assert flag is True, gone("fixed collective keys", "_prefer_unique_instance_key", flag)
    with internals.fixed_instance_keys():
        assert launcher._prefer_unique_instance_key is False
    assert launcher._prefer_unique_instance_key is True


def test_copy_trackable_to_cpu() -> None:
    import keras
    import tensorflow as tf
    from tensorflow.python.util import object_identity

    inner = tf.Variable([1.0, 2.0])
    outer = keras.Variable([3.0])
    for variable, key in ((inner, inner), (outer, outer.value)):
        name = f"{type(variable).__name__}._copy_trackable_to_cpu"
        copies: Any = object_identity.ObjectIdentityDictionary()  # what TF's helper passes
        sing("async saves", name, lambda v=variable, c=copies: v._copy_trackable_to_cpu(c))
        assert key in copies, gone("async saves", name, "made no copy")
        assert copies[key].numpy().tolist() == variable.numpy().tolist()
    assert internals.async_saves_missing() is None, gone("async saves", "the probe's names")


def _checkpoint() -> Any:
    import keras
    import tensorflow as tf

    # Built without calling it: a Sequential with an Input, built in an xdist worker after
    # other tests, has failed in Keras's own argument check (a tuple seen as one argument).
    model = keras.layers.Dense(1)
    model.build((None, 2))
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    return tf.train.Checkpoint(model=model, optimizer=optimizer)


def test_async_checkpointer_helper(tmp_path: Path) -> None:
    """Two asynchronous saves of a Keras 3 model (the second failed before the in-place copy),
    then a write that fails, taken for its own step."""
    import tensorflow as tf

    checkpoint = _checkpoint()
    why = internals.enable_async_saves(checkpoint)
    assert why is None, gone("async saves", "the async checkpointer's internals", why)
    helper = checkpoint._async_checkpointer_impl
    for name in ("_saveable_trackables", "_object_map", "_queue", "_async_error"):
        assert hasattr(helper, name), gone("async saves", f"AsyncCheckpointHelper.{name}")
    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    for step in (1, 2):
        checkpoint.write(str(tmp_path / f"ckpt-{step}"), options=options)
        checkpoint.sync()
        assert not internals.async_write_pending(checkpoint)
        assert internals.take_async_error(checkpoint) is None
    assert (tmp_path / "ckpt-2.index").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    checkpoint.write(str(blocked / "ckpt-3"), options=options)
    checkpoint.sync()
    error = internals.take_async_error(checkpoint)
    assert error is not None, gone("async saves", "AsyncCheckpointHelper._async_error (unset)")
    assert internals.take_async_error(checkpoint) is None  # taken once


def test_optimizer_learning_rate() -> None:
    import keras

    assert internals.learning_rate_missing() is None, gone(
        "learning-rate scaling", "Optimizer._learning_rate in the constructors"
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    for given in (0.25, schedule):
        optimizer = keras.optimizers.SGD(given)
        kept = sing(
            "learning-rate scaling",
            "Optimizer._learning_rate",
            lambda optimizer=optimizer: internals.given_learning_rate(optimizer),
        )
        if given is schedule:
            assert kept is schedule, gone("learning-rate scaling", "_learning_rate (a schedule)")
        else:
            assert float(kept.numpy()) == 0.25, gone("learning-rate scaling", "_learning_rate")


def test_run_exitfuncs() -> None:
    """In a Python of its own: running this process's ``atexit`` functions would run Keras's
    and TensorFlow's too, and the canaries after this one would meet a torn-down Keras."""
    probe_script = (
        "import atexit\n"
        "from hpctf.compute.compat import python_internals\n"
        "ran = []\n"
        "atexit.register(ran.append, 1)\n"
        "print(python_internals.run_exit_functions(), ran)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-c", probe_script], capture_output=True, text=True, env=env, check=False
    )
    said = done.stdout.strip()
    assert not said.startswith("False"), gone("bounded exit", "atexit._run_exitfuncs")
    assert said == "True [1]", gone("bounded exit", "atexit._run_exitfuncs (ran nothing)", said)


def test_tf_keras_training_state() -> None:
    """tf_keras's fit asks ``model._training_state`` where to resume (hpctf.keras.callbacks)."""
    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential([tf_keras.Input(shape=(2,)), tf_keras.layers.Dense(1)])

    class Resume:
        def maybe_load_initial_counters_from_ckpt(self, steps: int, epoch: int, mode: Any) -> Any:
            return (1, 3)

    name = "Model._training_state / _maybe_load_initial_counters_from_ckpt"
    model._training_state = Resume()
    counters = sing(
        "fit resume exact", name, lambda: model._maybe_load_initial_counters_from_ckpt(10, 0)
    )
    assert tuple(counters) == (1, 3), gone("fit resume exact", name, counters)


def test_keras_3_trainer_names_that_fit_under_the_strategy_replaces() -> None:
    """compat/keras_fit replaces TensorFlowTrainer._maybe_symbolic_build (calling
    _symbolic_build) and trainer.reduce_per_replica, wraps fit, and resumes through
    Model._initial_epoch, Model.metrics_variables and the seed states' paths."""
    import importlib

    import keras

    trainer = importlib.import_module("keras.src.backend.tensorflow.trainer")
    cls = getattr(trainer, "TensorFlowTrainer", None)
    for name in ("_maybe_symbolic_build", "_symbolic_build", "fit"):
        assert callable(getattr(cls, name, None)), gone("Keras 3 fit", f"TensorFlowTrainer.{name}")
    assert callable(getattr(trainer, "reduce_per_replica", None)), gone(
        "Keras 3 fit", "trainer.reduce_per_replica"
    )
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert hasattr(model, "_initial_epoch"), gone("fit resume exact", "Model._initial_epoch")
    variables = sing("fit resume exact", "Model.metrics_variables", lambda: model.metrics_variables)
    assert isinstance(variables, list), gone("fit resume exact", "Model.metrics_variables")
    from hpctf.compute.compat.keras_variables import random_state_variables

    dropout = keras.layers.Dropout(0.5, seed=1)
    dropout.build((None, 2))
    assert len(random_state_variables({"layer": dropout})) == 1, gone(
        "exact resume with random layers", "seed_generator_state variables"
    )


def test_keras_3_names_an_own_train_step_and_batch_normalization_use() -> None:
    """compat/keras_own_steps runs a model's own train_step as on one machine through the loss
    module's scale_loss_for_distribution / unscale_loss_for_distribution and
    TFOptimizer._all_reduce_sum_gradients; BatchNormalization's statistics are found through
    Layer._flatten_layers; every weight through Model.weights (compat/keras_variables)."""
    import importlib

    import keras

    from hpctf.compute.compat.keras_variables import model_weights, replica_local_variables

    losses = importlib.import_module("keras.src.losses.loss")
    for name in ("scale_loss_for_distribution", "unscale_loss_for_distribution"):
        assert callable(getattr(losses, name, None)), gone("an own train_step", f"loss.{name}")
    optimizer = importlib.import_module("keras.src.backend.tensorflow.optimizer")
    found = getattr(getattr(optimizer, "TFOptimizer", None), "_all_reduce_sum_gradients", None)
    assert callable(found), gone("an own train_step", "TFOptimizer._all_reduce_sum_gradients")
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    assert len(replica_local_variables({"model": model})) == 2, gone(
        "one model across ranks", "Layer._flatten_layers and BatchNormalization's statistics"
    )
    assert len(model_weights({"model": model})) == 4, gone("every weight saved", "Model.weights")


def test_tf_keras_reduce_per_replica() -> None:
    """compat/keras_fit reads tf_keras's "auto" reduction as the mean across replicas."""
    import importlib

    pytest.importorskip("tf_keras")
    training = importlib.import_module("tf_keras.src.engine.training")
    assert callable(getattr(training, "reduce_per_replica", None)), gone(
        "tf_keras fit's true numbers", "training.reduce_per_replica"
    )


def test_jinja_context_super_and_block_reference() -> None:
    """The login side's render marks ``{{ super() }}`` through Context.super and
    BlockReference's private fields (hpctf/login/submitting/render.py)."""
    from jinja2.runtime import BlockReference, Context

    assert callable(getattr(Context, "super", None)), gone("site templates", "Context.super")
    env = jinja2.Environment(
        loader=jinja2.DictLoader({"base": "{% block b %}parent{% endblock %}", "child": CHILD})
    )
    seen: list[Any] = []
    env.globals["keep"] = seen.append
    assert env.get_template("child").render() == "parent+"
    (ref,) = seen
    assert isinstance(ref, BlockReference), gone("site templates", "BlockReference")
    fields = ("name", "_context", "_stack", "_depth")
    absent = [f for f in fields if not hasattr(ref, f)]
    assert not absent, gone("site templates", "BlockReference fields", absent)


CHILD = '{% extends "base" %}{% block b %}{{ keep(super) or "" }}{{ super() }}+{% endblock %}'


def test_the_probe_says_every_capability_on() -> None:
    """On the versions this suite runs on every capability is there: the probe line says so."""
    capabilities = probe.probe()
    assert [c.name for c in capabilities] == list(probe.CHECKS)
    off = [c.describe() for c in capabilities if not c.on]
    assert not off, gone("the probe", "; ".join(off))
    assert probe.line(capabilities).startswith("tensorflow ")
