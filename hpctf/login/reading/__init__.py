"""Reading runs on the login node, below every command that shows or acts on them (watching,
sweeps, the Python API): a run directory read once (:mod:`.runs`), what Slurm says of its jobs
(:mod:`.slurm_view`), its progress (:mod:`.progress`) and what ``hpctf status`` says of it
(:mod:`.run_report`)."""
