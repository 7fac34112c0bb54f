"""Write scikit-learn's digits as sharded TFRecord files (no download needed).

    python examples/tfrecords/write_shards.py DATA_DIR [--shards 4]

Writes DATA_DIR/train-0000-of-0004.tfrecord ... and DATA_DIR/val-0000-of-0001.tfrecord.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def _example(features: np.ndarray, label: int) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=features.tolist())),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(data_dir: Path, shards: int) -> list[Path]:
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(
        features, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for split, x, y, count in (("train", x_train, y_train, shards), ("val", x_val, y_val, 1)):
        for shard in range(count):
            path = data_dir / f"{split}-{shard:04d}-of-{count:04d}.tfrecord"
            with tf.io.TFRecordWriter(str(path)) as writer:
                for i in range(shard, len(x), count):
                    writer.write(_example(x[i], int(y[i])))
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    for path in write(args.data_dir, args.shards):
        print(path)


if __name__ == "__main__":
    main()
