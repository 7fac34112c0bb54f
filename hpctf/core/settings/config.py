"""Experiment and site files: the schemas, and the resolved config a run is frozen with.

Shared by both wings: the login node validates and resolves
(:mod:`hpctf.login.resolving.resolve`); the worker reads the frozen result back from the run
directory. Value grammar lives in :mod:`hpctf.core.settings.values`, the sbatch option table in
:mod:`hpctf.core.settings.sbatch_options`, ``train:``'s schema in :mod:`hpctf.core.settings.train`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hpctf.core.scheduler.hostnames import check_hostname_template
from hpctf.core.scheduler.launcher import allows_containers
from hpctf.core.settings.container import Container
from hpctf.core.settings.notify import Notify
from hpctf.core.settings.sbatch_options import normalize_sbatch_option
from hpctf.core.settings.search import Search
from hpctf.core.settings.tracking import Tracking
from hpctf.core.settings.train import Train
from hpctf.core.settings.values import (
    MAX_SECONDS,
    MAX_STEPS,
    Constraint,
    Dependency,
    EnvValue,
    Exclusive,
    MailTypes,
    MailUser,
    Mem,
    Module,
    Name,
    Partition,
    ShellLines,
    SlurmName,
    Strict,
    Time,
    check_env,
)

# --- extra_sbatch --------------------------------------------------------------------------

ExtraSbatch = Annotated[
    list[Annotated[str, AfterValidator(normalize_sbatch_option)]],
    Field(description="more #SBATCH options, one per item, e.g. --gres-flags=enforce-binding"),
]


# What a site's request defaults say of themselves (the experiment's own value wins key by key).
_DEFAULT = "the default of the experiment's `resources` key of the same name"


# --- models --------------------------------------------------------------------------------


class Resources(Strict):
    """What the job asks Slurm for, in Slurm's own names.

    A site file may give a default for every key here except ``nodes``, ``spare_nodes`` and
    ``dependency``; a key given in the experiment (even as ``null``) wins over the site's
    default.
    """

    nodes: int = Field(1, ge=1, le=100_000, description="--nodes: one or more workers on each")
    spare_nodes: int = Field(
        0,
        ge=0,
        le=100_000,
        description="more nodes asked for (--no-kill) that train only when a node is lost: "
        "the workers start again on the others in the same job, with no requeue",
    )
    tasks_per_node: int = Field(
        1, ge=1, le=1024, description="workers per node (one per GPU, or one driving them all)"
    )
    gpus_per_node: int | None = Field(None, ge=0, le=64, description="default: the site's")
    cpus_per_task: int = Field(
        1, ge=1, le=4096, description="cores per worker (its input pipeline); default: the site's"
    )
    mem: Mem | None = Field(None, description="--mem per node, e.g. 64G; 0 is all of it")
    time: Time = "01:00:00"
    partition: Partition | None = Field(None, description="default: the site's")
    account: SlurmName | None = Field(None, description="--account; null drops the site's")
    qos: SlurmName | None = Field(None, description="--qos")
    constraint: Constraint | None = Field(None, description="--constraint: node features")
    reservation: SlurmName | None = Field(None, description="--reservation")
    exclusive: Exclusive = Field(False, description="--exclusive: true, user or mcs")
    mail_type: MailTypes = Field(default_factory=list, description="--mail-type, e.g. [END, FAIL]")
    mail_user: MailUser | None = Field(None, description="--mail-user")
    dependency: Dependency | None = Field(
        None, description="--dependency, beside the singleton hpctf always asks for"
    )
    extra_sbatch: ExtraSbatch = Field(default_factory=list)


# Resource keys a site file may give defaults for (the rest are per experiment).
SITE_RESOURCE_KEYS = tuple(
    k for k in Resources.model_fields if k not in {"nodes", "spare_nodes", "dependency"}
)


class Checkpoint(Strict):
    # Seconds, not steps, by default: a crash loses the training since the last save, and
    # only a time bounds that whatever the step time (100 steps of a 1 s step are 100 s).
    every_seconds: int | None = Field(
        300,
        ge=1,
        le=MAX_SECONDS,
        description="save at least this often (at one step agreed by every rank): at most "
        "about this many seconds of training lost to a crash; null: by steps only",
    )
    every_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="also save every multiple of this step (whichever of the two comes first)",
    )
    keep: int = Field(3, ge=1, le=1_000_000, description="the newest this many are kept")
    asynchronous: bool = Field(
        True,
        description="write checkpoints while training goes on (the save stalls only to copy "
        "the variables to host memory, kept there: one more copy of the weights and optimizer "
        "state per worker); a preemption or the end waits for the write; the Keras fit loop "
        "saves synchronously; false: every save stalls until written",
    )


class Experiment(Strict):
    """One experiment.yaml."""

    name: Name = Field(description="names the job and the run directory")
    site: str | None = Field(None, description="default site (name or .yaml path); --site wins")
    resources: Resources = Field(default_factory=Resources)
    train: Train
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="when the workers save, and how many are kept"
    )
    tracking: Tracking = Field(default_factory=Tracking)
    notify: Notify | None = Field(
        None, description="email and/or webhook on done, failed, gave_up, budget_exhausted"
    )
    env: dict[str, EnvValue] = Field(
        default_factory=dict, description="exported after the site's env; values are literal"
    )
    setup: ShellLines = Field(
        default_factory=list,
        description="RAW SHELL run in the batch script after the site's setup lines",
    )
    sweep: Search | None = Field(
        None, description="a search for `hpctf sweep`: parameters as distributions, trials"
    )

    _env = field_validator("env")(check_env)


class Preemption(Strict):
    """How Slurm warns a job before preempting it or ending it at its time limit.

    Slurm jobs of such a site are submitted with ``--signal=<signal>@<warning_seconds>`` and
    ``--requeue``: on the warning every worker saves an agreed step and exits 75, and the batch
    script requeues the job (at most ``max_requeues`` times), which resumes from that step.
    """

    # Not USR1: NCCL uses SIGUSR1 itself. The worker handles exactly these two.
    signal: Literal["USR2", "TERM"] = Field(
        "USR2", description="the warning signal, --signal=SIG@warning_seconds"
    )
    warning_seconds: int = Field(
        300, ge=1, le=65535, description="how long before the time limit Slurm warns"
    )
    max_requeues: int = Field(
        20, ge=0, description="requeues of one run after a warned preemption or walltime"
    )
    max_failure_requeues: int = Field(
        3,
        ge=0,
        description="requeues of one run after a crash, a stall or a node failure (a crash or "
        "stall only when the run advanced since its start)",
    )


class Doctor(Strict):
    """What ``hpctf doctor`` holds the site's nodes to, beyond every check passing."""

    min_busbw_gbps: float | None = Field(
        None,
        gt=0,
        description="fail the all-reduce check below this bus bandwidth at the largest message "
        "size, in GB/s (gigabytes per second, the unit nccl-tests prints busbw in)",
    )


class Sweep(Strict):
    """How ``hpctf sweep`` submits on this site."""

    max_array_size: int | None = Field(
        None,
        ge=1,
        description="tasks per job array; default: the cluster's MaxArraySize (scontrol show "
        "config). Larger sweeps are split into several arrays",
    )


class Login(Strict):
    """``login:``: the cluster's login host, reached over SSH when hpctf runs anywhere else."""

    host: str = Field(
        min_length=1,
        description="an ~/.ssh/config alias or user@host, as given to ssh",
    )
    hpctf: str = Field(
        "hpctf",
        min_length=1,
        description="the hpctf command on the login host (a path or a name on its PATH)",
    )
    ssh_options: list[str] = Field(
        default_factory=list,
        description="extra arguments for ssh before the host, e.g. ['-F', '~/.ssh/hpc_config']",
    )

    @field_validator("host", "hpctf")
    @classmethod
    def _one_word(cls, value: str, info: ValidationInfo) -> str:
        spaces = any(c.isspace() for c in value) if info.field_name == "host" else False
        if value.startswith("-") or spaces or any(c in value for c in "\n\r\0"):
            raise ValueError(f"{value!r}: a {info.field_name}, not starting with -")
        return value


class Site(Strict):
    """One site_configs/<name>.yaml: what is true of a cluster for every experiment on it."""

    name: Name = Field(description="the name --site and experiment files use")
    description: str = Field("", description="one line, shown by hpctf sites")
    extends: str | None = Field(
        None, description="a site name, or a .yaml path relative to this file, to start from"
    )
    scheduler: Literal["slurm", "local"] = Field(
        description="slurm: sbatch; local: the workers as processes on this machine"
    )
    # Defaults for the experiment's resources (the experiment's own value wins key by key).
    partition: Partition | None = Field(None, description=_DEFAULT)
    account: SlurmName | None = Field(None, description=_DEFAULT)
    qos: SlurmName | None = Field(None, description=_DEFAULT)
    constraint: Constraint | None = Field(None, description=_DEFAULT)
    reservation: SlurmName | None = Field(None, description=_DEFAULT)
    gpus_per_node: int = Field(0, ge=0, le=64, description=_DEFAULT)
    tasks_per_node: int | None = Field(None, ge=1, le=1024, description=_DEFAULT)
    cpus_per_task: int | None = Field(None, ge=1, le=4096, description=_DEFAULT)
    mem: Mem | None = Field(None, description=_DEFAULT)
    time: Time | None = Field(None, description=_DEFAULT)
    exclusive: Exclusive | None = Field(None, description=_DEFAULT)
    mail_type: MailTypes | None = Field(None, description=_DEFAULT)
    mail_user: MailUser | None = Field(None, description=_DEFAULT)
    extra_sbatch: ExtraSbatch = Field(
        default_factory=list, description="written before the experiment's extra_sbatch"
    )
    gpu_request: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node",
        description="how to ask for GPUs: --gpus-per-node=N (cons_tres) or --gres=gpu:N",
    )
    modules: list[Module] = Field(default_factory=list, description="`module load`, in order")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="values are literal")
    setup: ShellLines = Field(
        default_factory=list,
        description="RAW SHELL run in the batch script after modules and env: the only place "
        "a site file holds shell code",
    )
    runs_root: str = Field(min_length=1, description="~ and $VARS are expanded at submit")
    python: str | None = Field(
        None, description="interpreter on compute nodes; default: the one running hpctf submit"
    )
    venv: str | None = Field(None, description="a virtualenv activated on compute nodes")
    port_range: tuple[int, int] = Field(
        (20000, 30000),
        description="[low, high]: each task of a job takes one port from this window; keep it "
        "outside Linux's ephemeral ports 32768-60999",
    )
    min_cpus_per_gpu: int | None = Field(
        None, ge=1, le=1024, description="validate warns below this many cores per GPU"
    )
    template: str | None = Field(
        None,
        description='a Jinja template, relative to this file, that {% extends "sbatch.sh.j2" %}',
    )
    preemption: Preemption = Field(default_factory=Preemption)
    hostname_template: str = Field(
        "{host}", description="address of a node in TF_CONFIG, e.g. '{host}-ib' for IPoIB"
    )
    worker_network: Literal["private", "host"] = Field(
        "private",
        description="local sites: private runs the workers in a network namespace of their own "
        "(only they reach TensorFlow's unauthenticated ports; no network but their loopback); "
        "host shares this machine's network (a script that downloads its data)",
    )
    shared_nodes: bool = Field(
        True,
        description="Slurm sites: other users' jobs may run on a node beside yours (shared "
        "partitions); submit then warns unless resources.exclusive, for they reach "
        "TensorFlow's ports; false where nodes are given whole",
    )
    doctor: Doctor = Field(default_factory=Doctor, description="thresholds for hpctf doctor")
    sweep: Sweep = Field(default_factory=Sweep, description="how hpctf sweep submits job arrays")
    notify: Notify | None = Field(
        None, description="every run's notify: unless its experiment has one"
    )
    container: Container | None = Field(
        None, description="run the workers in a container: runtime, image, mounts, env, python"
    )
    login: Login | None = Field(
        None,
        description="the login host: elsewhere, hpctf runs the cluster's commands over ssh",
    )

    _env = field_validator("env")(check_env)
    _hostname_template = field_validator("hostname_template")(check_hostname_template)

    @field_validator("port_range")
    @classmethod
    def _valid_ports(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not 1024 <= low < high <= 65535:
            raise ValueError("port_range must be [low, high] with 1024 <= low < high <= 65535")
        return value

    @field_validator("python", "venv", "runs_root")
    @classmethod
    def _path_like(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("-") or any(c in value for c in "\n\r\0")):
            raise ValueError(f"{value!r} is not a path (no leading -, newline or NUL)")
        return value

    @model_validator(mode="after")
    def _one_python(self) -> Site:
        if self.python and self.venv:
            raise ValueError("give at most one of python and venv")
        return self

    @field_validator("container")
    @classmethod
    def _container_on_slurm(cls, value: Container | None, info: ValidationInfo) -> Container | None:
        # The local launcher starts plain processes: a container there would be ignored.
        scheduler = info.data.get("scheduler")
        if value is not None and scheduler is not None and not allows_containers(scheduler):
            raise ValueError(
                "a container needs scheduler: slurm (the local site starts plain processes)"
            )
        return value


class ResolvedConfig(Strict):
    """Everything a run needs, after precedence; frozen as config.json in the run directory.

    ``experiment.resources`` holds the effective request (the site's defaults filled in, the
    site's ``extra_sbatch`` first); the site's ``venv``, ``python`` and ``runs_root`` are
    expanded.
    """

    experiment: Experiment
    site: Site
    experiment_file: str
    python: str = Field(description="interpreter that runs `hpctf worker` on compute nodes")

    @property
    def gpus_per_node(self) -> int:
        return self.experiment.resources.gpus_per_node or 0

    @property
    def ntasks(self) -> int:
        return self.experiment.resources.nodes * self.experiment.resources.tasks_per_node

    @property
    def spare_nodes(self) -> int:
        """Nodes the job holds beyond ``resources.nodes``, to lose without a requeue."""
        return self.experiment.resources.spare_nodes
