"""Submitting, from a file to a job: ``hpctf validate``, ``render``, ``submit``, ``resubmit``,
``init``, ``sites`` and ``schema`` (:mod:`.commands`). An experiment, its site and ``--set``
become one resolved config (:mod:`.loader`, :mod:`.resolve`), the batch script is rendered by
the one Jinja environment (:mod:`.render`, :mod:`.containers`), and a run directory gets its
job (:mod:`.launch`), or its local processes for ``--site local`` (:mod:`.local`)."""
