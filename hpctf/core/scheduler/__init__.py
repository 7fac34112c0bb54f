"""The scheduler: the only place Slurm commands run (:mod:`.slurm`), queries for many jobs at
once (:mod:`.slurm_queries`), what differs between Slurm and local sites (:mod:`.launcher`), and
node lists in Slurm's order with the site's ``hostname_template`` (:mod:`.hostnames`)."""
