"""The baseline for hpctf's runtime overhead: the digits example written by hand, no hpctf.

What a user would write without hpctf, following TensorFlow's multi-worker custom-loop tutorial
(tensorflow.org/tutorials/distribute/multi_worker_with_ctl): TF_CONFIG for N workers on
localhost, ``MultiWorkerMirroredStrategy`` over RING, ``distribute_datasets_from_function``,
``strategy.run`` in a ``tf.function`` with ``tf.nn.compute_average_loss``. Not ``model.fit``:
Keras 3's fit is broken under MWMS (keras-team/keras#20585).

The same model, data, optimizer and global batch as ``examples/digits`` (digits:build with its
defaults) under hpctf's built-in loop: an MLP of 64 hidden units on scikit-learn's 8x8 digits
(the same 80 % training split), Adam(0.01), the examples shuffled (buffer 10,000, seed 0),
repeated, every worker keeping 1/N of them (hpctf's DATA sharding), batched per replica.
The loss is read on the host every ``--log-every`` steps, as hpctf's loop does when it logs;
those windows are the measurement.

    .venv/bin/python benchmarks/plain_mwms.py --steps 3000 --log-every 250 --out plain.json

Rank 0 writes ``{"steps_per_s": [one per window], ...}`` to ``--out``. Every rank prints,
after its first step, the line hpctf's worker logs there (``first step 1 after 8.12 s (3.50 s
CPU): python 0.05 s, tensorflow import 5.10 s, ...``, :mod:`hpctf.compute.process.startup_clock`'s
form), the baseline of ``bench_first_step.py``.

``make_train_step`` and ``timed_windows`` are also the plain side of ``gpu_check.py``. They
mirror ``hpctf.compute.loop.training.make_train_step`` on purpose and import nothing of hpctf: a
baseline that ran hpctf's code would measure nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN = 64
LEARNING_RATE = 0.01
SHUFFLE_BUFFER = 10_000
SEED = 0


def free_ports(count: int) -> list[int]:
    """``count`` ports free right now on localhost (each worker's gRPC server binds one)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def make_train_step(
    strategy: Any,
    model: Any,
    optimizer: Any,
    loss_fn: Any,
    global_batch: int,
    jit_compile: bool = False,
) -> Any:
    """A ``tf.function`` that trains one step on the next global batch of ``iterator`` and
    returns the loss summed over replicas: TensorFlow's custom-loop tutorial, plus what mixed
    precision needs (the loss in float32, scaled by a ``LossScaleOptimizer``; Keras 3's
    ``scale_loss`` returns the loss unchanged otherwise) and, with ``jit_compile``, the
    forward and backward compiled by XLA (the all-reduce stays outside)."""
    import tensorflow as tf

    def gradients(x: Any, y: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    compiled = tf.function(gradients, jit_compile=True) if jit_compile else gradients

    def replica_step(x: Any, y: Any) -> Any:
        loss, grads = compiled(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator: Any) -> Any:
        x, y = next(iterator)
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def make_multi_step(
    strategy: Any, model: Any, optimizer: Any, loss_fn: Any, global_batch: int, per_call: int
) -> Any:
    """``per_call`` steps in one ``tf.function`` call, in the form of TensorFlow's guide
    ("Iterating inside a tf.function", tensorflow.org/guide/distributed_training): a
    ``tf.range`` loop of ``strategy.run``, as Keras's ``steps_per_execution``. The steps reduce
    their gradients and nothing else; the call's last step's loss is reduced once, for the
    host to read. The fastest hand-written loop we found for the digits example (a loss
    reduced every step costs a collective a step: about a third of the steps/s here)."""
    import tensorflow as tf

    def replica_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_steps(iterator: Any) -> Any:
        for _ in tf.range(per_call - 1):
            x, y = next(iterator)
            strategy.run(replica_step, args=(x, y))
        x, y = next(iterator)
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_steps


def process_age() -> float:
    """Seconds since this process started (the kernel's ``starttime`` in /proc/self/stat,
    counted on CLOCK_BOOTTIME), as hpctf's worker measures its own; 0 without /proc. A copy of
    ``hpctf.compute.process.startup_clock.process_age``: this baseline imports nothing of hpctf."""
    try:
        with open("/proc/self/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class StartClock:
    """The ends of this process's phases before its first step, on ``time.time()``."""

    def __init__(self) -> None:
        self.started = time.time() - process_age()
        self.marks: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))

    def line(self, step: int) -> str:
        """The form of hpctf's line (``hpctf.compute.process.startup_clock.summary``)."""
        parts, before = [], self.started
        for phase, when in self.marks:
            parts.append(f"{phase} {max(when - before, 0.0):.2f} s")
            before = when
        total = self.marks[-1][1] - self.started
        times = os.times()
        cpu = times.user + times.system
        return f"first step {step} after {total:.2f} s ({cpu:.2f} s CPU): {', '.join(parts)}"


def timed_windows(
    train_step: Any,
    iterator: Any,
    steps: int,
    log_every: int,
    report: Callable[[int, float, float], None] | None = None,
    first_step: Callable[[], None] | None = None,
) -> list[float]:
    """Run ``steps`` steps; the steps/s of each window of ``log_every`` steps, each window
    ended by reading the loss on the host (which waits for the step, as hpctf's loop does when
    it logs; the steps between are dispatched back to back). ``report(step, loss, rate)``
    is called at the end of each window, ``first_step()`` once the first step returned (where
    hpctf's loop calls ``Session.step_done``)."""
    windows: list[float] = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        loss = train_step(iterator)
        if step == 1 and first_step is not None:
            first_step()
        if step % log_every == 0:
            value = float(loss)
            now = time.perf_counter()
            windows.append(round(log_every / (now - started), 3))
            started = now
            if report is not None:
                report(step, value, windows[-1])
    return windows


def worker(
    rank: int,
    ports: list[int],
    steps: int,
    log_every: int,
    batch: int,
    out: Path,
    hidden: int = HIDDEN,
    per_call: int = 1,
) -> None:
    clock = StartClock()
    clock.mark("python")
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"localhost:{port}" for port in ports]},
            "task": {"type": "worker", "index": rank},
        }
    )
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    clock.mark("tensorflow import")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    )
    clock.mark("join")
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, _, y_train, _ = train_test_split(
        features, labels, test_size=0.2, random_state=0, stratify=labels
    )
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(features.shape[1],)),
                keras.layers.Dense(hidden, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    clock.mark("model")

    def dataset_fn(context: Any) -> Any:
        per_replica = context.get_per_replica_batch_size(batch)
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat()
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=SEED)
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    if per_call > 1:
        train_step = make_multi_step(strategy, model, optimizer, loss_fn, batch, per_call)
    else:
        train_step = make_train_step(strategy, model, optimizer, loss_fn, batch)
    clock.mark("input and step function")

    def first_step() -> None:
        clock.mark("first step")
        print(clock.line(1), flush=True)

    def report(step: int, loss: float, rate: float) -> None:
        if rank == 0:
            print(
                f"step {step * per_call}/{steps} loss {loss:.4f} {rate * per_call:.1f} steps/s",
                flush=True,
            )

    calls = timed_windows(
        train_step, iterator, steps // per_call, log_every // per_call, report, first_step
    )
    windows = [round(rate * per_call, 3) for rate in calls]  # steps/s from calls/s
    if rank == 0:
        out.write_text(
            json.dumps(
                {
                    "steps_per_s": windows,
                    "replicas": strategy.num_replicas_in_sync,
                    "tensorflow": tf.__version__,
                }
            )
            + "\n"
        )


def run(
    workers: int,
    steps: int,
    log_every: int,
    batch: int,
    out: Path,
    timeout: float,
    extra: tuple[str, ...] = (),
) -> None:
    """Start ``workers`` processes of this script with TF_CONFIG on localhost; wait for all."""
    ports = free_ports(workers)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--rank",
                str(rank),
                "--ports",
                ",".join(map(str, ports)),
                "--steps",
                str(steps),
                "--log-every",
                str(log_every),
                "--batch",
                str(batch),
                "--out",
                str(out),
                *extra,
            ],
            stdout=None if rank == 0 else subprocess.DEVNULL,
            start_new_session=True,
        )
        for rank in range(workers)
    ]
    deadline = time.monotonic() + timeout
    try:
        while any(proc.poll() is None for proc in procs):
            failed = [proc.returncode for proc in procs if proc.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise SystemExit(
                    f"plain MWMS run failed (exit codes {[p.poll() for p in procs]}, "
                    f"timeout {timeout:.0f} s)"
                )
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if not out.exists():
        raise SystemExit("plain MWMS run wrote no results")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--log-every", type=int, default=250)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="units of the hidden layer")
    parser.add_argument(
        "--steps-per-call", type=int, default=1, help="steps in one tf.function call"
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        ports = [int(port) for port in args.ports.split(",")]
        worker(
            args.rank,
            ports,
            args.steps,
            args.log_every,
            args.batch,
            args.out,
            args.hidden,
            args.steps_per_call,
        )
    else:
        if args.log_every % args.steps_per_call:
            parser.error("--log-every must be a multiple of --steps-per-call")
        extra = ("--hidden", str(args.hidden), "--steps-per-call", str(args.steps_per_call))
        run(args.workers, args.steps, args.log_every, args.batch, args.out, args.timeout, extra)


if __name__ == "__main__":
    main()
