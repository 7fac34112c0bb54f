"""The chief's records of a run: metrics.jsonl (what ``hpctf status``, ``plot`` and the
benchmarks read), TensorBoard events, and the experiment's trackers
(:mod:`hpctf.compute.records.tracking`). The other ranks write nothing."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import tensorflow as tf

from hpctf.compute.records.tracking import start_tracking
from hpctf.core.errors import EnvironmentProblem
from hpctf.core.run.metrics_history import resumed_marker
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import open_append, safe_dir
from hpctf.core.settings.config import ResolvedConfig

log = logging.getLogger("hpctf.worker")


class ChiefRecords:
    """The chief's metrics.jsonl and TensorBoard events; nothing on the other ranks."""

    def __init__(self, run: RunDir, chief: bool, config: ResolvedConfig | None = None) -> None:
        """``config``: the run's, for its ``tracking:`` trackers (none without it)."""
        self._run = run
        self._chief = chief
        self._writer: Any = None
        # Made at the first record, not before the first step: importing tensorboard's summary
        # and opening the writer cost the chief about 0.05 s of CPU at every start.
        self._tensorboard = chief
        self._trackers = start_tracking(run, config) if chief and config is not None else []

    def resumed(self, step: int) -> None:
        """This start restored ``step`` (0: from scratch): records of earlier starts past it
        are superseded (:mod:`hpctf.core.run.metrics_history`). Once per start, after the
        restore, before the first record."""
        if not self._chief:
            return
        with self._run.metrics.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(resumed_marker(step, time.time())) + "\n")

    def record(self, step: int, values: dict[str, float], group: str | None = None) -> None:
        if not self._chief:
            return
        line = {"step": step, group: values} if group else {"step": step, **values}
        try:
            with open_append(self._run.metrics) as handle:
                handle.write((json.dumps(line) + "\n").encode("utf-8"))
        except OSError as exc:  # a full disk, a quota: the environment's, in one line
            raise EnvironmentProblem(
                f"cannot write {self._run.metrics}: {exc.strerror or exc}; free space there, "
                f"then hpctf resubmit {self._run.path}"
            ) from exc
        for tracker in self._trackers:
            tracker.log(step, values, group)
        if self._writer is None and self._tensorboard:
            self._writer = self._open_writer()
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(f"{group}/{name}" if group else name, value)
        self._writer.flush()

    def _open_writer(self) -> Any:
        """The TensorBoard writer, or None (said once) without the tensorboard package."""
        self._tensorboard = False  # asked once
        if _tensorboard_installed():
            return tf.summary.create_file_writer(str(safe_dir(self._run.path / "tensorboard")))
        log.warning(
            "the tensorboard package is not installed: no TensorBoard events, only %s "
            "(pip install tensorboard, or hpctf[tf])",
            self._run.metrics,
        )
        return None


def _tensorboard_installed() -> bool:
    """Whether ``tf.summary.scalar`` will work: TF imports tensorboard only at the first
    call, and raises TBNotInstalledError there, in the middle of training."""
    try:
        from tensorboard.summary.v2 import scalar  # noqa: F401
    except ImportError:
        return False
    return True
