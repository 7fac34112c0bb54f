"""hpctf from Python (a notebook, a script): submit, wait, read metrics, sweep. Re-exported
lazily by :mod:`hpctf` (``hpctf.submit``, ``hpctf.Run``...); no TensorFlow is imported."""

from hpctf.python_api.run_api import Run, RunFailed, run, runs
from hpctf.python_api.submit_api import submit, sweep
from hpctf.python_api.sweep_api import Point, Sweep

__all__ = ["Point", "Run", "RunFailed", "Sweep", "run", "runs", "submit", "sweep"]
