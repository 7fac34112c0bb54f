"""The login-node wing: sites, resolving an experiment, rendering the batch script, submitting
and following runs. Nothing here imports TensorFlow."""
