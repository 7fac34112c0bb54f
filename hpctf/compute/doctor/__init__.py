"""``hpctf doctor``'s checks on every task: the node checks (:mod:`.node_checks`, also run by
the quick preflight; InfiniBand's in :mod:`.infiniband`, NCCL's environment in :mod:`.nccl_env`,
libibverbs in :mod:`.verbs`), the versions a node offers (:mod:`.versions`) and what a process
reads of itself from /proc (:mod:`.procstat`). The timed all-reduce and the task's report are
:mod:`hpctf.compute.start.preflight`'s."""
