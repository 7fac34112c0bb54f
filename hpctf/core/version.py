"""hpctf's version, in one place: the package's metadata (pyproject.toml's ``dynamic``
version, read by hatchling from this file), the batch script's check of the worker's version,
the journal's records and ``hpctf --version`` all take it from here. Importing this imports
nothing else (the root package re-exports it as ``hpctf.__version__``)."""

VERSION = "0.1.0"
