"""The train step's collectives keep the instance keys they got when traced
(hpctf/compute/cluster/joining.py, ``fixed_instance_keys``): MWMS otherwise takes a new key per
call, and TensorFlow keeps state for every key (RSS +3.4 MB per 1,000 steps on 2 RING workers).
In a fresh process: a strategy configures TensorFlow's collectives once per process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

SCRIPT = """
import json
import keras
import tensorflow as tf
from hpctf.api import Task
from hpctf.compute.loop.training import make_train_step

# Two replicas in one process (two logical CPUs): a collective between them, as between two
# workers, without starting a second one (TF's own tests make it this way).
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
keys = strategy.extended._collective_keys._instance_key_table  # group -> device -> next key
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    task = Task(model=model, optimizer=keras.optimizers.SGD(0.1),
                loss=lambda y, p: keras.ops.mean((y - p) ** 2, axis=-1),
                train_data=lambda: None)
data = tf.data.Dataset.from_tensor_slices(([[1.0, 2.0]] * 8, [[1.0]] * 8)).repeat().batch(2)


def used():
    return sum(next_key for devices in keys.values() for next_key in devices.values())


def calls(step):
    iterator = iter(strategy.experimental_distribute_dataset(data))
    step(iterator)  # traced here
    traced = used()
    for _ in range(5):
        step(iterator)
    return used() - traced


hpctf_step = make_train_step(strategy, task, 2, jit_compile=False)
fixed = calls(hpctf_step)


@tf.function
def plain_step(iterator):  # the same step without hpctf: TF's per-call keys
    features, labels = next(iterator)
    return strategy.reduce("SUM", strategy.run(lambda x, y: tf.reduce_sum(x - y),
                                                (features, labels)), axis=None)


print(json.dumps({"fixed": fixed, "plain": calls(plain_step)}))
"""


def test_the_train_step_takes_no_new_collective_keys_per_call() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert keys["plain"] >= 5, keys  # TF's default: a new key at every call (the leak)
    assert keys["fixed"] == 0, keys
