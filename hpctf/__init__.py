"""hpctf: from one experiment.yaml to multi-node TensorFlow training on Slurm.

Importing this package never imports TensorFlow: the login-node commands must stay fast. The
Python API (``hpctf.submit``, ``hpctf.run``, ``hpctf.runs``, ``hpctf.sweep``, ``Run``,
``Sweep``; :mod:`hpctf.python_api`) is imported on first use, so ``import hpctf`` in user
code on the compute nodes stays as light as before; so is ``hpctf.Session``, what a custom
loop's ``main(session, **args)`` is given. ``Task``, ``Files`` and ``Session`` are the public
names for the user's code; the modules under ``hpctf.compute`` are hpctf's own.
"""

from typing import TYPE_CHECKING, Any

from hpctf.api import Files, Task
from hpctf.core.version import VERSION

if TYPE_CHECKING:
    from hpctf.compute.loop.session import Session as Session
    from hpctf.python_api import Point as Point
    from hpctf.python_api import Run as Run
    from hpctf.python_api import RunFailed as RunFailed
    from hpctf.python_api import Sweep as Sweep
    from hpctf.python_api import run as run
    from hpctf.python_api import runs as runs
    from hpctf.python_api import submit as submit
    from hpctf.python_api import sweep as sweep

_PYTHON_API = ("Point", "Run", "RunFailed", "Sweep", "run", "runs", "submit", "sweep")

__all__ = ["Files", "Session", "Task", *_PYTHON_API]
__version__ = VERSION  # hpctf.core.version: the one place


def __getattr__(name: str) -> Any:
    if name == "Session":  # a custom loop's (train.loop: custom); imports TensorFlow
        from hpctf.compute.loop.session import Session

        return Session
    if name in _PYTHON_API:
        from hpctf import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'hpctf' has no attribute {name!r}")
