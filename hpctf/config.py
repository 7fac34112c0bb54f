"""Experiment and site files: schemas, loading, precedence and the resolved config.

Shared by both wings: the login node validates and resolves; the worker reads the frozen
result back from the run directory. Precedence is ``--set`` > experiment.yaml > site > defaults.
Every problem in a file is reported at once, one line each, naming file, line and key path.
"""

from __future__ import annotations

import copy
import difflib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hpctf.cluster import check_hostname_template
from hpctf.errors import UserError

_M = TypeVar("_M", bound=BaseModel)

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "-t, --time").
_TIME_RE = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)


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


def _scalar_to_str(value: Any) -> Any:
    """YAML reads ``NCCL_IB_TIMEOUT: 22`` as an int; environment values are strings."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


EnvValue = Annotated[str, BeforeValidator(_scalar_to_str)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _check_env(env: Mapping[str, str]) -> Mapping[str, str]:
    for key, value in env.items():
        if not _ENV_NAME_RE.match(key):
            raise ValueError(
                f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if "\n" in value or "\0" in value:
            raise ValueError(f"the value of {key} holds a newline or NUL byte")
    return env


class Resources(_Strict):
    """What the job asks Slurm for, in Slurm's own names."""

    nodes: int = Field(1, ge=1, le=100_000)
    tasks_per_node: int = Field(1, ge=1, le=1024)
    gpus_per_node: int | None = Field(None, ge=0, le=64, description="default: the site's")
    cpus_per_task: int = Field(1, ge=1, le=4096)
    time: str = "01:00:00"
    partition: str | None = Field(None, pattern=_NAME_RE, description="default: the site's")

    @field_validator("time")
    @classmethod
    def _valid_time(cls, value: str) -> str:
        if slurm_time_seconds(value) <= 0:
            raise ValueError("the time limit must be longer than zero")
        return value


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
        description="a collective waiting longer than this (a live but stuck rank) fails",
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

    name: str = Field(pattern=_NAME_RE)
    site: str | None = Field(None, description="default site; --site overrides it")
    resources: Resources = Field(default_factory=Resources)
    train: Train
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    env: dict[str, EnvValue] = Field(default_factory=dict)

    _env = field_validator("env")(_check_env)


class Site(_Strict):
    """One site_configs/<name>.yaml: what is true of a cluster for every experiment on it."""

    name: str = Field(pattern=_NAME_RE)
    description: str = ""
    scheduler: Literal["slurm", "local"]
    partition: str | None = Field(None, pattern=_NAME_RE)
    gpus_per_node: int = Field(0, ge=0, le=64)
    modules: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+/-]+$")]] = Field(
        default_factory=list
    )
    env: dict[str, EnvValue] = Field(default_factory=dict)
    runs_root: str = Field(min_length=1, description="~ and $VARS are expanded at submit")
    python: str | None = Field(
        None, description="interpreter on compute nodes; default: the one running hpctf submit"
    )
    venv: str | None = Field(None, description="a virtualenv activated on compute nodes")
    port_range: tuple[int, int] = (20000, 30000)
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

    @model_validator(mode="after")
    def _one_python(self) -> Site:
        if self.python and self.venv:
            raise ValueError("give at most one of python and venv")
        return self


class ResolvedConfig(_Strict):
    """Everything a run needs, after precedence; frozen as config.json in the run directory."""

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


# --- loading -------------------------------------------------------------------------------


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in a YAML document to its 1-based line, for error messages."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, str(index))] = item.start_mark.line + 1
                walk(item, (*path, str(index)))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def load_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Read one YAML mapping with ``yaml.safe_load``; return it and its key lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        raise UserError(f"{path}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys at the top, got {type(data).__name__}")
    return data, _key_lines(text)


def _allowed_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys a (possibly nested) model allows at ``loc``'s parent."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        annotation = fields[part].annotation
        current = annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def format_validation_error(
    exc: ValidationError,
    source: str,
    model: type[BaseModel],
    lines: Mapping[tuple[str, ...], int] | None = None,
) -> str:
    """One line per problem: ``file:line: key.path: what was wrong; what is allowed``."""
    out = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        key = ".".join(loc) or "(top level)"
        line = (lines or {}).get(tuple(loc))
        where = f"{source}:{line}" if line else source
        if error["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, error["loc"])
            hint = difflib.get_close_matches(loc[-1], allowed, n=1)
            message = "unknown key"
            if hint:
                message += f" (did you mean {hint[0]!r}?)"
            message += f"; allowed: {', '.join(allowed)}"
        elif error["type"] == "missing":
            message = "required key is missing"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] not in {"value_error", "assertion_error"} and "input" in error:
                message += f" (got {error['input']!r})"
        out.append(f"{where}: {key}: {message}")
    return "\n".join(out)


def _validate(model: type[_M], data: Any, source: str, lines: Mapping[tuple[str, ...], int]) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source, model, lines)) from None


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML scalars) to a copy of data."""
    result = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. resources.nodes=4")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        target = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = target.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {item!r}: {part} is not a mapping")
            target = child
        target[parts[-1]] = value
    return result


def load_experiment(path: Path, overrides: Iterable[str] = ()) -> Experiment:
    data, lines = load_yaml(path)
    data = apply_overrides(data, overrides)
    return _validate(Experiment, data, str(path), lines)


def load_site(path: Path) -> Site:
    data, lines = load_yaml(path)
    return _validate(Site, data, str(path), lines)


def resolve(
    experiment_file: Path,
    site: Site,
    experiment: Experiment,
    python: str | None = None,
) -> ResolvedConfig:
    """Combine an experiment with its site. Paths become absolute; nothing is written."""
    base = experiment_file.resolve().parent
    train = experiment.train.model_copy(
        update={"python_path": [str((base / p).resolve()) for p in experiment.train.python_path]}
    )
    experiment = experiment.model_copy(update={"train": train})
    if site.python:
        interpreter = site.python
    elif site.venv:
        interpreter = str(Path(site.venv).expanduser() / "bin" / "python")
    else:
        interpreter = python or sys.executable
    return ResolvedConfig(
        experiment=experiment,
        site=site,
        experiment_file=str(experiment_file.resolve()),
        python=interpreter,
    )
