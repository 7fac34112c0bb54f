"""What a run keeps: checkpoints saved by every rank and landed by the chief (:mod:`.checkpoints`,
saves written while training goes on through :mod:`hpctf.compute.compat`), and the chief's records:
metrics.jsonl and TensorBoard (:mod:`.chief_records`), an experiment tracker (:mod:`.tracking`)."""
