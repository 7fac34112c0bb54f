"""Every private name of another package that the compute side uses, one module per family,
each behind a function that says whether the name is there and a documented fallback when it
is not:

- :mod:`.tensorflow_internals`: TensorFlow and Keras 3 (failure detection, fixed collective
  keys, asynchronous checkpoints, learning-rate scaling);
- :mod:`.keras_fit`: Keras 3's and tf_keras's ``fit`` under MultiWorkerMirroredStrategy, with
  :mod:`.keras_own_steps` (a model's own ``train_step`` as on one machine) and
  :mod:`.fit_input` (what ``fit`` was called with, for a resume);
- :mod:`.keras_variables`: the random layers' seed states, every weight and
  BatchNormalization's statistics, which a checkpoint or the ranks need;
- :mod:`.python_internals`: CPython (the bounded exit);
- :mod:`.probe`: the one line every rank logs at start, saying which of them this
  TensorFlow and Keras offer.

A name that moved must never make training wrong, nor fail a start as a bug in hpctf (exit
70): each capability falls back to the public behaviour, or, where none is correct, the start
stops in one line naming the version and what to install (an ``EnvironmentProblem``, which the
batch script does not requeue). ``tests/test_compat_canaries.py`` fails, naming the capability
and the versions, when a name is gone, so an upgrade announces itself in ``make test``.
"""
