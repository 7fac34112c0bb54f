"""A task's start, around TensorFlow: ``hpctf worker`` before TensorFlow is imported
(:mod:`.runtime`), the quick node checks (:mod:`.quick_preflight`) and ``hpctf doctor``'s run on
every task (:mod:`.preflight`). The cluster spec, the GPUs and joining the others are
:mod:`hpctf.compute.cluster`'s; leaving promptly and the watches are
:mod:`hpctf.compute.process`'s."""
