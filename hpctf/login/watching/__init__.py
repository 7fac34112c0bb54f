"""Watching runs after submit: ``hpctf status``, ``runs``, ``logs``, ``cancel`` and ``plot``.
Run directories are found and read by :mod:`.runs`, Slurm is asked about many jobs at once by
:mod:`.slurm_view`, and a run becomes a document, a table row or lines in :mod:`.run_report`
(pure), with its step, rate and ETA from :mod:`.progress`."""
