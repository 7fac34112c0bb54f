"""``model.fit(..., callbacks=hpctf.keras.callbacks())``: a ``train.script`` fit script, on Keras 3
or tf_keras, gets what hpctf's own loop has (:mod:`hpctf.compute.script.fit`): resume at the
exact step, a checkpoint every ``checkpoint.every_seconds`` (or ``every_steps``), a warned
preemption saved at one agreed step then exit 75, progress lines, metrics.jsonl with each
epoch's ``val_*``, and the stall watchdog fed by every batch.

Importable anywhere: TensorFlow is imported only when :func:`callbacks` is called under hpctf.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpctf.core.run.rundir import RunDir


def callbacks() -> list[Any]:
    """The callbacks for ``model.fit`` on this task of the run; ``[]`` outside hpctf (no
    ``HPCTF_RUN_DIR``), so the same script still runs on its own with ``python train.py``."""
    run_dir = os.environ.get("HPCTF_RUN_DIR")
    if not run_dir:
        return []
    from hpctf.compute.cluster.spec import cluster_spec
    from hpctf.compute.script.fit import FitCallback  # TensorFlow is imported here

    run = RunDir(Path(run_dir))
    config = run.load_config()
    spec = cluster_spec(os.environ, config.site.port_range, config.site.hostname_template)
    return [FitCallback(config, run, spec)]
