"""hpctf's training loop and what it is made of: the :class:`~.session.Session` a loop is given, the
built-in loop (:mod:`.training`; its evaluations in :mod:`.evaluation`, the learning rate scaled by
the replicas in :mod:`.learning_rate`), when to log, save and agree (:mod:`.cadence`, pure), the
input pipeline (:mod:`.data`), the preemption signals and the agreed step (:mod:`.preemption`,
:mod:`.step_flags`) and the stall watchdog (:mod:`.watchdog`)."""
