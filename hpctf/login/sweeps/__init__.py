"""Sweeps: ``hpctf sweep`` and the status, cancel and resubmit of a sweep directory
(:mod:`.commands`). The points, their run names and the job arrays are planned without a file
or Slurm (:mod:`.plan`, pure); ``sweep.json`` and its status view live in :mod:`.sweep_dir`."""
