"""``hpctf resubmit RUN --set train.steps=N``: a run continued with keys changed that neither
the model nor the batch script depend on (how long it trains, how often it evaluates, logs and
saves, how many checkpoints it keeps); of a ``train.script`` run, its ``train.script_args``
(the script says how long it trains: a fit script's epochs).

The run's frozen config.json is rewritten with the new values, a done run's DONE file is
taken away (its content kept in the journal), and the change is recorded in the journal as an
``extended`` record (:mod:`hpctf.core.run.history` then counts the run done only once a start
after it is), so ``hpctf status`` shows it. The next start resumes from the latest checkpoint
as any resubmit does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run import journal, secret_store
from hpctf.core.run.rundir import RunDir
from hpctf.core.settings.config import Experiment, ResolvedConfig
from hpctf.core.settings.validation import apply_overrides, validate_model
from hpctf.login.submitting.render import render

# Keys a resubmit may change: the training loop reads them at each start, and neither the
# model (train.args, entry, seed, batch size) nor the batch script (resources, env, setup)
# depends on them.
EXTENDABLE_KEYS = (
    "train.steps",
    "train.epochs",
    "train.log_every_steps",
    "train.eval_every_steps",
    "checkpoint.every_steps",
    "checkpoint.every_seconds",
    "checkpoint.keep",
)


# A train.script run trains as long as its script says (fit's epochs): its arguments are how
# it is given a new length (hpctf.keras.callbacks() resumes it from its newest checkpoint).
SCRIPT_EXTENDABLE_KEYS = (
    "train.script_args",
    "train.log_every_steps",
    "checkpoint.every_steps",
    "checkpoint.every_seconds",
    "checkpoint.keep",
)


def refused_keys(overrides: Sequence[str], script: bool = False) -> list[str]:
    """The keys of ``overrides`` (``KEY.PATH=VALUE``) that a resubmit may not change (of a
    ``train.script`` run with ``script``)."""
    allowed = SCRIPT_EXTENDABLE_KEYS if script else EXTENDABLE_KEYS
    keys = [item.partition("=")[0].strip() for item in overrides]
    return [key for key in keys if key not in allowed]


def extended_config(
    run: RunDir, config: ResolvedConfig, overrides: Sequence[str]
) -> ResolvedConfig:
    """``config`` (the run's frozen one) with ``overrides`` applied, or a UserError in one line:
    a key that changes the model or the script, a value the schema refuses, or fewer steps
    than the run's last checkpoint."""
    script = config.experiment.train.script
    refused = refused_keys(overrides, script is not None)
    if refused and script is not None:
        raise UserError(
            f"--set {', '.join(refused)}: {run.path} runs the script {script}, which trains "
            "as long as it says itself (fit's epochs): give it its new length through its "
            f"arguments, hpctf resubmit {run.path} --set 'train.script_args=[...]' "
            "(hpctf.keras.callbacks() resumes it from its newest checkpoint); a resubmit of a "
            f"script may change only {', '.join(SCRIPT_EXTENDABLE_KEYS)}"
        )
    if refused:
        raise UserError(
            f"--set {', '.join(refused)}: a resubmit may change only "
            f"{', '.join(EXTENDABLE_KEYS)} (the others change the model or the batch script; "
            "submit a new run for them)"
        )
    data = apply_overrides(config.experiment.model_dump(), overrides, Experiment)
    experiment = validate_model(Experiment, data, {}, str(run.config_file))
    extended = config.model_copy(update={"experiment": experiment})
    steps = experiment.train.steps
    reached = run.checkpoint_step()
    if steps is not None and steps < reached:
        raise UserError(
            f"--set train.steps={steps}: {run.path} already has a checkpoint at step {reached}; "
            f"give more steps than {reached}"
        )
    if render(extended, run.path) != render(config, run.path):
        raise UserError(  # the allowed keys never reach the script; say so if one ever does
            f"--set {', '.join(overrides)}: would change {run.script}; submit a new run instead"
        )
    return extended


def changes(before: ResolvedConfig, after: ResolvedConfig) -> dict[str, list[Any]]:
    """``{key: [old, new]}`` for each extendable key whose value differs."""
    out: dict[str, list[Any]] = {}
    for key in dict.fromkeys(EXTENDABLE_KEYS + SCRIPT_EXTENDABLE_KEYS):
        section, name = key.split(".")
        old = getattr(getattr(before.experiment, section), name)
        new = getattr(getattr(after.experiment, section), name)
        if old != new:
            out[key] = [old, new]
    return out


def extend_run(run: RunDir, config: ResolvedConfig, overrides: Sequence[str]) -> ResolvedConfig:
    """Write the extended config into ``run``, take a done run's DONE away and record the
    change (``extended``: the keys changed, old and new, and the DONE it replaced). Returns
    the new config, which the next start runs."""
    extended = extended_config(run, config, overrides)
    done: Any = None
    if run.done.exists():
        try:
            done = json.loads(run.done.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            done = None
    try:
        secret_store.write_frozen(run.path, extended)  # redacted; secrets.env holds them
        journal.record_extended(run, changes(config, extended), done)
        run.done.unlink(missing_ok=True)  # the worker would otherwise stop at once: complete
    except OSError as exc:
        raise EnvironmentProblem(f"cannot extend {run.path}: {exc.strerror or exc}") from exc
    return extended
