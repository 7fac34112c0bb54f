"""A task's start and end, around TensorFlow: ``hpctf worker`` before TensorFlow is imported
(:mod:`.runtime`), the cluster spec from Slurm's environment (:mod:`.cluster`, pure), the GPUs it
may use (:mod:`.gpu_bind`) and whether TensorFlow got them (:mod:`.gpus`), the quick node checks
(:mod:`.quick_preflight`), joining the others in the strategy (:mod:`.joining`), a peer that
stopped answering (:mod:`.peers`), the local launcher watched (:mod:`.launcher_watch`) and
leaving promptly (:mod:`.leaving`)."""
