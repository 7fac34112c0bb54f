"""``hpctf doctor``'s side on every task: the node checks (:mod:`.node_checks`, also run by the
quick preflight), the timed all-reduce and the task's report (:mod:`.preflight`), and what a
process reads of itself from /proc (:mod:`.procstat`)."""
