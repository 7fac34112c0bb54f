"""The doors for the user's own code: an exception from it named as theirs (:mod:`.user_code`),
what ``model.compile`` takes resolved for a Task (:mod:`.compile_style`), Keras callbacks in the
loop (:mod:`.task_callbacks`), a ``train.script`` run as it is (:mod:`.script`) and Keras 2's
``fit`` given hpctf's checkpoints and preemption saves (:mod:`.fit`)."""
