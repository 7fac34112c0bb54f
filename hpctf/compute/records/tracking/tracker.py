"""One tracker run per hpctf run, from the chief: :class:`Tracker` sends a :class:`Backend`'s
calls from a thread of its own, with a bounded queue, retries and the run directory's state
(``tracking/<tracker>.json``: the tracker's run id, the last step logged per group, whether
the parameters were logged). The contract is in :mod:`hpctf.compute.records.tracking`."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hpctf.core.run import snapshot
from hpctf.core.run.history import read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.safe_files import safe_dir, write_atomic
from hpctf.core.secrets import redact
from hpctf.core.settings.config import ResolvedConfig

log = logging.getLogger("hpctf.worker")

RETRIES = 3
RETRY_PAUSE_S = 0.5
MAX_FAILURES = 3
FLUSH_S = 2.0
# Of FLUSH_S, kept for the tracker run's end state: a backlog of steps still queued when it
# begins is left out, so that the run is not left looking finished (W&B would end it itself).
END_STATE_S = 0.5
QUEUE_SIZE = 10_000


class Backend(Protocol):
    """One tracker. Each method may raise: the caller retries, logs and gives up."""

    name: str

    def start(self, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> str:
        """Create the tracker run (``run_id`` None) or resume it; its id. Called from the
        tracker's thread: a slow import or connection here costs the training nothing."""

    def log_params(self, params: Mapping[str, str]) -> None: ...

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None: ...

    def finish(self, done: bool) -> None:
        """The hpctf run is done (True), or this start stopped and a later one resumes it."""


def flat_params(config: ResolvedConfig) -> dict[str, str]:
    """The resolved experiment as ``section.key`` -> text, and the site's name; ``env`` and
    ``setup`` left out (they may hold tokens), a URI's password redacted (everyone on the
    tracker's experiment sees its parameters)."""
    data = config.experiment.model_dump(exclude={"env", "setup"})
    out: dict[str, str] = {"site": config.site.name}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            out[prefix] = redact(json.dumps(value) if not isinstance(value, str) else value)

    walk("", data)
    return out


def run_tags(run: RunDir) -> dict[str, str]:
    """The run directory, its code snapshot's commit, and its Slurm jobs so far."""
    tags = {"hpctf.run_dir": str(run.path)}
    commits = [s.git_commit for s in snapshot.read(run.path) if s.git_commit]
    if commits:
        tags["hpctf.git_commit"] = ",".join(commits)
    jobs = dict.fromkeys(read_history(run).job_ids)
    if os.environ.get("SLURM_JOB_ID"):
        jobs[os.environ["SLURM_JOB_ID"]] = None
    if jobs:
        tags["hpctf.slurm_jobs"] = ",".join(jobs)
    return tags


class Tracker:
    """The chief's handle on one tracker: :meth:`log` never blocks and never raises."""

    def __init__(self, run: RunDir, backend: Backend, config: ResolvedConfig) -> None:
        self._run = run
        self._backend = backend
        self._path = run.path / "tracking" / f"{backend.name}.json"
        self._state: dict[str, Any] = _read_state(self._path)
        self._last: dict[str, int] = dict(self._state.get("last_step") or {})
        self._queue: queue.Queue[_Item] = queue.Queue(QUEUE_SIZE)
        self._failures = 0
        self._off = False
        self._said_full = False
        self._closed = False
        self._closing = threading.Event()  # at exit: retries without their pause
        self._skip_steps = False  # at exit, past FLUSH_S - END_STATE_S: steps left out
        threading.Thread(target=self._send, name="hpctf-tracker", daemon=True).start()
        tags, params = run_tags(run), flat_params(config)
        self._put(_Item(lambda: self._start(config.experiment.name + "/" + run.path.name, tags)))
        if not self._state.get("params_logged"):
            self._put(_Item(lambda: backend.log_params(params),
                            lambda: self._save(params_logged=True)))  # fmt: skip
        atexit.register(self.close)

    def log(self, step: int, values: Mapping[str, float], group: str | None = None) -> None:
        """Queue one logged step (``group``: ``eval``... as ``group/name``); a step at or below
        the last one logged for its group (an earlier start's) is left out."""
        key = group or "train"
        if self._off or step <= self._last.get(key, -1):
            return
        self._last[key] = step
        named = {f"{group}/{k}" if group else k: float(v) for k, v in values.items()}
        self._put(_Item(lambda: self._backend.log_metrics(step, named),
                        lambda: self._save(last_step={**self._saved_steps(), key: step}),
                        step=True))  # fmt: skip

    def close(self) -> None:
        """Mark the tracker run finished (DONE) or stopped, after what is queued, within
        ``FLUSH_S``: steps still queued ``END_STATE_S`` before its end are left out (said in
        the log), the end state is not."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        done = self._run.done.exists()
        deadline = time.monotonic() + FLUSH_S
        end = _Item(lambda: self._backend.finish(done))
        try:
            self._queue.put_nowait(end)
        except queue.Full:
            self._skip_steps = True
            with contextlib.suppress(queue.Full):
                self._queue.put(end, timeout=FLUSH_S - END_STATE_S)
        while self._queue.unfinished_tasks and time.monotonic() < deadline - END_STATE_S:
            time.sleep(0.02)
        if self._queue.unfinished_tasks > 1 and not self._off:
            log.warning("tracker %s: %d call(s) not sent within %.1f s at exit; steps left out",
                        self._backend.name, self._queue.unfinished_tasks - 1,
                        FLUSH_S - END_STATE_S)  # fmt: skip
        self._skip_steps = True
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _start(self, run_name: str, tags: Mapping[str, str]) -> None:
        run_id = self._backend.start(self._state.get("run_id"), run_name, tags)
        if run_id != self._state.get("run_id"):
            self._save(run_id=run_id)
        # atexit runs the last registered first: close (the run's end state) before the
        # tracker's own exit hook, registered by its start (W&B's would finish the run itself).
        atexit.unregister(self.close)
        atexit.register(self.close)
        log.info("tracker %s: run %s", self._backend.name, run_id)

    def _saved_steps(self) -> dict[str, int]:
        return dict(self._state.get("last_step") or {})

    def _save(self, **changes: Any) -> None:
        self._state.update(changes)
        safe_dir(self._path.parent)
        write_atomic(self._path, json.dumps(self._state))

    def _put(self, item: _Item) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if not self._said_full:
                self._said_full = True
                log.warning("tracker %s: %d calls queued (slow?); later steps left out",
                            self._backend.name, QUEUE_SIZE)  # fmt: skip

    def _send(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if not self._off and not (item.step and self._skip_steps):
                    self._call(item.call, item.then)
            finally:
                self._queue.task_done()

    def _call(self, call: Callable[[], None], then: Callable[[], None]) -> None:
        for attempt in range(RETRIES):
            try:
                call()
            except Exception as exc:  # the tracker's own errors: never the training's
                if self._failures == 0 and attempt == 0:
                    log.warning("tracker %s failed (training goes on; retrying): %s",
                                self._backend.name, _one_line(exc))  # fmt: skip
                # At exit, a tracker that is down fails its last tries at once instead of
                # holding the exit for FLUSH_S (a refused connection: measured, README).
                self._closing.wait(RETRY_PAUSE_S * (attempt + 1))
                continue
            then()
            return
        self._failures += 1
        if self._failures >= MAX_FAILURES or self._state.get("run_id") is None:
            self._off = True
            log.warning("tracker %s: off for the rest of this start after %d failed call(s)",
                        self._backend.name, self._failures)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Item:
    """One queued call; ``then`` once it succeeded; ``step``: a logged step (left out at exit
    when the time is up)."""

    call: Callable[[], None]
    then: Callable[[], None] = lambda: None
    step: bool = False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _read_state(path: os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}
