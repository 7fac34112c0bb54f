"""``train.script``: the user's own script, run as ``__main__`` on every task of the job.

:func:`hpctf.compute.start.runtime.run_worker` has set TF_CONFIG and the GPU binding, the batch
script the site's environment, and the quick preflight has passed; hpctf creates no strategy: the
script makes its own (``tf.distribute.MultiWorkerMirroredStrategy()`` reads TF_CONFIG). Keras's
``fit`` is made exact under that strategy first (:mod:`hpctf.compute.compat.keras_fit`: Keras 3
as installed, or tf_keras with ``train.keras: 2``), and refuses, before its first step, a model
built outside the strategy's scope on several workers. The script also finds
(:func:`script_environment`):

======================= ===================================================================
HPCTF_RUN_DIR           the run directory; also the chief's working directory, so its relative
                        outputs (``model.save("model.keras")``) land in the run; every other
                        rank works in a scratch directory of its own, removed when it leaves,
                        so no two ranks ever write the same file
HPCTF_CHECKPOINT_DIR    a directory on the shared filesystem for the script's own
                        checkpoints (``BackupAndRestore(os.environ["HPCTF_CHECKPOINT_DIR"])``)
HPCTF_SOURCE_DIR        the directory of the experiment file (for ``hpctf submit train.py``
                        the script's own), where relative input paths were meant
HPCTF_RANK              this task's rank, 0 .. HPCTF_NUM_WORKERS - 1
HPCTF_NUM_WORKERS       how many tasks the job runs the script on
HPCTF_IS_CHIEF          1 on rank 0, which alone should write outputs; else 0
======================= ===================================================================

Its exit feeds the requeue decision (:mod:`hpctf.core.run.history`): 0 is done (the chief writes
DONE), 75 saved and preempted (the chief records ``preempted``, so the job is requeued), any
other status failed; a status hpctf gives a meaning of its own (2, 3, 69, 70, 124) becomes 1.
No stall watchdog runs for a plain script (it reports no steps, so it could not tell a long
epoch from a hung collective); ``hpctf.keras.callbacks()`` starts one that its steps feed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import runpy
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctf.compute.cluster.spec import ClusterSpec
from hpctf.compute.compat import probe
from hpctf.compute.compat.keras_fit import prepare_fit
from hpctf.compute.loop.preemption import early_signal, leaving_words
from hpctf.compute.users_code import attribution as user_code
from hpctf.core.errors import (
    BUG_EXIT,
    ENVIRONMENT_EXIT,
    NODE_CHECK_EXIT,
    PREEMPTED_EXIT,
    STALLED_EXIT,
    USER_ERROR_EXIT,
    UserError,
)
from hpctf.core.run import journal
from hpctf.core.run.history import RunHistory, read_history
from hpctf.core.run.rundir import RunDir, write_atomic
from hpctf.core.settings.config import ResolvedConfig
from hpctf.core.settings.train import Train

log = logging.getLogger("hpctf.worker")

SCRIPT_CHECKPOINTS = "script_checkpoints"
# Exit statuses that mean something else to hpctf's batch script and journal.
RESERVED_EXITS = frozenset({USER_ERROR_EXIT, ENVIRONMENT_EXIT, NODE_CHECK_EXIT, BUG_EXIT})


def keras_environment(settings: Train) -> dict[str, str]:
    """What selects the Keras of ``train.keras``; set before TensorFlow is imported (TF reads
    TF_USE_LEGACY_KERAS once, at import)."""
    return {"TF_USE_LEGACY_KERAS": "1"} if settings.keras == 2 else {}


def check_keras(settings: Train, find: Callable[[str], object] = importlib.util.find_spec) -> None:
    """A UserError, before the script starts, when ``train.keras: 2`` has no tf_keras to load
    (TensorFlow would fail at the script's first ``tf.keras``, after the strategy started)."""
    if settings.keras == 2 and find("tf_keras") is None:
        raise UserError(
            f"train.keras: 2 needs tf_keras, which {sys.executable} cannot import: install "
            "hpctf[keras2] there (hpctf[gpu,keras2] on GPU nodes)"
        )


def script_environment(config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> dict[str, str]:
    """The variables the script finds (the table in this module's docstring)."""
    return {
        "HPCTF_RUN_DIR": str(run.path),
        "HPCTF_CHECKPOINT_DIR": str(run.path / SCRIPT_CHECKPOINTS),
        "HPCTF_SOURCE_DIR": str(Path(config.experiment_file).parent),
        "HPCTF_RANK": str(spec.task_index),
        "HPCTF_NUM_WORKERS": str(len(spec.workers)),
        "HPCTF_IS_CHIEF": "1" if spec.is_chief else "0",
    }


def working_directory(run: RunDir, spec: ClusterSpec) -> Path:
    """The run directory on the chief; on every other rank a scratch directory of its own inside
    the worker's temporary directory (:mod:`hpctf.compute.process.worker_tmp`, removed on exit),
    so a relative path the script writes on every rank (``model.save("final.keras")``) lands
    once in the run, never twice at the same place."""
    if spec.is_chief:
        return run.path
    scratch = Path(tempfile.gettempdir()) / f"rank-{spec.task_index}-cwd"
    scratch.mkdir(mode=0o700, exist_ok=True)
    return scratch


def exit_status(code: object) -> int:
    """The worker's exit status for a script that ended with ``sys.exit(code)`` (None: it ran
    to its end). As Python: None is 0, an int itself, anything else 1 (Python prints it).
    A status with a meaning of hpctf's own, other than 0 and 75, becomes 1 (failed)."""
    if code is None:
        return 0
    if not isinstance(code, int) or isinstance(code, bool):
        return 1
    status = code & 0xFF  # what the process would exit with
    if status in RESERVED_EXITS or status == STALLED_EXIT:
        return 1
    return status


def call_script(path: str, args: Sequence[str]) -> object:
    """Run the user's script as ``__main__`` with ``args`` as ``sys.argv[1:]``; return its
    ``sys.exit`` code (None when it ran to its end). The one call into the script: its own
    exceptions pass through."""
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        return stop.code
    return None


def run_script(config: ResolvedConfig, run: RunDir, spec: ClusterSpec) -> int:
    """Run ``train.script`` on this task; the exit status (0 done, 75 preempted, else failed)."""
    settings = config.experiment.train
    if settings.script is None:
        raise ValueError("run_script needs train.script")  # runtime calls it only then
    check_keras(settings)
    # Keras 3 is left unimported for a tf_keras script (train.keras: 2).
    log.info("%s", probe.line(probe.probe(keras_3=settings.keras != 2)))
    environment = script_environment(config, run, spec)
    os.makedirs(environment["HPCTF_CHECKPOINT_DIR"], exist_ok=True)
    os.environ.update(environment)
    os.chdir(working_directory(run, spec))
    sys.path.insert(0, str(Path(settings.script).parent))  # as `python script.py` does
    log.info(prepare_fit(settings.keras == 2, len(spec.workers), settings.script).line())
    log.info("running %s in %s", " ".join([settings.script, *settings.script_args]), os.getcwd())
    sys.stdout.flush()
    try:
        with user_code.region():
            status = exit_status(call_script(settings.script, settings.script_args))
    except user_code.UserCodeError as exc:
        # fit's collective that failed because a peer left raises from the script's frame: the
        # peer's fault, not the script's (exit 3, the rank and host named).
        _raise_if_peer_lost(exc.__cause__, spec)
        return user_code.report(exc, run, spec)
    except Exception as exc:
        _raise_if_peer_lost(exc, spec)  # raised in hpctf's callback: a peer's loss all the same
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    if status == 0:
        # A search's pruned trial (the chief's record, hpctf.keras.callbacks()) is not done.
        pruned = spec.is_chief and read_history(run).since_last_start_pruned
        if spec.is_chief and not run.done.exists() and not pruned:
            # The step of hpctf.keras.callbacks()'s last checkpoint; None for a plain script.
            step = run.checkpoint_step() or None
            write_atomic(run.done, json.dumps({"step": step, "script": settings.script}) + "\n")
        said = " (the search pruned this trial)" if pruned else f": {run.done}"
        log.info("script finished%s", said if spec.is_chief else "")
    elif status == PREEMPTED_EXIT:
        history = _record_preempted(run, spec)
        log.warning("script exited %d: %s", status, leaving_words(run, None, history=history))
    else:
        log.error("script exited %d", status)
    return status


def _raise_if_peer_lost(error: BaseException | None, spec: ClusterSpec) -> None:
    """:class:`~hpctf.compute.cluster.peers.PeerLost` when ``error`` (or what it was raised
    from) is TensorFlow's word that a peer stopped answering; else nothing."""
    if error is None or "tensorflow" not in sys.modules:  # no collective ran without it
        return
    from hpctf.compute.loop.control import peer_lost

    lost = peer_lost(error, spec)
    if lost is not None:
        raise lost from error


def _record_preempted(run: RunDir, spec: ClusterSpec) -> RunHistory | None:
    """On the chief, the ``saved_on_warning`` record the batch script requeues on, unless the
    script (through ``hpctf.keras.callbacks()``) made it already. Returns the run's history
    as the chief read it, with that record (None on the other ranks: they read none)."""
    if not spec.is_chief:
        return None
    history = read_history(run)
    if history.saved_on_warning is not None:
        return history
    received = early_signal()
    name = signal.Signals(received).name.removeprefix("SIG") if received else "TERM"
    return history.plus(journal.record_saved_on_warning(run, spec.journal_job, None, name))
