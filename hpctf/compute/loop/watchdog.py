"""One thread per worker process that ends it when training stops making progress.

A live rank that stops calling collectives (a deadlock in user code, a hung filesystem, a
wedged driver) keeps sending heartbeats, so TF's coordination service never notices, and every
other rank waits in its next collective forever, holding the whole allocation. TensorFlow's own
bound, ``CommunicationOptions(timeout_seconds=...)``, cannot be used: on RING every collective
then leaves one OS thread behind until its timeout expires (measured: ~1,000 threads/s on the
digits example, the process aborts with ``std::system_error: Resource temporarily unavailable``
after ~15,000 threads, about 3,800 steps). This watchdog has a fixed cost whatever the run
length: one thread, and a float written per step.
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time
from collections.abc import Callable

from hpctf.compute.process.leaving import exit_now
from hpctf.core.errors import STALLED_EXIT

log = logging.getLogger("hpctf.worker")


class ProgressWatchdog:
    """Exits the process when :meth:`beat` has not been called for ``timeout`` seconds.

    :meth:`beat` is the whole per-step cost: one monotonic clock read and one attribute store,
    safe without a lock under the GIL. The thread wakes every ``timeout / 10`` seconds (between
    0.5 and 10 s), so the process ends between ``timeout`` and ``1.1 * timeout`` after the last
    beat. ``what`` names the last thing that made progress and ``where`` this rank (rank and
    host), for the message.
    """

    def __init__(
        self,
        timeout: float,
        *,
        on_stall: Callable[[int], None] = exit_now,
        clock: Callable[[], float] = time.monotonic,
        where: str = "this rank",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.where = where
        self._on_stall = on_stall
        self._clock = clock
        self._last = clock()
        self._what = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpctf-watchdog", daemon=True)

    def start(self) -> ProgressWatchdog:
        self._last = self._clock()
        self._thread.start()
        return self

    def beat(self, what: str = "step") -> None:
        """Progress was made (a step, a checkpoint, an evaluation batch)."""
        self._last = self._clock()
        self._what = what

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def stalled_for(self) -> float:
        return self._clock() - self._last

    def await_verdict(self) -> None:
        """When this rank made no progress for half the timeout or more, wait until this
        watchdog has had its say (it ends the process on a stall); return at once otherwise."""
        if self.stalled_for() < self.timeout / 2:
            return
        # The watchdog checks every timeout/10 s (0.5 to 10 s); one check more, and a margin.
        check = min(max(self.timeout / 10, 0.5), 10.0)
        time.sleep(max(self.timeout - self.stalled_for(), 0.0) + 2 * check)

    def _watch(self) -> None:
        interval = min(max(self.timeout / 10, 0.5), 10.0)
        while not self._stop.wait(interval):
            idle = self.stalled_for()
            if idle >= self.timeout:
                log.error(
                    "%s: no progress for %.0f s (train.stall_timeout_seconds %g; last: %s): "
                    "this rank or a peer is stuck; the stacks of this rank follow; exiting %d "
                    "so the job ends",
                    self.where,
                    idle,
                    self.timeout,
                    self._what,
                    STALLED_EXIT,
                )
                for handler in logging.getLogger("hpctf").handlers:
                    handler.flush()
                # Where every thread of this rank is: the stuck rank's stack shows the cause
                # (an input pipeline, a lock, a hung filesystem); the others show a collective.
                faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
                self._on_stall(STALLED_EXIT)
                return
