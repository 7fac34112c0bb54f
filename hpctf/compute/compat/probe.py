"""The capability probe: which of the private names hpctf uses this TensorFlow, Keras and
Python offer, in one line that every rank logs at start, for example::

    tensorflow 2.18.1, keras 3.12.0, python 3.11.7: failure detection on, fixed collective
    keys on, async saves on, learning-rate scaling on, bounded exit on

A capability that is off says why in parentheses and its fallback takes over (the table in
:mod:`hpctf.compute.compat.tensorflow_internals`). The probe builds nothing: it runs before the
strategy, when a TF variable would initialize TensorFlow's context too early.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import re
from collections.abc import Callable

from hpctf.compute.compat import python_internals, tensorflow_internals


@dataclasses.dataclass(frozen=True)
class Capability:
    """One capability: its name and, when it is off, why (None: on)."""

    name: str
    missing: str | None

    @property
    def on(self) -> bool:
        return self.missing is None

    def describe(self) -> str:
        return f"{self.name} on" if self.on else f"{self.name} off ({self.missing})"


# name -> the check; each returns None when the capability is there, else what is missing.
CHECKS: dict[str, Callable[[], str | None]] = {
    "failure detection": tensorflow_internals.failure_detection_missing,
    "fixed collective keys": tensorflow_internals.fixed_keys_missing,
    "async saves": tensorflow_internals.async_saves_missing,
    "learning-rate scaling": tensorflow_internals.learning_rate_missing,
    "bounded exit": python_internals.exit_functions_missing,
}

# The keras-3-only checks, left out of a tf_keras script's probe (it does not import keras 3).
KERAS_3_CHECKS = frozenset({"async saves", "learning-rate scaling"})


def _checked(check: Callable[[], str | None]) -> str | None:
    try:
        return check()
    except Exception as exc:  # a probe that breaks is a capability that is off, never a crash
        return f"{type(exc).__name__}: {exc}"


def probe(keras_3: bool = True) -> list[Capability]:
    """Every capability, checked now (imports TensorFlow, and Keras 3 when ``keras_3``)."""
    return [
        Capability(name, _checked(check))
        for name, check in CHECKS.items()
        if keras_3 or name not in KERAS_3_CHECKS
    ]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# The TensorFlow minors proven (docs/reference/versions.md), the ceiling pyproject.toml keeps.
PROVEN_TENSORFLOW = ((2, 16), (2, 21))


def outside_proven(version: str) -> str:
    """`` (outside the proven 2.16-2.21: untested)`` for a TensorFlow ``version`` beyond the
    range hpctf was tested on; "" inside it."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    (low, high) = PROVEN_TENSORFLOW
    if numbers is None:
        return ""
    minor = (int(numbers.group(1)), int(numbers.group(2)))
    if low <= minor <= high:
        return ""
    proven = f"{low[0]}.{low[1]}-{high[0]}.{high[1]}"
    return f" (outside the proven {proven}: untested)"


def versions() -> str:
    """``tensorflow X, keras Y[, tf_keras Z], python W``, from the installed distributions."""
    import tensorflow as tf

    tensorflow = f"tensorflow {tf.__version__}{outside_proven(tf.__version__)}"
    parts = [tensorflow, f"keras {_version('keras') or 'none'}"]
    if (tf_keras := _version("tf_keras")) is not None:
        parts.append(f"tf_keras {tf_keras}")
    parts.append(f"python {platform.python_version()}")
    return ", ".join(parts)


def line(capabilities: list[Capability]) -> str:
    """The one line a rank logs: the versions, then each capability on or off."""
    return f"{versions()}: {', '.join(c.describe() for c in capabilities)}"
