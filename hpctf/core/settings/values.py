"""The grammar of configuration values: names, Slurm times and sizes, environment entries,
shell text. Pydantic types with one-line errors that say what is allowed; the schemas in
:mod:`hpctf.core.settings.config` are built from them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
)

from hpctf.core.secrets import MARK, REDACTED, is_secret_entry

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Strict(BaseModel):
    """The base of every settings schema: an unknown key is refused, and defaults are
    validated like given values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


ENTRY_RE = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch(1), "-t, --time").
_TIME_RE = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
# Environment variables the batch script or the worker set themselves.
RESERVED_ENV = frozenset({"RUN_DIR", "PYTHON", "TF_CONFIG"})
# Names an experiment's or site's env may not set, with whose they are. The batch script
# exports env before `hpctf job-start` and srun: a SLURM_JOB_ID there named another job in the
# journal, BASH_ENV (ENV for sh) runs a file in every bash the job starts, SBATCH_*/SRUN_*
# change the job's own options, CUDA_VISIBLE_DEVICES the GPUs the worker checks it was given.
OWNED_ENV = {
    "BASH_ENV": "bash reads it to run a file in every shell the job starts",
    "ENV": "sh reads it to run a file in every shell the job starts",
    "CUDA_VISIBLE_DEVICES": "Slurm and hpctf choose the GPUs (resources.gpus_per_node)",
}
OWNED_ENV_PREFIXES = {
    "SLURM_": "Slurm sets it for the job",
    "SRUN_": "srun reads it as its own options",
    "SBATCH_": "sbatch reads it as the job's options",
    "SALLOC_": "salloc reads it as its options",
    "HPCTF_": "hpctf sets it",
}


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


class Secret(SecretStr):
    """A secret value (:mod:`hpctf.core.secrets`): ``str()``, ``repr()`` and every dump print
    ``***``; :func:`hpctf.core.secrets.reveal` gives the text to the one place that needs it."""

    def _display(self) -> str:
        return REDACTED


def _marked(value: Any) -> Any:
    """``{secret: value}`` (what ``!secret value`` loads as): the value, a :class:`Secret`."""
    if isinstance(value, dict) and set(value) == {MARK}:
        inner = _scalar_to_str(value[MARK])
        if not isinstance(inner, str):
            raise ValueError("a secret ({secret: ...} or !secret) must be a single value")
        return Secret(inner)
    return _scalar_to_str(value)


def _unmarked(value: Any) -> Any:
    """A field that is always kept as a secret (a webhook, a tracking URI): a mark is welcome
    and changes nothing."""
    if isinstance(value, dict) and set(value) == {MARK}:
        return value[MARK]
    return value


# Serialised as *** to JSON: config.json, doctor's report and `hpctf sites` never hold the
# value; a Python dump keeps the Secret (a config copied with changes keeps its secrets).
SecretValue = Annotated[
    Secret, PlainSerializer(lambda _: REDACTED, return_type=str, when_used="json")
]
EnvValue = Annotated[str | SecretValue, BeforeValidator(_marked)]
# A value that may be written as {secret: ...} although it is a secret anyway.
MarkableText = Annotated[str, BeforeValidator(_unmarked)]
ShellText = Annotated[str, BeforeValidator(_shell_line), AfterValidator(_check_shell_text)]
ShellLines = Annotated[list[ShellText], BeforeValidator(_one_line_list)]


def env_owner(name: str) -> str | None:
    """Why ``name`` belongs to Slurm, a shell or hpctf (:data:`OWNED_ENV`), or None."""
    if name in OWNED_ENV:
        return OWNED_ENV[name]
    return next((why for p, why in OWNED_ENV_PREFIXES.items() if name.startswith(p)), None)


def check_env(env: Mapping[str, str | Secret]) -> dict[str, str | Secret]:
    """``env`` checked, each unmarked entry that is a secret by rule made a :class:`Secret`:
    the one place an entry's secrecy is decided."""
    checked: dict[str, str | Secret] = {}
    for key, given in env.items():
        value = given.get_secret_value() if isinstance(given, Secret) else given
        if not ENV_NAME_RE.fullmatch(key):
            raise ValueError(
                f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if key in RESERVED_ENV:
            raise ValueError(f"{key} is set by hpctf itself and cannot be given in env")
        if owner := env_owner(key):
            raise ValueError(f"{key} cannot be given in env: {owner}")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(f"the value of {key} holds a newline or NUL byte")
        secret = isinstance(given, Secret) or is_secret_entry(key, value)
        checked[key] = Secret(value) if secret else value
    return checked


def check_entry(value: Any) -> Any:
    """A ``train.entry`` that is not ``module:function``, in one line saying what to write
    (before the pattern's own message, which only quotes the regular expression)."""
    if not isinstance(value, str) or re.fullmatch(ENTRY_RE, value):
        return value
    if value.endswith(".py") or "/" in value:
        stem = value.rsplit("/", 1)[-1].removesuffix(".py")
        module = stem if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", stem) else "train"
        raise ValueError(
            f"{value!r} is a file: to run a script as it is, give it as train.script; an entry "
            f"is module:function, the function returning hpctf.Task (e.g. {module}:build)"
        )
    module = value.partition(":")[0]
    valid = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", module) and not module.endswith(".")
    example = f"{module if valid else 'train'}:build"
    raise ValueError(
        f"{value!r} is not module:function: name the module and the function returning "
        f"hpctf.Task (e.g. {example}); to run a script as it is, give train.script"
    )


# --- limits ---------------------------------------------------------------------------------
# Counts a run can reach, refused at validate rather than as a bug at step 2: TensorFlow keeps
# the step in an int64 and Python's sleep takes at most about 2**63 ns. 10**12 steps is three
# years at 10,000 steps a second; 10**6 epochs times 10**12 steps still fits in an int64.
MAX_STEPS = 10**12
MAX_EPOCHS = 10**6
MAX_BATCH = 2**31 - 1
MAX_SECONDS = 10**8  # three years


def finite_args(value: dict[str, Any]) -> dict[str, Any]:
    """``train.args`` without NaN or infinity anywhere: JSON (the frozen config) has no such
    number, so one would reach the user's code as None."""

    def walk(item: Any, where: str) -> None:
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(
                f"{where} is {item}, which the frozen config (JSON) cannot hold; give a finite "
                f'number, or the string "{item}" and convert it in your code'
            )
        if isinstance(item, dict):
            for key, inner in item.items():
                walk(inner, f"{where}.{key}")
        elif isinstance(item, list):
            for index, inner in enumerate(item):
                walk(inner, f"{where}[{index}]")

    for key, item in value.items():
        walk(item, f"train.args.{key}")
    return value
