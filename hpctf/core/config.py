"""Experiment and site files: schemas, precedence and the resolved config.

Shared by both wings: the login node validates and resolves; the worker reads the frozen
result back from the run directory. Precedence is ``--set`` > experiment.yaml > site > defaults.
Every problem in a file is reported at once, one line each, naming file, line and key path
(the machinery for that is :mod:`hpctf.core.sources`).
"""

from __future__ import annotations

import os
import re
import string
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from hpctf.core.errors import UserError
from hpctf.core.sources import (
    KeyPath,
    Origins,
    apply_overrides,
    file_origins,
    load_yaml,
    validate_model,
)

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "-t, --time").
_TIME_RE = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
# Environment variables the batch script or the worker set themselves.
RESERVED_ENV = frozenset({"RUN_DIR", "PYTHON", "TF_CONFIG"})


def slurm_time_seconds(text: str) -> int:
    """Seconds in a Slurm time limit; raises ValueError for anything Slurm would not accept."""
    match = _TIME_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm time; use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in g:
        return ((g["days"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    if "c" in g:  # H:M:S
        return (g["a"] * 60 + g["b"]) * 60 + g["c"]
    return g["a"] * 60 + g.get("b", 0)  # M or M:S


# --- value types ---------------------------------------------------------------------------


def _scalar_to_str(value: Any) -> Any:
    """YAML reads ``NCCL_IB_TIMEOUT: 22`` as an int; environment values are strings."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


def _number_to_str(value: Any) -> Any:
    """``mem: 4000`` or ``time: 30`` arrive as ints; Slurm values are strings."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _matching(pattern: str, what: str) -> AfterValidator:
    """A validator admitting strings that match ``pattern``; its error says ``what`` is allowed."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _schema_pattern(pattern: str) -> Any:
    """The pattern again, for editors reading the JSON Schema (``hpctf schema``)."""
    return Field(json_schema_extra={"pattern": pattern})


_AS_STR = BeforeValidator(_number_to_str)


def _check_time(value: str) -> str:
    if not _TIME_RE.fullmatch(value):  # no surrounding space: the value goes into #SBATCH
        raise ValueError(f"{value!r} is not a Slurm time; use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    if slurm_time_seconds(value) <= 0:
        raise ValueError("the time limit must be longer than zero")
    return value


def _check_shell_text(value: str) -> str:
    if "\0" in value:
        raise ValueError("holds a NUL byte")
    return value


def _split_commas(value: Any) -> Any:
    """``mail_type: END,FAIL`` and ``mail_type: [END, FAIL]`` mean the same; case is ignored."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list):
        return [v.upper() if isinstance(v, str) else v for v in value]
    return value


def _one_line_list(value: Any) -> Any:
    """``setup: |`` (one block of shell) is a list of one item."""
    return [value] if isinstance(value, str) else value


def _shell_line(value: Any) -> Any:
    if isinstance(value, dict):
        # `- echo "a: b"` unquoted is a YAML mapping: the most common way to get this wrong.
        raise ValueError("this line reads as a YAML mapping because it holds ': '; quote it")
    return value


def _exclusive(value: Any) -> Any:
    """sbatch's ``--exclusive[=user|mcs]``: a boolean, ``user`` or ``mcs``."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    if text in {"user", "mcs"}:
        return text
    if text in {"true", "yes", "on", "1"}:
        return True
    if text in {"false", "no", "off", "0"}:
        return False
    raise ValueError(f"{value!r} is not one of true, false, user, mcs")


_PARTITION_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(,[A-Za-z0-9][A-Za-z0-9_.-]*)*$"
_SLURM_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"
_CONSTRAINT_RE = r"^[A-Za-z0-9_.\[(][A-Za-z0-9_.&|,*\[\]()-]*$"
_MEM_RE = r"^[0-9]+[KMGTkmgt]?$"
_MAIL_USER_RE = r"^[A-Za-z0-9][A-Za-z0-9._%+-]*(@[A-Za-z0-9][A-Za-z0-9.-]*)?$"
_DEP_ITEM = (
    r"(?:singleton|(?:after|afterany|afterburstbuffer|aftercorr|afternotok|afterok)"
    r":[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?(?::[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?)*)"
)
_DEPENDENCY_RE = rf"^(?:{_DEP_ITEM}(?:,{_DEP_ITEM})*|{_DEP_ITEM}(?:\?{_DEP_ITEM})+)$"
_MODULE_RE = r"^[A-Za-z0-9_.+@][A-Za-z0-9_.+@/:-]*$"

Name = Annotated[
    str,
    _AS_STR,
    _matching(_NAME_RE, "a name (a letter or digit, then up to 63 letters, digits, _ . -)"),
    _schema_pattern(_NAME_RE),
]
Partition = Annotated[
    str,
    _AS_STR,
    _matching(_PARTITION_RE, "a partition name or a comma-separated list of them"),
    _schema_pattern(_PARTITION_RE),
]
SlurmName = Annotated[
    str,
    _AS_STR,
    _matching(_SLURM_NAME_RE, "a Slurm name (a letter or digit, then letters, digits, _ . + -)"),
    _schema_pattern(_SLURM_NAME_RE),
]
Constraint = Annotated[
    str,
    _AS_STR,
    _matching(
        _CONSTRAINT_RE, "a Slurm constraint (features joined by & | , with *count, [ ], ( ))"
    ),
    _schema_pattern(_CONSTRAINT_RE),
]
Mem = Annotated[
    str,
    _AS_STR,
    _matching(_MEM_RE, "a Slurm memory size: megabytes, or a number with K, M, G or T"),
    _schema_pattern(_MEM_RE),
]
MailUser = Annotated[
    str,
    _AS_STR,
    _matching(_MAIL_USER_RE, "a user name or mail address"),
    _schema_pattern(_MAIL_USER_RE),
]
Dependency = Annotated[
    str,
    _AS_STR,
    _matching(
        _DEPENDENCY_RE,
        "a Slurm dependency (type:jobid[:jobid...] joined by , or ?; e.g. afterok:123, singleton)",
    ),
    _schema_pattern(_DEPENDENCY_RE),
]
Module = Annotated[
    str,
    _matching(
        _MODULE_RE, "a module name (letters, digits, _ . + @ / : -, not starting with - or /)"
    ),
    _schema_pattern(_MODULE_RE),
]
Time = Annotated[
    str,
    BeforeValidator(_number_to_str),
    AfterValidator(_check_time),
    Field(description="M, M:S, H:M:S, D-H, D-H:M or D-H:M:S", examples=["04:00:00", "1-00:00"]),
]
MailType = Literal[
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
]
MailTypes = Annotated[list[MailType], BeforeValidator(_split_commas)]
Exclusive = Annotated[bool | Literal["user", "mcs"], BeforeValidator(_exclusive)]
EnvValue = Annotated[str, BeforeValidator(_scalar_to_str)]
ShellText = Annotated[str, BeforeValidator(_shell_line), AfterValidator(_check_shell_text)]
ShellLines = Annotated[list[ShellText], BeforeValidator(_one_line_list)]


# --- extra_sbatch --------------------------------------------------------------------------

# Options hpctf writes itself or whose effect would break the run, with what to use instead.
# sbatch reads #SBATCH lines with getopt_long, so it accepts any unambiguous prefix of a long
# option (``--ntasks-per-n=2``) and a later option overrides an earlier one: every spelling of
# these is refused, not just the full name.
MANAGED_OPTIONS: dict[str, str] = {
    "job-name": "set name",
    "nodes": "set resources.nodes",
    "ntasks": "set resources.nodes and resources.tasks_per_node",
    "ntasks-per-node": "set resources.tasks_per_node",
    "cpus-per-task": "set resources.cpus_per_task",
    "time": "set resources.time",
    "partition": "set resources.partition",
    "account": "set resources.account",
    "qos": "set resources.qos",
    "constraint": "set resources.constraint",
    "reservation": "set resources.reservation",
    "exclusive": "set resources.exclusive",
    "mail-type": "set resources.mail_type",
    "mail-user": "set resources.mail_user",
    "dependency": "set resources.dependency",
    "mem": "set resources.mem",
    "gpus-per-node": "set resources.gpus_per_node",
    "gpus": "set resources.gpus_per_node",
    "gpus-per-task": "set resources.gpus_per_node",
    "output": "hpctf writes the job's output to the run directory",
    "error": "hpctf writes the job's output to the run directory",
    "signal": "hpctf owns the job's signals (set the site's preemption.signal)",
    "requeue": "hpctf requeues preempted jobs itself (the site's preemption.max_requeues)",
    "no-requeue": "hpctf requeues preempted jobs itself (the site's preemption.max_requeues)",
    "array": "one run per job; submit the experiment once per run instead",
    "wrap": "the rendered script is the job",
    "test-only": "use hpctf submit --dry-run",
    "wait": "hpctf submit returns once the job is queued",
    "export": "srun inside the script needs the job's environment",
}
_MANAGED_SHORT = {
    "J": "job-name",
    "N": "nodes",
    "n": "ntasks",
    "c": "cpus-per-task",
    "t": "time",
    "p": "partition",
    "A": "account",
    "q": "qos",
    "C": "constraint",
    "d": "dependency",
    "G": "gpus",
    "o": "output",
    "e": "error",
    "a": "array",
    "W": "wait",
}
# sbatch's short options that take a value (sbatch(1), Slurm 22.05). Any other letter takes
# none, so "-Hx" would be "-H -x": bundles are refused, one option per item.
_SHORT_WITH_VALUE = set("AaBbCcDdeFGiJLMmNnopqStwx")
_OPTION_TOKEN = re.compile(r"^[A-Za-z0-9_.,:/=@%+?&|*\[\]()!^-]+$")


def normalize_sbatch_option(item: str) -> str:
    """One ``extra_sbatch`` item as a single ``#SBATCH`` token, or ValueError saying why not.

    Accepts ``--name``, ``--name=value``, ``--name value``, ``-X``, ``-Xvalue`` and
    ``-X value``; returns ``--name[=value]`` or ``-X[value]``. Refuses the options in
    :data:`MANAGED_OPTIONS` in every spelling (abbreviated, short, ``=`` or space).
    """
    parts = item.split()
    if len(parts) == 2 and "=" in parts[0]:
        raise ValueError(f"{item!r}: #SBATCH values cannot hold spaces")
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1].startswith("-")):
        raise ValueError(f"{item!r}: give one sbatch option per item, e.g. --gres-flags=enforce")
    for part in parts:
        if not _OPTION_TOKEN.fullmatch(part):
            raise ValueError(
                f"{item!r}: #SBATCH values may hold letters, digits and _.,:/=@%+?&|*[]()!^- "
                "only (no spaces, quotes, $, backquotes, backslashes or #)"
            )
    head = parts[0]
    if head.startswith("--"):
        name = head[2:].partition("=")[0]
        if not re.fullmatch(r"^[a-z][a-z0-9-]*$", name):
            raise ValueError(f"{item!r}: {name!r} is not an sbatch option name")
        managed = sorted(m for m in MANAGED_OPTIONS if m.startswith(name))
        if managed:
            full = name if name in managed else managed[0]
            raise ValueError(
                f"{item!r} would override --{full}, which hpctf manages: {MANAGED_OPTIONS[full]}"
            )
        return f"--{name}={parts[1]}" if len(parts) == 2 else head
    if len(head) >= 2 and head[0] == "-" and head[1].isalpha():
        letter, rest = head[1], head[2:]
        if letter in _MANAGED_SHORT:
            full = _MANAGED_SHORT[letter]
            raise ValueError(f"{item!r} is --{full}, which hpctf manages: {MANAGED_OPTIONS[full]}")
        value = rest or (parts[1] if len(parts) == 2 else "")
        if letter not in _SHORT_WITH_VALUE:
            if value:
                raise ValueError(f"{item!r}: -{letter} takes no value; one option per item")
            return head
        if not value:
            raise ValueError(f"{item!r}: -{letter} needs a value")
        return f"-{letter}{value}"
    raise ValueError(f"{item!r} is not an sbatch option (--name[=value] or -X [value])")


ExtraSbatch = Annotated[
    list[Annotated[str, AfterValidator(normalize_sbatch_option)]],
    Field(description="more #SBATCH options, one per item, e.g. --gres-flags=enforce-binding"),
]


# --- models --------------------------------------------------------------------------------


_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_hostname_template(template: str) -> str:
    """Return ``template`` if it is a valid hostname_template, else raise ValueError.

    Valid: ``{host}`` (the Slurm node name) at least once, no other field, no conversion or
    format spec, and a result that is a valid DNS name (labels of letters, digits, hyphens).
    """
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        raise ValueError(f"hostname_template {template!r}: {exc}") from None
    if not fields or any(f != ("host", "", None) for f in fields):
        raise ValueError(
            f"hostname_template {template!r} must contain {{host}} and no other field, "
            "e.g. '{host}-ib' or '{host}.ib.cluster'"
        )
    sample = template.format(host="node001")
    if len(sample) > 253 or not all(_LABEL_RE.match(label) for label in sample.split(".")):
        raise ValueError(
            f"hostname_template {template!r} gives {sample!r} for node001, which is not a valid "
            "host name (letters, digits and hyphens, dot-separated)"
        )
    return template


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _check_env(env: Mapping[str, str]) -> Mapping[str, str]:
    for key, value in env.items():
        if not _ENV_NAME_RE.fullmatch(key):
            raise ValueError(
                f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if key in RESERVED_ENV or key.startswith("HPCTF_"):
            raise ValueError(f"{key} is set by hpctf itself and cannot be given in env")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(f"the value of {key} holds a newline or NUL byte")
    return env


class Resources(_Strict):
    """What the job asks Slurm for, in Slurm's own names.

    A site file may give a default for every key here except ``nodes`` and ``dependency``;
    a key given in the experiment (even as ``null``) wins over the site's default.
    """

    nodes: int = Field(1, ge=1, le=100_000)
    tasks_per_node: int = Field(1, ge=1, le=1024)
    gpus_per_node: int | None = Field(None, ge=0, le=64, description="default: the site's")
    cpus_per_task: int = Field(1, ge=1, le=4096)
    mem: Mem | None = Field(None, description="--mem per node, e.g. 64G; 0 is all of it")
    time: Time = "01:00:00"
    partition: Partition | None = Field(None, description="default: the site's")
    account: SlurmName | None = None
    qos: SlurmName | None = None
    constraint: Constraint | None = None
    reservation: SlurmName | None = None
    exclusive: Exclusive = False
    mail_type: MailTypes = Field(default_factory=list)
    mail_user: MailUser | None = None
    dependency: Dependency | None = None
    extra_sbatch: ExtraSbatch = Field(default_factory=list)


# Resource keys a site file may give defaults for (the rest are per experiment).
SITE_RESOURCE_KEYS = tuple(k for k in Resources.model_fields if k not in {"nodes", "dependency"})


class Train(_Strict):
    """What to train and for how long."""

    entry: str = Field(pattern=_ENTRY_RE, description="module:function returning hpctf.Task")
    args: dict[str, Any] = Field(default_factory=dict)
    steps: int | None = Field(None, ge=1)
    epochs: int | None = Field(None, ge=1)
    global_batch_size: int = Field(ge=1)
    log_every_steps: int = Field(10, ge=1)
    seed: int = 0
    python_path: list[str] = Field(
        default_factory=lambda: ["."],
        description="directories put on sys.path for the entry, relative to the experiment file",
    )
    eval_every_steps: int | None = Field(
        None, ge=1, description="evaluate every N steps as well as at the end"
    )
    scale_learning_rate: bool = Field(
        False, description="multiply the optimizer's learning rate by the number of replicas"
    )
    mixed_precision: bool = Field(
        False, description="mixed_float16 on GPUs, mixed_bfloat16 on CPUs"
    )
    jit_compile: bool = Field(False, description="compile the step's forward and backward with XLA")
    communication: Literal["auto", "nccl", "ring"] = Field(
        "auto", description="collective implementation; auto: NCCL when GPUs are visible, else RING"
    )
    # Bounded failure: a dead, frozen or stuck rank ends the whole job within these bounds.
    heartbeat_timeout_seconds: int = Field(
        10,
        ge=1,
        description="a rank whose heartbeats stop (dead or frozen) fails the job after this",
    )
    collective_timeout_seconds: int | None = Field(
        1800,
        ge=1,
        description=(
            "a rank that finishes no step, save or evaluation batch for this long (a live but "
            "stuck peer, a hung collective) exits 124; null: wait for ever"
        ),
    )
    startup_timeout_seconds: int = Field(
        300, ge=1, description="every rank must join the cluster within this"
    )
    preemption_check_every_steps: int = Field(
        10, ge=1, description="how often the ranks agree whether any got a preemption signal"
    )
    loop: Literal["builtin", "custom"] = Field(
        "builtin",
        description="builtin: entry returns hpctf.Task; custom: entry(session, **args) trains",
    )

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> Train:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of train.steps or train.epochs")
        return self


class Checkpoint(_Strict):
    every_steps: int = Field(100, ge=1)
    keep: int = Field(3, ge=1)


class Experiment(_Strict):
    """One experiment.yaml."""

    name: Name
    site: str | None = Field(None, description="default site (name or .yaml path); --site wins")
    resources: Resources = Field(default_factory=Resources)
    train: Train
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    env: dict[str, EnvValue] = Field(
        default_factory=dict, description="exported after the site's env; values are literal"
    )
    setup: ShellLines = Field(
        default_factory=list,
        description="RAW SHELL run in the batch script after the site's setup lines",
    )

    _env = field_validator("env")(_check_env)


class Preemption(_Strict):
    """How Slurm warns a job before preempting it or ending it at its time limit.

    Slurm jobs of such a site are submitted with ``--signal=<signal>@<warning_seconds>`` and
    ``--requeue``: on the warning every worker saves an agreed step and exits 75, and the batch
    script requeues the job (at most ``max_requeues`` times), which resumes from that step.
    """

    # Not USR1: NCCL uses SIGUSR1 itself. The worker handles exactly these two.
    signal: Literal["USR2", "TERM"] = "USR2"
    warning_seconds: int = Field(300, ge=1, le=65535)
    max_requeues: int = Field(20, ge=0, description="requeues of one job after preemption")


class Site(_Strict):
    """One site_configs/<name>.yaml: what is true of a cluster for every experiment on it."""

    name: Name
    description: str = ""
    extends: str | None = Field(
        None, description="a site name, or a .yaml path relative to this file, to start from"
    )
    scheduler: Literal["slurm", "local"]
    # Defaults for the experiment's resources (the experiment's own value wins key by key).
    partition: Partition | None = None
    account: SlurmName | None = None
    qos: SlurmName | None = None
    constraint: Constraint | None = None
    reservation: SlurmName | None = None
    gpus_per_node: int = Field(0, ge=0, le=64)
    tasks_per_node: int | None = Field(None, ge=1, le=1024)
    cpus_per_task: int | None = Field(None, ge=1, le=4096)
    mem: Mem | None = None
    time: Time | None = None
    exclusive: Exclusive | None = None
    mail_type: MailTypes | None = None
    mail_user: MailUser | None = None
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
    port_range: tuple[int, int] = (20000, 30000)
    template: str | None = Field(
        None,
        description='a Jinja template, relative to this file, that {% extends "sbatch.sh.j2" %}',
    )
    preemption: Preemption = Field(default_factory=Preemption)
    hostname_template: str = Field(
        "{host}", description="address of a node in TF_CONFIG, e.g. '{host}-ib' for IPoIB"
    )

    _env = field_validator("env")(_check_env)
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


class ResolvedConfig(_Strict):
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
        value = self.experiment.resources.gpus_per_node
        return self.site.gpus_per_node if value is None else value

    @property
    def partition(self) -> str | None:
        return self.experiment.resources.partition or self.site.partition

    @property
    def ntasks(self) -> int:
        return self.experiment.resources.nodes * self.experiment.resources.tasks_per_node


def read_experiment(path: Path, overrides: Iterable[str] = ()) -> tuple[Experiment, Origins]:
    """Load, override and validate one experiment file; also say where each value came from."""
    data, lines = load_yaml(path)
    origins = file_origins("experiment", path, lines)
    data = apply_overrides(data, overrides, Experiment, origins)
    return validate_model(Experiment, data, origins, str(path)), origins


# --- resolution ----------------------------------------------------------------------------


class ConfigProblems(UserError):
    """Problems found only once experiment and site are combined, by resolved key path.

    The message names the experiment file; :mod:`hpctf.login.loader` re-words each problem with the
    file and line its value came from.
    """

    def __init__(self, experiment_file: Path | str, problems: list[tuple[KeyPath, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{experiment_file}: {'.'.join(k)}: {m}" for k, m in problems))


def expand_path(value: str, env: Mapping[str, str]) -> str:
    """``~`` and ``$NAME``/``${NAME}`` expanded from ``env``; ValueError saying what is wrong."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise ValueError(f"{value!r} names the unset variable ${name}")
        return env[name]

    text = re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", variable, value)
    if "$" in text:
        raise ValueError(f"{value!r}: only $NAME and ${{NAME}} expand here")
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME")
        if not home:
            raise ValueError(f"{value!r} starts with ~ but HOME is not set")
        text = home + text[1:]
    return text


def effective_resources(resources: Resources, site: Site) -> Resources:
    """The experiment's resources with the site's defaults filled in for keys it did not give."""
    given = resources.model_fields_set
    update: dict[str, Any] = {}
    for key in SITE_RESOURCE_KEYS:
        if key == "extra_sbatch":
            update[key] = [*site.extra_sbatch, *resources.extra_sbatch]
        elif key not in given and getattr(site, key) is not None:
            update[key] = getattr(site, key)
    return resources.model_copy(update=update)


def resource_conflicts(resources: Resources, site: Site) -> list[tuple[KeyPath, str]]:
    """Problems only visible once site and experiment are combined: (key path, message)."""
    problems: list[tuple[KeyPath, str]] = []
    if resources.mail_user and not resources.mail_type:
        problems.append(
            (("resources", "mail_user"), "mail_user without mail_type sends nothing; add mail_type")
        )
    gpus = site.gpus_per_node if resources.gpus_per_node is None else resources.gpus_per_node
    for index, option in enumerate(resources.extra_sbatch):
        name = option[2:].split("=", 1)[0] if option.startswith("--") else ""
        if resources.mem and name in {"mem-per-cpu", "mem-per-gpu"}:
            problems.append(
                (
                    ("resources", "extra_sbatch", str(index)),
                    f"{option} conflicts with resources.mem ({resources.mem}); give one of them",
                )
            )
        if site.gpu_request == "gres" and gpus and "gres".startswith(name) and name:
            problems.append(
                (
                    ("resources", "extra_sbatch", str(index)),
                    f"{option} would override --gres=gpu:{gpus}, which hpctf writes for this "
                    "site (gpu_request: gres); use resources.gpus_per_node",
                )
            )
    return problems


def resolve(
    experiment_file: Path,
    site: Site,
    experiment: Experiment,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedConfig:
    """Combine an experiment with its site. Paths become absolute; nothing is written.

    ``env`` (default: ``os.environ``) expands ``~`` and ``$VARS`` in the site's ``venv``,
    ``python`` and ``runs_root``. Raises :class:`ConfigProblems` for combinations that cannot
    work.
    """
    env = os.environ if env is None else env
    base = experiment_file.resolve().parent
    train = experiment.train.model_copy(
        update={"python_path": [str((base / p).resolve()) for p in experiment.train.python_path]}
    )
    resources = effective_resources(experiment.resources, site)
    problems = resource_conflicts(resources, site)
    experiment = experiment.model_copy(update={"train": train, "resources": resources})
    site_update: dict[str, Any] = {}
    for key in ("runs_root", "venv", "python"):
        value = getattr(site, key)
        if value is None:
            continue
        try:
            expanded = expand_path(value, env)
        except ValueError as exc:
            problems.append(((key,), str(exc)))
            continue
        if key != "runs_root" and not expanded.startswith("/") and (key == "venv" or "/" in value):
            problems.append(
                ((key,), f"{value!r} must be an absolute path (python may be a bare command name)")
            )
        site_update[key] = expanded
    if problems:
        raise ConfigProblems(experiment_file, problems)
    site = site.model_copy(update=site_update)
    if site.python:
        interpreter = site.python
    elif site.venv:
        interpreter = str(Path(site.venv) / "bin" / "python")
    else:
        interpreter = python or sys.executable
    return ResolvedConfig(
        experiment=experiment,
        site=site,
        experiment_file=str(experiment_file.resolve()),
        python=interpreter,
    )
