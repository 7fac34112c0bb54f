# ---
# hpctf from a notebook: each `# %%` block is one cell (Jupyter, VS Code and jupytext read them
# as cells; `python notebook.py` runs them all). Submit the digits example, wait for it, read its
# metrics as rows, then a 4-point sweep of the learning rate and its best point.
#
#   HPCTF_SITE=local-slurm python examples/notebook/notebook.py   # the test cluster
#   HPCTF_SITE=local python examples/notebook/notebook.py         # no Slurm: runs in turn
#
# NOTEBOOK_STEPS shortens the runs (the tests use a few dozen steps).
# ---

# %%
import os
from pathlib import Path

import hpctf

here = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DIGITS = here.parent / "digits" / "experiment.yaml"
SITE = os.environ.get("HPCTF_SITE", "local-slurm")
STEPS = int(os.environ.get("NOTEBOOK_STEPS", "300"))
small = {"train.steps": STEPS, "train.log_every_steps": 10, "checkpoint.every_steps": STEPS}

# %% One run: submit returns once Slurm has the job; wait() follows it through requeues.
run = hpctf.submit(DIGITS, site=SITE, set={**small, "resources.nodes": 1})
print(run)
state = run.wait(poll=2, check=True)  # raises hpctf.RunFailed unless the run is done
print("state:", state)

# %% Its metrics as rows: a pandas DataFrame when pandas is installed, else a list of dicts.
rows = run.metrics()
losses = [(r["step"], r["loss"]) for r in run.metrics(frame=False) if "loss" in r]
print("rows:", len(rows), "first loss:", losses[0], "last loss:", losses[-1])
print("status:", run.status()["state"], "step", run.status()["step"])

# %% A sweep: 4 points (at most 4 running at once); each point is a run of its own.
sweep = hpctf.sweep(
    DIGITS,
    grid={"train.args.learning_rate": [0.001, 0.003, 0.01, 0.03]},
    site=SITE,
    set={**small, "resources.nodes": 1},
    max_running=4,
)
print(sweep, "states:", sweep.wait(poll=2))

# %% The best point by its last evaluation's accuracy (`hpctf status SWEEP --sort eval.accuracy`).
for point in sweep.status():
    print("point", point["index"], point["values"], point["state"], point["eval"])
best = sweep.best("eval.accuracy")
assert best is not None, "no point evaluated"
print(f"best point: {best.index} {best.values} -> {best.run.path}")
