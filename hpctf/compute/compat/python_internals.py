"""The private names of CPython that the compute side uses.

=================== =========================== ============================= =================
capability          private name                checked against               without it
=================== =========================== ============================= =================
bounded exit        ``atexit._run_exitfuncs``   CPython 3.10.13, 3.11.7,      the worker leaves
                                                3.12.1, 3.13.0                without the
                                                                              ``atexit``
                                                                              functions
=================== =========================== ============================= =================

Without it, :func:`hpctf.compute.process.leaving.leave` still leaves within its bound through
``os._exit``: its own temporary directory (where TensorFlow's autograph files are) is removed
first as always, and every checkpoint was waited for before (``Session.close``), so what the
skipped ``atexit`` functions would have done is only TensorFlow's own tidying.
"""

from __future__ import annotations

import atexit


def exit_functions_missing() -> str | None:
    """None when :func:`run_exit_functions` runs the ``atexit`` functions; else why not."""
    if not callable(getattr(atexit, "_run_exitfuncs", None)):
        return "no atexit._run_exitfuncs"
    return None


def run_exit_functions() -> bool:
    """Run the ``atexit`` functions now, as the interpreter's own exit runs them first; False
    when this Python cannot (nothing run)."""
    run = getattr(atexit, "_run_exitfuncs", None)
    if not callable(run):
        return False
    run()
    return True
