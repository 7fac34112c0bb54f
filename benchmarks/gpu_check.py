"""GPU check: hpctf's own training path against a plain TensorFlow script, in one run.

Both train the same ResNet-50 (``keras.applications.ResNet50(weights=None)``) on the same
synthetic images with the same global batch, precision and collective implementation, each in
a fresh process, alternating round by round so that load on the machine hits both alike:

* hpctf: ``hpctf submit`` of a one-worker experiment on ``--site local`` (the worker runs the
  code it runs under Slurm: TF_CONFIG, the GPU check, MultiWorkerMirroredStrategy, the built-in
  loop, its logging, preemption checks and final checkpoint), with ``train.mixed_precision``,
  ``train.jit_compile`` and ``train.communication``;
* plain: a hand-written custom loop under a one-worker MultiWorkerMirroredStrategy (TF_CONFIG
  for one worker on localhost), ``strategy.run`` in a ``tf.function``, the forward and backward
  compiled with XLA, ``keras.optimizers.LossScaleOptimizer`` under mixed_float16. Not
  ``model.fit``: Keras 3's fit is broken under MWMS (keras-team/keras#20585).

Both time windows of ``--log-every`` steps, each ended by reading the loss on the host (as
hpctf's loop does when it logs); the first window (tracing, XLA compilation) is left out.
Prints images/s for both and their ratio, and writes them as JSON.

On a GPU node (full size: 224x224 images, 1,000 classes, NCCL, mixed_float16, XLA; the GPUs
of CUDA_VISIBLE_DEVICES, else GPU 0):

    .venv/bin/python benchmarks/gpu_check.py [--rounds 2] [--steps 300] [--batch 256] \
        [--gpus 0] [--json gpu-check.json] [--min-ratio 0.95]

Anywhere, in CI (32x32 images, 12 steps, CPU only, RING, mixed_bfloat16, XLA; both sides at once):

    .venv/bin/python benchmarks/gpu_check.py --tiny --json tiny.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass(frozen=True)
class Setup:
    """What both sides train, and how."""

    image_size: int
    classes: int
    global_batch: int
    steps: int
    log_every: int
    examples: int  # distinct synthetic images, cached, repeated
    shuffle_buffer: int
    communication: str  # "nccl" or "ring"
    jit_compile: bool
    gpus: str  # CUDA_VISIBLE_DEVICES for both sides; "" hides every GPU

    @property
    def precision(self) -> str:
        """hpctf's rule for train.mixed_precision: float16 where GPUs compute, else bfloat16."""
        return "mixed_float16" if self.gpus else "mixed_bfloat16"


FULL = Setup(224, 1000, 256, 300, 50, 512, 512, "nccl", True, "0")
TINY = Setup(32, 10, 8, 12, 4, 32, 16, "ring", True, "")


# --- the model and the data: one definition for both sides -----------------------------------


def synthetic_images(image_size: int, classes: int, examples: int) -> Any:
    """``examples`` random uint8 images with labels, unbatched, made once and cached."""
    import tensorflow as tf

    def example(index: Any) -> tuple[Any, Any]:
        seed = tf.stack([index, tf.constant(0, tf.int64)])
        pixels = tf.random.stateless_uniform(
            [image_size, image_size, 3], seed=seed, minval=0, maxval=256, dtype=tf.int32
        )
        return tf.cast(pixels, tf.uint8), tf.cast(index % classes, tf.int32)

    dataset = tf.data.Dataset.range(examples)
    return dataset.map(example, num_parallel_calls=tf.data.AUTOTUNE).cache()


def resnet50(image_size: int, classes: int) -> Any:
    """ResNet-50 on uint8 images, logits out; in the global mixed-precision policy."""
    import keras

    backbone = keras.applications.ResNet50(
        weights=None,
        input_shape=(image_size, image_size, 3),
        classes=classes,
        classifier_activation=None,
    )
    return keras.Sequential(
        [
            keras.Input((image_size, image_size, 3), dtype="uint8"),
            keras.layers.Rescaling(1 / 127.5, offset=-1.0),
            backbone,
        ]
    )


def sgd() -> Any:
    """SGD with momentum, with dynamic loss scaling when the policy computes in float16."""
    import keras

    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def build(image_size: int, classes: int, examples: int, shuffle_buffer: int) -> Any:
    """hpctf's training entry (train.entry gpu_check:build)."""
    import keras

    import hpctf

    return hpctf.Task(
        model=resnet50(image_size, classes),
        optimizer=sgd(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
        train_data=lambda: synthetic_images(image_size, classes, examples),
        shuffle_buffer=shuffle_buffer,
    )


# --- the plain script ---------------------------------------------------------------------


def plain_worker(setup: Setup, out: Path) -> None:
    """The same training, written by hand with TensorFlow and Keras only; windows to ``out``.

    The step and its timing are plain_mwms.py's (a custom loop with no hpctf code), here
    with one worker, mixed precision and XLA."""
    from plain_mwms import free_ports, make_train_step, timed_windows

    (port,) = free_ports(1)  # the one worker's gRPC server
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": [f"localhost:{port}"]}, "task": {"type": "worker", "index": 0}}
    )
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(setup.precision)
    implementations = tf.distribute.experimental.CommunicationImplementation
    implementation = implementations.NCCL if setup.communication == "nccl" else implementations.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=implementation
        )
    )
    with strategy.scope():
        model = resnet50(setup.image_size, setup.classes)
        optimizer = sgd()
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def dataset_fn(context: Any) -> Any:
        per_replica = context.get_per_replica_batch_size(setup.global_batch)
        dataset = synthetic_images(setup.image_size, setup.classes, setup.examples).repeat()
        dataset = dataset.shuffle(setup.shuffle_buffer, seed=0)
        return dataset.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    train_step = make_train_step(
        strategy, model, optimizer, loss_fn, setup.global_batch, setup.jit_compile
    )
    windows = timed_windows(train_step, iterator, setup.steps, setup.log_every)
    gpus = tf.config.list_physical_devices("GPU")
    details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
    out.write_text(
        json.dumps(
            {
                "steps_per_s": windows,
                "replicas": strategy.num_replicas_in_sync,
                "gpus": len(gpus),
                "device": details.get("device_name", "CPU"),
                "tensorflow": tf.__version__,
                "policy": keras.mixed_precision.global_policy().name,
            }
        )
    )


# --- the driver ---------------------------------------------------------------------------


def _environment(setup: Setup, runs_root: Path) -> dict[str, str]:
    # Without the SLURM_* of an allocation this may run in: --site local gives its one worker
    # the variables of a one-task step, and nothing else of the outer job may leak into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update(CUDA_VISIBLE_DEVICES=setup.gpus, HPCTF_RUNS_ROOT=str(runs_root))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _inherited_gpus() -> str | None:
    """CUDA_VISIBLE_DEVICES as Slurm (or the user) set it for this process, if it names GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return None if visible in ("", "NoDevFiles", "-1") else visible


def run_hpctf(setup: Setup, work: Path, index: int) -> dict[str, Any]:
    """One hpctf run: windows from metrics.jsonl, what the worker said it used from its log."""
    experiment = work / f"hpctf-{index}" / "experiment.yaml"
    experiment.parent.mkdir(parents=True)
    args = {
        "image_size": setup.image_size,
        "classes": setup.classes,
        "examples": setup.examples,
        "shuffle_buffer": setup.shuffle_buffer,
    }
    config = {
        "name": "gpu-check",
        "site": "local",
        "resources": {"nodes": 1, "tasks_per_node": 1},
        "train": {
            "entry": "gpu_check:build",
            "args": args,
            "steps": setup.steps,
            "global_batch_size": setup.global_batch,
            "log_every_steps": setup.log_every,
            "python_path": [str(HERE)],
            "mixed_precision": True,
            "jit_compile": setup.jit_compile,
            "communication": setup.communication,
        },
        "checkpoint": {"every_steps": setup.steps, "keep": 1},
    }
    experiment.write_text(json.dumps(config, indent=2))  # JSON is YAML
    proc = subprocess.run(
        [sys.executable, "-m", "hpctf", "submit", str(experiment), "--site", "local"],
        env=_environment(setup, experiment.parent / "runs"),
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"run directory: (\S+)", proc.stdout)
    logs = ""
    if found:
        rank0 = Path(found.group(1)) / "logs" / "rank-0.log"
        logs = rank0.read_text() if rank0.exists() else ""
    if proc.returncode != 0 or not found:
        raise SystemExit(
            f"hpctf run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}\n{logs[-3000:]}"
        )
    lines = (Path(found.group(1)) / "metrics.jsonl").read_text().splitlines()
    windows = [
        record["steps_per_s"] for record in map(json.loads, lines) if "steps_per_s" in record
    ]
    said = re.search(
        r"(\d+) replicas, (\d+) GPU\(s\) on this rank, mixed precision (\S+), XLA (\S+)", logs
    )
    return {
        "steps_per_s": windows,
        "worker_said": said.group(0) if said else None,
        "gpus": int(said.group(2)) if said else None,
        "policy": said.group(3) if said else None,
    }


def run_plain(setup: Setup, work: Path, index: int) -> dict[str, Any]:
    out = work / f"plain-{index}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--plain-worker",
            json.dumps(asdict(setup)),
            "--out",
            str(out),
        ],
        env=_environment(setup, work / "unused"),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"plain run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def images_per_s(runs: list[dict[str, Any]], batch: int) -> float:
    """Median over every run's windows but its first (tracing and XLA compilation)."""
    windows = [w for run in runs for w in run["steps_per_s"][1:]]
    if not windows:
        raise SystemExit("no timed window: give more --steps than --log-every x 2")
    return statistics.median(windows) * batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="32x32 images, 12 steps, CPU, RING")
    parser.add_argument("--rounds", type=int, default=None, help="default: 2 (tiny: 1)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--log-every", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None, help="global batch")
    parser.add_argument(
        "--gpus",
        default=None,
        help="CUDA_VISIBLE_DEVICES for both sides (default: the one this runs with, else 0)",
    )
    parser.add_argument("--no-xla", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--min-ratio", type=float, default=0.0, help="exit 1 if hpctf/plain falls below this"
    )
    parser.add_argument("--plain-worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.plain_worker:
        plain_worker(Setup(**json.loads(args.plain_worker)), args.out)
        return 0

    setup = TINY if args.tiny else FULL
    changes: dict[str, Any] = {}
    for key, value in (
        ("steps", args.steps),
        ("log_every", args.log_every),
        ("global_batch", args.batch),
        ("gpus", None if args.tiny else args.gpus or _inherited_gpus()),
    ):
        if value is not None:
            changes[key] = value
    if args.no_xla:
        changes["jit_compile"] = False
    setup = replace(setup, **changes)
    rounds = args.rounds or (1 if args.tiny else 2)

    hpctf_runs: list[dict[str, Any]] = []
    plain_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hpctf-gpu-check-") as tmp:
        work = Path(tmp)
        for index in range(rounds):  # alternate who goes first
            if args.tiny:
                # Numbers that say nothing, so both sides at once: each is mostly one core
                # compiling ResNet-50 with XLA, and CI waits for the slower only.
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    hpctf_side = pool.submit(run_hpctf, setup, work, index)
                    plain_side = pool.submit(run_plain, setup, work, index)
                    hpctf_runs.append(hpctf_side.result())
                    plain_runs.append(plain_side.result())
                print(f"round {index + 1}/{rounds}: both sides done", file=sys.stderr)
                continue
            order = ("hpctf", "plain") if index % 2 == 0 else ("plain", "hpctf")
            for side in order:
                if side == "hpctf":
                    hpctf_runs.append(run_hpctf(setup, work, index))
                else:
                    plain_runs.append(run_plain(setup, work, index))
                print(f"round {index + 1}/{rounds}: {side} done", file=sys.stderr, flush=True)

    if setup.gpus and not all(run["gpus"] for run in hpctf_runs + plain_runs):
        raise SystemExit(
            "no GPU was visible to the runs (CUDA_VISIBLE_DEVICES="
            f"{setup.gpus}): not a GPU node, or TensorFlow is a CPU-only build; use --tiny on CPUs"
        )
    hpctf_rate = images_per_s(hpctf_runs, setup.global_batch)
    plain_rate = images_per_s(plain_runs, setup.global_batch)
    ratio = hpctf_rate / plain_rate
    results = {
        "mode": "tiny" if args.tiny else "full",
        "setup": asdict(setup),
        "model": "keras.applications.ResNet50(weights=None)",
        "precision": setup.precision,
        "device": plain_runs[0]["device"],
        "tensorflow": plain_runs[0]["tensorflow"],
        "rounds": rounds,
        "hpctf_images_per_s": round(hpctf_rate, 2),
        "plain_images_per_s": round(plain_rate, 2),
        "ratio": round(ratio, 4),
        "hpctf_runs": hpctf_runs,
        "plain_runs": plain_runs,
    }
    print(
        f"ResNet-50 {setup.image_size}x{setup.image_size}, global batch {setup.global_batch}, "
        f"{setup.precision}, XLA {'on' if setup.jit_compile else 'off'}, "
        f"{setup.communication.upper()}, {results['device']}, TF {results['tensorflow']}"
    )
    print(f"hpctf worker   {hpctf_rate:10.1f} images/s")
    print(f"plain TF       {plain_rate:10.1f} images/s")
    print(f"ratio hpctf/plain {ratio:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if ratio < args.min_ratio else 0


if __name__ == "__main__":
    sys.exit(main())
