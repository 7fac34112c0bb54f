"""The batch-shell wing: ``hpctf job-start``, ``job-signal`` and ``job-end``, which the rendered
batch script runs on the job's first node around ``srun``. A third actor beside the login node
and the workers, with its own rules: it never imports TensorFlow, it runs under Slurm's signals,
and it must record a start's end before Slurm kills it. It imports only :mod:`hpctf.core`."""
