"""hpctf: from one experiment.yaml to multi-node TensorFlow training on Slurm.

Importing this package never imports TensorFlow: the login-node commands must stay fast.
"""

from hpctf.api import Files, Task

__all__ = ["Files", "Task"]
__version__ = "0.1.0"
