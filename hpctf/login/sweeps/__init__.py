"""Sweeps: ``hpctf sweep`` (:mod:`.start`) and the status, cancel and resubmit of a sweep
directory (:mod:`.sweep_commands`, :mod:`.resubmit_command`). The points, their run names and
the job arrays are planned without a file or Slurm (:mod:`.plan`, pure), each point resolved and
checked (:mod:`.points`); ``sweep.json`` is :mod:`.sweep_record`, a sweep directory and its
status view :mod:`.sweep_dir`, a sweep as :class:`hpctf.Sweep` reads it :mod:`.sweep_view`. A
search: its array of agents (:mod:`.search_start`) and its status (:mod:`.search_watch`)."""
