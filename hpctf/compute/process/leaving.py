"""How a worker process leaves: at once, its logs flushed, without the interpreter's
finalization of TensorFlow.

After DONE or an agreed preemption save the ranks have nothing left to do, but a normal
interpreter exit tears TensorFlow down: its coordination service agent says goodbye to the
leader (rank 0) and waits at a shutdown barrier, and a rank whose leader has already gone waits
on heartbeats to it (seen on a 2-node Slurm cluster: 1.7-62 s after DONE, holding the whole
allocation). The ranks instead pass one last barrier of their own
(:meth:`hpctf.compute.loop.session.Session.close`) and leave with ``os._exit`` (:func:`leave`,
after the ``atexit`` functions): every file hpctf
writes is complete before then (checkpoints, the journal and DONE are written whole and
replaced atomically; metrics.jsonl is closed and the TensorBoard writer flushed per record).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import NoReturn

from hpctf.compute.compat import python_internals
from hpctf.compute.process.worker_tmp import remove_own_tmp


def exit_now(code: int) -> NoReturn:
    """Leave without unwinding: also from another thread, while the main thread is blocked
    inside a TF collective, where neither an exception nor ``sys.exit`` can reach it. The
    worker's own temporary directory goes too (the ``atexit`` function that would remove it
    is skipped)."""
    remove_own_tmp()
    for handler in logging.getLogger("hpctf").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def leave(code: int) -> NoReturn:
    """The worker's normal exit, from the main thread: the ``atexit`` functions first (they
    delete TensorFlow's autograph temporary files and join an async save), then
    :func:`exit_now`, skipping only the interpreter's finalization of TensorFlow, which is what
    waits on peers. Bounded by :func:`exit_later`, set when training ended."""
    python_internals.run_exit_functions()  # what the interpreter's own exit runs first
    exit_now(code)


# What must not be torn down before the process leaves: destroying the built-in loop's tf.data
# iterator after training took 8 s on one rank (55 s in a soak), before the last barrier, and
# on a loaded machine ran past LEAVE_WITHIN_S. os._exit frees it with the rest of the process.
_held: list[object] = []


def hold_until_exit(thing: object) -> None:
    """Keep ``thing`` alive until the process leaves, so that its teardown never runs."""
    _held.append(thing)


# From the end of training (DONE written, or the agreed preemption save) to the process's exit.
LEAVE_WITHIN_S = 4.0


_ending = threading.Event()


def ending() -> bool:
    """Whether training ended (:func:`exit_later` was called): the peers may leave first."""
    return _ending.is_set()


def exit_later(code: int, seconds: float = LEAVE_WITHIN_S) -> None:
    """Bound what is left to do: the process exits ``code`` in ``seconds`` unless it has
    already."""
    _ending.set()
    timer = threading.Timer(seconds, exit_now, args=(code,))
    timer.name = "hpctf-exit-bound"
    timer.daemon = True
    timer.start()
