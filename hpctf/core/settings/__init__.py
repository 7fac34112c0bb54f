"""Experiments and sites: the schemas and the frozen resolved config (:mod:`.config`; ``train:``'s
schema in :mod:`.train`), the value grammar (:mod:`.values`), YAML read with every key's line and
origin (:mod:`.sources`), schema errors as one line each and ``--set`` typed (:mod:`.validation`),
finding site files (:mod:`.sites`), the site's container (:mod:`.container`), the one table of
sbatch options (:mod:`.sbatch_options`) and the replica count the batch must divide by
(:mod:`.replicas`)."""
