"""The worker process itself: how it leaves (exit codes, held exits), its own temporary
directory, the watch on its launcher, and its startup clock. Below everything else on the
compute node."""
