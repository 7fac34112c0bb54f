"""A worker's own temporary directory, removed however the worker leaves.

Python's ``tempfile`` in a worker makes its files in one directory of the worker's own under
``$TMPDIR``: TensorFlow's autograph sources (``__autograph_generated_file*.py``), the other
ranks' throwaway checkpoints (:mod:`hpctf.compute.records.checkpoints`) and whatever the user's
code asks ``tempfile`` for. It is removed on every way out: the normal exit and an
exception's (an ``atexit`` function, registered before TensorFlow is imported so it runs after
TensorFlow's own), and the bounded exit that skips ``atexit``
(:func:`hpctf.compute.start.leaving.exit_now`).

Why: autograph deletes each source it wrote with an ``atexit`` function of its own, which the
bounded exit skips. On a loaded 2-node test cluster that bound fired after DONE, and the job's
``$TMPDIR`` kept 22 autograph files. On a cluster whose nodes keep ``/tmp`` they pile up job
after job.

``$TMPDIR`` itself is not changed: data a batch script staged there is still where it says,
and programs the user's code starts get the same ``$TMPDIR``. Only ``tempfile.gettempdir()``
answers the worker's own directory.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("hpctf")

_own: Path | None = None


def use_own_tmp(task_index: int) -> Path | None:
    """Point ``tempfile`` at a new directory (mode 0700) under the current temporary directory
    and return it. Without one (``$TMPDIR`` full or not writable), log one line and return
    None: the files go where they went before."""
    global _own
    try:
        path = Path(tempfile.mkdtemp(prefix=f"hpctf-rank{task_index}-"))
    except OSError as exc:
        log.warning(
            "no temporary directory of this worker's own (%s); using %s", exc, tempfile.gettempdir()
        )
        return None
    _own = path
    tempfile.tempdir = str(path)
    atexit.register(remove_own_tmp)
    return path


def remove_own_tmp() -> None:
    """Remove the worker's own temporary directory, if it has one; never raises."""
    global _own
    if _own is None:
        return
    path, _own = _own, None
    tempfile.tempdir = None  # gettempdir() finds $TMPDIR again
    shutil.rmtree(path, ignore_errors=True)
