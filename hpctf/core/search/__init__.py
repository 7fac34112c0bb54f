"""A sweep that searches: its Optuna study on the shared filesystem and each trial's link to it."""
