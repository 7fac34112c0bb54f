"""The cluster a task is part of: Slurm's environment as a cluster spec and TF_CONFIG (pure),
each task's GPUs (pure), joining the cluster (the strategy) and telling a lost peer. Below the
node checks, the loop and the script door, which all read it."""
