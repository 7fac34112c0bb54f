"""The compute-node wing: what ``hpctf worker`` runs on every task of a job. Only
:mod:`hpctf.compute.training` and the modules it loads import TensorFlow."""
