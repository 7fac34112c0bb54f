"""Weights & Biases as a tracker (``tracking: wandb:``; the extra ``hpctf[wandb]``).

One W&B run per hpctf run: its id is chosen at the first start, kept by
:class:`~hpctf.compute.records.tracking.tracker.Tracker` and passed back to ``wandb.init``
(``resume="allow"``) at every later one. Steps are hpctf's own (``log(step=...)``): W&B
drops a step below the last one it has, which the tracker never sends (it skips the steps an
earlier start logged). In offline mode each start writes a directory of its own under
``RUN_DIR/tracking/wandb``, all with the same run id: ``wandb sync`` sends them into one run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctf.core.settings.tracking import WandbTracking

# wandb.init gives up on a server that does not answer after 90 s by default; hpctf retries it.
_INIT_TIMEOUT_S = 30.0
# A stopped start (a preemption, to be resumed): W&B shows a run marked preempting that ends
# with a non-zero exit code as preempted (docs.wandb.ai/models/sweeps/signal-handling-sweep-runs).
_STOPPED_EXIT_CODE = 1


class WandbBackend:
    """W&B through a run object of its own (``wandb.init(...)``; the user's code may have its
    own ``wandb.run``: hpctf does not use the global one)."""

    name = "wandb"

    def __init__(self, settings: WandbTracking, default_project: str, directory: Path) -> None:
        """``directory``: where W&B writes (``directory/wandb/``): inside the run directory."""
        self._settings = settings
        self._project = settings.project or os.environ.get("WANDB_PROJECT") or default_project
        self._directory = directory
        self._run: Any = None

    def start(self, run_id: str | None, run_name: str, tags: Mapping[str, str]) -> str:
        import wandb  # seconds to import, and a service process: here, off the training

        if self._run is not None:  # a retried start whose init had succeeded
            return str(self._run.id)
        self._directory.mkdir(parents=True, exist_ok=True)
        offline = (self._settings.mode or os.environ.get("WANDB_MODE")) in ("offline", "dryrun")
        settings = wandb.Settings(
            init_timeout=_INIT_TIMEOUT_S,
            console="off",  # the rank log is hpctf's; W&B would wrap stdout and stderr
            silent=True,
            save_code=False,  # the code snapshot is in the run directory
            disable_git=True,  # its commit is a tag (hpctf.git_commit)
            x_disable_stats=True,  # no sampler thread beside the training
            x_save_requirements=False,
        )
        self._run = wandb.init(
            project=self._project,
            entity=self._settings.entity,
            mode=self._settings.mode,  # None: $WANDB_MODE, else online
            dir=str(self._directory),
            id=run_id or uuid.uuid4().hex[:16],  # W&B's ids: [a-z0-9], up to 64
            # Offline, W&B has nothing to resume from (it says so on stderr): the same id is
            # enough for `wandb sync`.
            resume=None if offline else "allow",
            name=run_name,
            settings=settings,
            reinit="create_new",  # never the user's own wandb.run, if they have one
        )
        # The run directory, the code's commit and the Slurm jobs so far: again at each start
        # (the jobs grow), as config so they can be filtered on.
        self._run.config.update(dict(tags), allow_val_change=True)
        return str(self._run.id)

    def log_params(self, params: Mapping[str, str]) -> None:
        self._run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def finish(self, done: bool) -> None:
        self._run.summary["hpctf.end"] = "done" if done else "stopped"
        if not done:
            self._run.mark_preempting()
        self._run.finish(exit_code=0 if done else _STOPPED_EXIT_CODE)
