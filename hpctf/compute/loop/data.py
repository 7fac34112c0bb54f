"""Input pipelines: explicit, logged sharding and a data position that survives a restart.

The shard policy is decided here, not left to tf.data's AUTO, which silently falls back to DATA
when it cannot find files and then every worker reads the whole data set (tensorflow#42146).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import tensorflow as tf

from hpctf.api import DataSource, Files
from hpctf.compute.users_code.attribution import call
from hpctf.core.errors import UserError

log = logging.getLogger("hpctf.worker")


@dataclass(frozen=True)
class ShardPlan:
    """How one worker gets its share of the training data."""

    policy: Literal["FILE", "DATA"]
    files: tuple[str, ...]  # FILE: this worker's files; DATA from Files: every file
    reason: str


def plan_shards(source: DataSource, num_workers: int, worker_index: int) -> ShardPlan:
    """FILE when there are at least as many files as workers, DATA otherwise (pure)."""
    if not isinstance(source, Files):
        return ShardPlan(
            "DATA",
            (),
            "train_data is a function, not hpctf.Files: every worker builds the "
            f"whole data set and keeps 1/{num_workers} of the examples",
        )
    paths = tuple(sorted(source.paths))
    if not paths:
        raise UserError("train_data: hpctf.Files was given no paths")
    if len(paths) >= num_workers:
        mine = paths[worker_index::num_workers]
        return ShardPlan("FILE", mine, f"{len(mine)} of {len(paths)} files")
    return ShardPlan(
        "DATA",
        paths,
        f"only {len(paths)} file(s) for {num_workers} workers: every worker "
        f"reads every file and keeps 1/{num_workers} of the examples ({num_workers}x the reads)",
    )


def _examples(source: DataSource, files: tuple[str, ...], seed: int) -> Any:
    if isinstance(source, Files):
        names = tf.data.Dataset.from_tensor_slices(list(files))
        # Reshuffle the file order every pass, the same way on every restart (fixed seed).
        names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        return call("Files.read", source.read, names)
    return call("train_data", source)


def deterministic_options() -> Any:
    options = tf.data.Options()
    options.deterministic = True
    # hpctf shards explicitly; tf.data must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def training_input(
    source: DataSource,
    plan: ShardPlan,
    global_batch: int,
    seed: int,
    shuffle_buffer: int,
    start_step: int,
) -> Any:
    """The function for ``strategy.distribute_datasets_from_function``.

    The distributed iterator cannot be checkpointed; skipping the batches already trained on
    before distributing makes a resumed run see exactly the batches an uninterrupted one would.
    """

    def dataset_fn(context: tf.distribute.InputContext) -> Any:
        per_replica = context.get_per_replica_batch_size(global_batch)
        local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        dataset = _examples(source, plan.files, seed).repeat()
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if plan.policy == "DATA":
            # Every worker builds the same shuffled stream and keeps every n-th example.
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        dataset = dataset.batch(per_replica, drop_remainder=True)
        dataset = dataset.skip(start_step * local_replicas)
        return dataset.prefetch(tf.data.AUTOTUNE).with_options(deterministic_options())

    return dataset_fn


def evaluation_dataset(source: DataSource, global_batch: int) -> Any:
    """The whole validation set, batched globally; tf.data's DATA sharding splits each batch."""
    files = tuple(sorted(source.paths)) if isinstance(source, Files) else ()
    if isinstance(source, Files):
        dataset = call("Files.read", source.read, tf.data.Dataset.from_tensor_slices(list(files)))
    else:
        dataset = call("eval_data", source)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.batch(global_batch).with_options(options)


def cardinality(source: DataSource) -> int | None:
    """Examples in one pass over ``source``, when known."""
    if isinstance(source, Files):
        return source.examples
    count = int(call("train_data", source).cardinality())
    return count if count >= 0 else None
