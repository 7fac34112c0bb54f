"""The run directory and what is known of a run from it alone: the directory (:mod:`.rundir`), many
directories' files made at once (:mod:`.bulk_create`), its journal's schema and writers
(:mod:`.journal`; an entry as stored in :mod:`.journal_entries`), the one reader and interpreter of
the journal (:mod:`.history`: typed events, the run's state and jobs), who owns the run
(:mod:`.ownership`), whether it is the directory it was made as (:mod:`.run_identity`), its
read-only code copy (:mod:`.snapshot`; which files it copies in :mod:`.snapshot_files`) and its
checkpoints as files on disk (:mod:`.checkpoint_files`)."""
