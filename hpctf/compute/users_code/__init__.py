"""The doors for the user's own code: an exception from it named as theirs
(:mod:`.attribution`), what ``model.compile`` takes resolved for a Task (:mod:`.compile_style`)
and Keras callbacks in the loop (:mod:`.task_callbacks`). A ``train.script`` run as it is and
Keras's ``fit`` given hpctf's checkpoints and preemption saves are :mod:`hpctf.compute.script`'s."""
