"""The script door: a user's own ``train.script`` run as a module on every task
(:mod:`.entry`), with ``hpctf.keras.callbacks()`` for its ``model.fit`` (:mod:`.fit`). Above the
loop's machinery (cadence, preemption, watchdog), which it shares with hpctf's Task loop."""
