"""The small core both wings share: configuration (schemas, sources, precedence), the run
directory, the one wrapper around Slurm commands, and the error types."""
