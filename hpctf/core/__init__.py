"""The small core the wings share: :mod:`.settings` (experiments and sites), :mod:`.run` (the run
directory, its journal and state), :mod:`.scheduler` (the one wrapper around Slurm commands and
what a site's scheduler allows), the error types (:mod:`.errors`) and the version
(:mod:`.version`)."""
