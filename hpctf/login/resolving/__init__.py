"""From files to one resolved config, for every login command that reads an experiment
(validate, render, submit, sweep, doctor): an experiment, its site, ``--set`` and the environment
become a :class:`~hpctf.core.settings.config.ResolvedConfig` with every value's origin
(:mod:`.loader`, :mod:`.resolve`), files read once per command (:mod:`.readings`), and what can
be checked before the queue without importing the user's code: ``train.args`` against the
entry's signature and types (:mod:`.arg_types`), a tracker's package (:mod:`.tracking_check`)."""
