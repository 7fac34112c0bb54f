"""Submitting, from a file to a job: ``hpctf validate``, ``render``, ``submit``, ``init``,
``sites`` and ``schema`` (:mod:`.submit_commands`), and resubmitting a run (:mod:`.resubmit`). An
experiment, its site and ``--set`` become one resolved config
(:mod:`hpctf.login.resolving`); then the one submission pipeline (:mod:`.pipeline`): a run
directory planned, its batch script rendered once (:mod:`.render`, :mod:`.containers`,
through :mod:`hpctf.login.templating`), created, and started by the site's job launcher
(:mod:`.launchers`: sbatch, or local processes, :mod:`.local`)."""
