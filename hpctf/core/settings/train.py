"""``train:``'s schema (:class:`Train`): what to train, for how long, and how the loop runs it
(the checks before joining, the collectives, the bounds on a dead or stuck rank).

Part of an experiment (:class:`hpctf.core.settings.config.Experiment`); read by the worker from
the frozen config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hpctf.core.settings.values import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_SECONDS,
    MAX_STEPS,
    Strict,
    check_entry,
    finite_args,
)


class Train(Strict):
    """What to train and for how long: an ``entry`` (hpctf's loop) or a ``script`` (the user's).

    With ``script`` the batch size, the steps and the checkpoints are the script's business;
    with ``entry`` ``global_batch_size`` and one of ``steps``/``epochs`` are required.
    """

    entry: str | None = Field(
        None, description="module:function returning hpctf.Task; or give script"
    )
    script: str | None = Field(
        None,
        description="a Python script every task runs as __main__ (its own strategy, model.fit "
        "...), relative to the experiment file; or give entry",
    )
    script_args: list[str] = Field(
        default_factory=list, description="the script's command-line arguments (sys.argv[1:])"
    )
    keras: Literal[2, 3] = Field(
        3,
        description="3: Keras 3; 2: tf_keras (TF_USE_LEGACY_KERAS=1, set before TensorFlow is "
        "imported), whose model.fit works under MultiWorkerMirroredStrategy; script only; "
        "install hpctf[keras2]",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="the entry's keyword arguments, checked against its signature at validate",
    )
    steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="train this many steps; or give epochs"
    )
    epochs: int | None = Field(
        None, ge=1, le=MAX_EPOCHS, description="passes over train_data; or give steps"
    )
    global_batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH, description="required with entry"
    )
    log_every_steps: int = Field(
        10, ge=1, le=MAX_STEPS, description="the chief's progress line and metrics.jsonl record"
    )
    seed: int = Field(  # TensorFlow's seeds are int64
        0, ge=-(2**63), le=2**63 - 1, description="the input's shuffle seed, the same on every rank"
    )
    python_path: list[str] = Field(
        default_factory=lambda: ["."],
        description="directories put on sys.path for the entry, relative to the experiment file",
    )
    eval_every_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="evaluate every N steps as well as at the end"
    )
    save_model: bool = Field(True, description="a Task run ends with RUN/model.keras")
    export_savedmodel: bool = Field(
        False, description="with save_model, also a TF SavedModel in RUN/saved_model"
    )
    scale_learning_rate: bool = Field(
        False, description="multiply the optimizer's learning rate by the number of replicas"
    )
    mixed_precision: bool = Field(
        False, description="mixed_float16 on GPUs, mixed_bfloat16 on CPUs"
    )
    jit_compile: bool = Field(False, description="compile the step's forward and backward with XLA")
    # On by default: the checks take milliseconds (sysfs reads, two name lookups, one bind;
    # TensorFlow is imported next anyway), and what they catch, a port of the fabric down or an
    # HCA missing, otherwise costs a whole allocation that hangs in NCCL's start or trains over
    # TCP sockets at a fraction of the speed.
    preflight: Literal["quick", "off"] = Field(
        "quick",
        description="quick: each rank checks its node (memlock, InfiniBand ports, addresses, "
        "port, TensorFlow and GPUs) before joining, and a failed check ends the job naming node "
        "and check; off: only the addresses, the port and the GPUs, as a plain error",
    )
    communication: Literal["auto", "nccl", "ring"] = Field(
        "auto", description="collective implementation; auto: NCCL when GPUs are visible, else RING"
    )
    # A restart inside the allocation is mostly TensorFlow's import (about 3 of 5.6 s here):
    # a process per task that made it already takes the new worker's place
    # (hpctf.compute.start.standby). It costs that process's memory on every node.
    warm_standby: bool = Field(
        True,
        description="a standby process per task (Slurm, no container) that has imported "
        "TensorFlow takes the place of a worker started again after a crash, skipping the import",
    )
    # Bounded failure: a dead, frozen or stuck rank ends the whole job within these bounds.
    heartbeat_timeout_seconds: int = Field(
        10,
        ge=1,
        le=MAX_SECONDS,
        description="a rank whose heartbeats stop (dead or frozen) fails the job after this",
    )
    stall_timeout_seconds: int | None = Field(
        1800,
        ge=1,
        le=MAX_SECONDS,
        description=(
            "a rank that finishes no step, save or evaluation batch for this long (a live but "
            "stuck peer, a hung collective) exits 124; null: wait for ever"
        ),
    )
    startup_timeout_seconds: int = Field(
        300, ge=1, le=MAX_SECONDS, description="every rank must join the cluster within this"
    )
    preemption_check_every_steps: int = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="how often the ranks agree whether any got a preemption signal",
    )
    # Not tied to checkpoint.every_steps: the restart step is saved for itself, as a warned
    # preemption's agreed step is, so any step will do.
    restart_every_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="end the job at every multiple of this step (all ranks save it) and "
        "requeue it, using no requeue budget: a fresh process for long runs; Slurm sites only",
    )
    loop: Literal["builtin", "custom"] = Field(
        "builtin",
        description="builtin: entry returns hpctf.Task; custom: entry(session, **args) trains",
    )

    _entry = field_validator("entry", mode="before")(check_entry)
    _args = field_validator("args")(finite_args)

    @field_validator("script")
    @classmethod
    def _python_file(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith(".py"):
            raise ValueError(f"{value!r} is not a .py file (hpctf copies .py files into the run)")
        return value

    @model_validator(mode="after")
    def _entry_or_script(self) -> Train:
        if (self.entry is None) == (self.script is None):
            raise ValueError("give exactly one of train.entry (module:function) or train.script")
        if self.script is not None:
            given = [
                k
                for k in ("steps", "epochs", "global_batch_size", "args", "restart_every_steps")
                if getattr(self, k)
            ]
            if given or self.loop != "builtin":
                keys = ", ".join(f"train.{k}" for k in given or ["loop"])
                raise ValueError(
                    f"{keys} is for train.entry; a train.script sets its own (use script_args)"
                )
            return self
        if self.keras != 3:
            raise ValueError("train.keras: 2 is for train.script; hpctf's loop runs Keras 3")
        if self.global_batch_size is None:
            raise ValueError("train.global_batch_size is required with train.entry")
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of train.steps or train.epochs")
        return self
