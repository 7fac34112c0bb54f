"""One `hpctf sweep` in this process, each phase timed: planning (every point resolved and
checked), rendering (each point's own script), run-dir creation (the shared code snapshot and
every point's directory), sbatch, and the journal's `submitted` records. Prints one JSON object.

    python benchmarks/sweep_phases.py SWEEP_ARGS...   (as for `hpctf sweep`)

The phases are the functions `hpctf sweep` calls, each wrapped with a clock here: nothing in
hpctf knows it is measured.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from hpctf.core.scheduler import slurm
from hpctf.login.submitting import pipeline
from hpctf.login.sweeps import start

# Each phase: the function `hpctf sweep` calls for it, as its caller's module names it.
from hpctf.login.sweeps import sweep_commands as commands

PHASES = {
    "planning": (start, "plan"),
    "rendering": (start, "point_scripts"),  # each point's own script
    "creation": (pipeline, "create_run_dirs_sharing_code"),
    "sbatch": (slurm, "sbatch"),
    "records": (commands, "_record_submitted"),
}


def timed(seconds: dict[str, float], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - began

    return wrapper


def main(argv: list[str]) -> int:
    from hpctf.cli import cli

    seconds: dict[str, float] = {}
    for name, (module, attribute) in PHASES.items():
        setattr(module, attribute, timed(seconds, name, getattr(module, attribute)))
    began = time.perf_counter()
    try:
        cli.main(["sweep", *argv], standalone_mode=False)
    finally:
        total = time.perf_counter() - began
        print(json.dumps({"seconds": {**seconds, "total": total}}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
