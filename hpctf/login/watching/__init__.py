"""Watching runs after submit: ``hpctf status``, ``runs``, ``logs``, ``cancel`` and ``plot``.
Run directories are found and read, Slurm asked about many jobs at once and a run made a
document, a table row or lines by :mod:`hpctf.login.reading`, the room below this one and
:mod:`hpctf.login.sweeps`."""
