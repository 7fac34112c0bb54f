"""Each capability of hpctf/compute/compat/ without its private name: the documented fallback,
never a crash as a bug in hpctf (exit 70). The names are removed here the way a TensorFlow,
Keras or Python release would remove them; tests/test_compat_canaries.py says when one does."""

from __future__ import annotations

import atexit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpctf.compute.compat import probe, python_internals
from hpctf.compute.compat import tensorflow_internals as internals
from hpctf.core.errors import EnvironmentProblem

pytestmark = pytest.mark.tf


def test_without_the_coordination_proto_the_strategy_keeps_tf_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorflow.python.eager import context

    monkeypatch.delattr(context, "coordination_config_pb2")
    monkeypatch.setattr(internals, "COORDINATION_PROTO_MODULES", ("no.such.module_pb2",))
    called: list[Any] = []
    monkeypatch.setattr(
        context.Context, "configure_coordination_service", lambda *a, **k: called.append(a)
    )
    assert internals.coordination_config() is None
    assert internals.configure_coordination_service(2, 1, 1, 1) == "no coordination_config_pb2"
    assert called == []  # TF's own configuration, at strategy creation, is left to TF
    line = probe.line(probe.probe())
    assert "failure detection off (no coordination_config_pb2)" in line


def test_the_proto_is_found_on_the_paths_when_context_calls_it_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorflow.python.eager import context

    module = context.coordination_config_pb2
    monkeypatch.delattr(context, "coordination_config_pb2")
    assert internals.coordination_config() is module  # one of COORDINATION_PROTO_MODULES


def test_without_the_key_flag_collectives_keep_per_call_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorflow.python.distribute import cross_device_utils

    launcher = cross_device_utils.CollectiveReplicaLauncher
    monkeypatch.delattr(launcher, "_prefer_unique_instance_key")
    with internals.fixed_instance_keys():
        assert not hasattr(launcher, "_prefer_unique_instance_key")  # nothing set
    assert not hasattr(launcher, "_prefer_unique_instance_key")
    assert "fixed collective keys off" in probe.line(probe.probe())


def test_without_the_async_error_saves_are_synchronous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A helper that keeps no write error would report a failed write a save late, against
    the wrong step: hpctf saves synchronously instead, and says so."""
    import tensorflow as tf
    from tensorflow.python.checkpoint import async_checkpoint_helper

    from hpctf.compute.records.checkpoints import Checkpointer

    helper = async_checkpoint_helper.AsyncCheckpointHelper
    made = helper.__init__

    def without_error(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        del self._async_error

    monkeypatch.setattr(helper, "__init__", without_error)
    checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
    spec = SimpleNamespace(task_index=0, is_chief=True)
    saver = Checkpointer(checkpoint, tmp_path / "c", spec, 3, asynchronous=True)  # type: ignore[arg-type]
    assert "saving synchronously" in caplog.text
    assert "_async_error" in caplog.text
    assert saver.save(10) == str(tmp_path / "c" / "ckpt-10")
    assert (tmp_path / "c" / "ckpt-10.index").exists()  # written before save returned
    checkpoint._async_checkpointer_impl._async_error = None  # for TF's own atexit function


def test_without_the_given_learning_rate_a_scaling_run_stops_in_one_line() -> None:
    optimizer = SimpleNamespace(learning_rate=0.1)  # the public number only
    with pytest.raises(EnvironmentProblem) as raised:
        internals.given_learning_rate(optimizer)
    said = str(raised.value)
    assert "\n" not in said and "train.scale_learning_rate" in said and "keras 3." in said


def test_without_run_exitfuncs_the_exit_skips_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(atexit, "_run_exitfuncs")
    assert python_internals.run_exit_functions() is False
    assert "bounded exit off (no atexit._run_exitfuncs)" in probe.line(probe.probe())


def test_a_check_that_breaks_is_a_capability_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> str | None:
        raise RuntimeError("moved")

    monkeypatch.setitem(probe.CHECKS, "async saves", broken)
    assert "async saves off (RuntimeError: moved)" in probe.line(probe.probe())
