"""Compute-node pieces, in process with real TensorFlow and Keras objects: checkpoint agreement
between ranks, loss scaling, learning-rate scaling, records without TensorBoard, the watchdog."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from hpctf.compute.doctor.procstat import parse_status, process_usage
from hpctf.compute.loop.watchdog import ProgressWatchdog
from hpctf.core.errors import STALLED_EXIT
from tests.conftest import REPO

pytestmark = pytest.mark.tf


# --- checkpoint agreement --------------------------------------------------------------------


class _Gather:
    """An all-gather between ``ranks`` threads: each call blocks until every rank called."""

    def __init__(self, ranks: int) -> None:
        self._barrier = threading.Barrier(ranks)
        self._slots = [0] * ranks
        self._local = threading.local()

    def join(self, rank: int) -> None:
        self._local.rank = rank

    def __call__(self, value: int) -> Sequence[int]:
        self._slots[self._local.rank] = value
        self._barrier.wait()
        result = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before everyone has read this round
        return result


def _agree(views: list[dict[int, bool]]) -> list[object]:
    """Run agree_on_step on one thread per rank; ``views[r]`` maps listed step -> readable."""
    from hpctf.compute.records.checkpoints import agree_on_step

    gather = _Gather(len(views))
    results: list[object] = [None] * len(views)
    reads: list[list[int]] = [[] for _ in views]

    def rank(index: int) -> None:
        gather.join(index)
        listed = {step: f"ckpt-{step}" for step in views[index]}

        def readable(path: str) -> bool:
            step = int(path.split("-")[1])
            reads[index].append(step)
            return views[index][step]

        try:
            results[index] = agree_on_step(listed, readable, gather, "/runs/x/checkpoints")
        except Exception as exc:  # the test looks at what each rank got
            results[index] = exc

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(views))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for index, steps in enumerate(reads):
        assert len(steps) == len(set(steps)), f"rank {index} read a checkpoint twice: {steps}"
    return results


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        # Everyone sees the same, newest readable: it.
        ([{100: True, 200: True}, {100: True, 200: True}], 200),
        # A stale view on rank 1 (200 not listed yet): every rank restores 100, not 200 and 100.
        ([{100: True, 200: True}, {100: True}], 100),
        # 300 damaged for rank 0 only (a bad read): both fall back to 200.
        ([{200: True, 300: False}, {200: True, 300: True}], 200),
        # Three ranks, each missing a different step: the newest step all can read.
        (
            [{1: True, 2: True, 3: True}, {1: True, 3: True}, {1: True, 2: True}],
            1,
        ),
        # Nothing anywhere: a fresh start.
        ([{}, {}], None),
    ],
    ids=["same", "stale-listing", "one-rank-damaged", "three-ranks", "fresh"],
)
def test_all_ranks_restore_the_same_step(
    views: list[dict[int, bool]], expected: int | None
) -> None:
    assert _agree(views) == [expected] * len(views)


def test_a_fresh_start_agrees_in_one_collective() -> None:
    """Nothing listed anywhere: the first round also says so (the restore agreement is the
    worker's first collective, before its first step); a restore takes two."""
    from hpctf.compute.records.checkpoints import agree_on_step

    said: list[int] = []

    def gather(value: int) -> list[int]:
        said.append(value)
        return [value, value]  # both ranks see the same

    for listed, rounds in (({}, 1), ({100: "ckpt-100"}, 2)):
        said.clear()
        expected = max(listed, default=None)
        assert agree_on_step(listed, lambda path: True, gather, "/runs/x/checkpoints") == expected
        assert len(said) == rounds


def test_ranks_with_no_common_checkpoint_stop_with_a_clear_error() -> None:
    """Rank 1 sees an empty directory (a run dir on node-local disk): never a silent restart
    from step 0 on one rank and step 300 on another."""
    from hpctf.core.errors import UserError

    results = _agree([{300: True}, {}])
    for result in results:
        assert isinstance(result, UserError)
        assert "newest readable per rank: 300, none" in str(result)
        assert "shares" in str(result)


def test_checkpoints_that_no_rank_can_read_stop_the_run_naming_them() -> None:
    """Files on disk but none reads back whole: one line naming them, never step 0 over them."""
    from hpctf.core.errors import EnvironmentProblem

    results = _agree([{100: False, 200: False}, {100: False, 200: False}])
    for result in results:
        assert isinstance(result, EnvironmentProblem)
        assert str(result) == (
            "no checkpoint in /runs/x/checkpoints reads back whole (ckpt-100, ckpt-200; the rank "
            "log says why): training from step 0 over them would lose them; restore them from a "
            "backup, or start again from step 0 with: hpctf resubmit --from-scratch /runs/x"
        )
    # Listed by one rank only, unreadable there: the same (every rank takes part and agrees).
    assert all(isinstance(r, EnvironmentProblem) for r in _agree([{}, {300: False}]))


# --- precision and learning rate ---------------------------------------------------------------


@pytest.fixture
def float16_policy() -> Iterator[None]:
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _tiny_step(optimizer: object, scale: float) -> float:
    """One step of a float16 model on a loss times ``scale``; the largest weight change."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    before = [w.numpy().copy() for w in model.trainable_variables]
    x = tf.constant(np.ones((8, 4), np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.cast(model(x), tf.float32)) * scale
        scaled = optimizer.scale_loss(loss)  # type: ignore[attr-defined]
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # type: ignore[attr-defined]
    after = model.trainable_variables
    return max(float(np.abs(a.numpy() - b).max()) for a, b in zip(after, before, strict=True))


def test_float16_training_gets_loss_scaling(float16_policy: None) -> None:
    """Gradients of 1e-8 underflow in float16: without loss scaling the weights never move."""
    import keras

    from hpctf.compute.cluster.joining import with_loss_scaling

    plain = keras.optimizers.SGD(1e6)
    assert _tiny_step(plain, 1e-8) == 0.0  # the defect: a plain optimizer's scale is 1
    wrapped = with_loss_scaling(keras.optimizers.SGD(1e6), "mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert _tiny_step(wrapped, 1e-8) > 0.0
    bf16 = keras.optimizers.SGD(0.1)
    assert with_loss_scaling(bf16, "mixed_bfloat16") is bf16
    assert with_loss_scaling(wrapped, "mixed_float16") is wrapped


def test_scaled_constant_rate_survives_a_restore(tmp_path: Path) -> None:
    """A checkpoint from a 2-replica job holds 0.02; resumed on 4 replicas the rate is the
    entry's 0.01 x 4, not the restored 0.02 (nor 0.02 x 4)."""
    import keras
    import tensorflow as tf

    from hpctf.compute.loop.learning_rate import learning_rate_scaler

    saved = keras.optimizers.Adam(0.01)
    saved.build([tf.Variable(1.0)])
    learning_rate_scaler(saved, 2)()
    path = tf.train.Checkpoint(optimizer=saved).save(str(tmp_path / "ckpt"))

    resumed = keras.optimizers.Adam(0.01)
    resumed.build([tf.Variable(1.0)])
    rescale = learning_rate_scaler(resumed, 4)  # taken from the entry, before the restore
    tf.train.Checkpoint(optimizer=resumed).restore(path)
    assert float(resumed.learning_rate) == pytest.approx(0.02)  # what the restore brings back
    assert rescale() == "learning rate scaled by 4 replicas: 0.01 -> 0.04"
    assert float(resumed.learning_rate) == pytest.approx(0.04)


def test_scaled_schedule(tmp_path: Path) -> None:
    """A schedule cannot be assigned a number (Keras raises TypeError): it is wrapped."""
    import keras
    import tensorflow as tf

    from hpctf.compute.loop.learning_rate import learning_rate_scaler

    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(schedule))
    optimizer.build([tf.Variable(1.0)])
    message = learning_rate_scaler(optimizer, 3)()
    assert message == "learning rate scaled by 3 replicas: ExponentialDecay x 3"
    assert float(optimizer.learning_rate) == pytest.approx(0.03)  # at step 0
    inner = optimizer.inner_optimizer
    inner.iterations.assign(10)
    assert float(inner.learning_rate) == pytest.approx(0.015)


# --- records --------------------------------------------------------------------------------------


def test_records_without_tensorboard_keep_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the tensorboard package tf.summary.scalar raises TBNotInstalledError at the first
    logged step; the records go on with metrics.jsonl and say so once, at the first record."""
    from hpctf.compute.records.chief_records import ChiefRecords
    from hpctf.core.run.rundir import RunDir

    monkeypatch.setitem(sys.modules, "tensorboard.summary.v2", None)
    run = RunDir(tmp_path)
    records = ChiefRecords(run, chief=True)
    records.record(10, {"loss": 0.5})
    records.record(20, {"accuracy": 0.9}, group="eval")
    assert caplog.text.count("tensorboard package is not installed") == 1
    lines = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    assert lines == [{"step": 10, "loss": 0.5}, {"step": 20, "eval": {"accuracy": 0.9}}]
    assert not (tmp_path / "tensorboard").exists()
    assert "tensorboard package is not installed" in caplog.text


def test_records_with_tensorboard_write_events(tmp_path: Path) -> None:
    from hpctf.compute.records.chief_records import ChiefRecords
    from hpctf.core.run.rundir import RunDir

    ChiefRecords(RunDir(tmp_path), chief=True).record(10, {"loss": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


# --- watchdog and process usage ------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_watchdog_fires_only_after_the_timeout_without_a_beat() -> None:
    clock = _Clock()
    fired = threading.Event()
    codes: list[int] = []

    def on_stall(code: int) -> None:
        codes.append(code)
        fired.set()

    dog = ProgressWatchdog(5, on_stall=on_stall, clock=clock).start()
    try:
        for _ in range(20):  # steps keep coming: 20 x 1 s, never 5 s without a beat
            clock.now += 1
            dog.beat("step")
        assert not fired.wait(1.0)
        clock.now += 5
        assert fired.wait(2.0)
        assert codes == [STALLED_EXIT]
    finally:
        dog.stop()


def test_watchdog_costs_one_thread_whatever_the_steps() -> None:
    before = threading.active_count()
    dog = ProgressWatchdog(60).start()
    try:
        for _ in range(100_000):
            dog.beat()
        assert threading.active_count() == before + 1
    finally:
        dog.stop()
    assert threading.active_count() == before


def test_process_usage() -> None:
    text = "Name:\tpython\nVmRSS:\t  204800 kB\nThreads:\t7\n"
    assert parse_status(text) == {"rss_mb": 200.0, "threads": 7}
    usage = process_usage()
    assert usage["threads"] >= 1 and usage["rss_mb"] > 1
    assert process_usage(Path("/nonexistent/status")) == {}


# TensorFlow's words when a peer goes away (TF 2.21, seen in test_training's kill and freeze
# tests): killed, frozen (rank 0's coordination service says it), rank 0 frozen (rank 1's
# heartbeats time out), and a collective that failed for a reason of its own.
KILLED = (
    "Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection reset by peer\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while "
    "calling /tensorflow.WorkerService/RecvBuf:\n"
)
FROZEN = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks "
    "are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have "
    "crashed."
)
CHIEF_FROZEN = (
    "Collective ops is aborted by: Deadline Exceeded\nRPC: /tensorflow.CoordinationService/"
    "Heartbeat\nThe error could be from a previous operation."
)


@pytest.mark.parametrize(
    ("rank", "code", "message", "named"),
    [
        (0, "UNAVAILABLE", KILLED, "rank 1 (localhost:"),
        (0, "UNAVAILABLE", FROZEN, "rank 1 (localhost:"),
        (1, "DEADLINE_EXCEEDED", CHIEF_FROZEN, "rank 0 (localhost:"),
        (1, "UNAVAILABLE", KILLED, None),  # names only this rank itself
        (0, "INVALID_ARGUMENT", KILLED, None),  # not how a lost peer shows
        (0, "DEADLINE_EXCEEDED", CHIEF_FROZEN, None),  # rank 0 is the leader itself
    ],
)
def test_a_lost_peer_is_named_by_rank_and_host(
    rank: int, code: str, message: str, named: str | None
) -> None:
    from hpctf.compute.cluster.peers import PeerLost, lost_peer
    from hpctf.compute.cluster.spec import cluster_spec
    from hpctf.core.errors import ENVIRONMENT_EXIT
    from hpctf.login.submitting.local import task_environment

    spec = cluster_spec(task_environment({}, 7, 2, rank), (20000, 30000), "{host}")
    lost = lost_peer(code, message, spec)
    if named is None:
        assert lost is None
        return
    assert isinstance(lost, PeerLost) and lost.exit_code == ENVIRONMENT_EXIT
    text = str(lost)
    assert text.startswith(named) and " on node localhost) stopped answering" in text
    assert "\n" not in text and f"this rank ({rank} on localhost)" in text


def test_a_tensorflow_outside_the_proven_range_is_said_in_the_probe_line() -> None:
    """pyproject.toml keeps TensorFlow below the next minor; one installed anyway (a site's
    module, --no-deps) is named untested in every rank's first line."""
    from hpctf.compute.compat.probe import outside_proven

    assert outside_proven("2.21.0") == outside_proven("2.16.2") == ""
    for version in ("2.22.0rc0", "2.15.1", "3.0.0"):
        assert outside_proven(version) == " (outside the proven 2.16-2.21: untested)"
    ceiling = (REPO / "pyproject.toml").read_text()
    assert ceiling.count(">=2.16,<2.22") == 6  # tf, gpu (x86_64 and others), keras2 (both)
