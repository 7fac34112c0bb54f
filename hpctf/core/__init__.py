"""What the wings share: :mod:`.settings` (experiments and sites), :mod:`.run` (the run
directory, its journal and state), :mod:`.search` (a search's study and trials),
:mod:`.scheduler` (the one wrapper around Slurm commands and what a site's scheduler allows),
:mod:`.secrets`, :mod:`.safe_files`, the error types (:mod:`.errors`) and the version
(:mod:`.version`). docs/reference/layout.md names every module (a test keeps it so)."""
