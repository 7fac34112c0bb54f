"""The one table of sbatch options hpctf knows: what it renders, from which config value, and
what ``extra_sbatch`` may not say (in the spirit of submitit's ``_make_sbatch_string``, where one
table drives the flags, the keys and the errors).

Each :class:`Option` is one sbatch long option. ``value`` computes it from the resolved config
(:data:`ABSENT`: no line; None: a flag without a value); the config is a
:class:`hpctf.core.settings.config.ResolvedConfig`, typed ``Any`` here because the schemas validate
``extra_sbatch`` with this module and it must not import them. ``key`` names the resolved value
it comes from, for ``render --explain``; ``instead`` says what to use when ``extra_sbatch``
names it, which makes it managed. sbatch reads #SBATCH lines with getopt_long, so it accepts any
unambiguous prefix of a long option (``--ntasks-per-n=2``) and a later option overrides an
earlier one: every spelling of a managed option is refused, not only its full name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.notify import mail_types, notify_of

KeyPath = tuple[str, ...]
Config = Any  # a hpctf.core.settings.config.ResolvedConfig
Value = str | int | None


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()  # the option is not rendered for this config
_NOT_RENDERED: Callable[[Config, Path], Any] = lambda config, run_dir: ABSENT  # noqa: E731


@dataclass(frozen=True)
class Option:
    flag: str
    key: KeyPath | None = None
    instead: str | None = None  # managed: what to use instead of extra_sbatch
    short: str | None = None
    value: Callable[[Config, Path], Any] = _NOT_RENDERED


def _resource(name: str) -> Callable[[Config, Path], Any]:
    """The resource ``name`` when it is set, else no line."""

    def value(config: Config, run_dir: Path) -> Any:
        given = getattr(config.experiment.resources, name)
        return ABSENT if given is None or given == "" else given

    return value


def _nodes(config: Config, run_dir: Path) -> Any:
    """The nodes that train and the spares beside them (``resources.spare_nodes``)."""
    resources = config.experiment.resources
    return resources.nodes + resources.spare_nodes


def _no_kill(config: Config, run_dir: Path) -> Any:
    """With spares, a lost node must not end the job: Slurm drops the node from the
    allocation, and the batch script starts the workers again on the nodes left."""
    return None if config.experiment.resources.spare_nodes else ABSENT


def _gpus(request: str) -> Callable[[Config, Path], Any]:
    def value(config: Config, run_dir: Path) -> Any:
        gpus = config.experiment.resources.gpus_per_node or 0
        if not gpus or config.site.gpu_request != request:
            return ABSENT
        return f"gpu:{gpus}" if request == "gres" else gpus

    return value


def _exclusive(config: Config, run_dir: Path) -> Any:
    exclusive = config.experiment.resources.exclusive
    if exclusive is False:
        return ABSENT
    return None if exclusive is True else exclusive


def _mail_type(config: Config, run_dir: Path) -> Any:
    """resources.mail_type, and the types ``notify: {email}`` stands for (its events)."""
    given = list(config.experiment.resources.mail_type)
    given += [kind for kind in mail_types(notify_of(config)) if kind not in given]
    return ",".join(given) or ABSENT


def _mail_user(config: Config, run_dir: Path) -> Any:
    """resources.mail_user, else ``notify: {email}``."""
    notify = notify_of(config)
    return config.experiment.resources.mail_user or (notify and notify.email) or ABSENT


def _dependency(config: Config, run_dir: Path) -> Any:
    """``singleton`` (one running job per user and job name, the name being the run
    directory's) and the experiment's own dependency, both to be met. Slurm takes one kind of
    separator in a list: beside a ``?`` list (any one met) singleton is left out, and job-start's
    claim alone keeps a second job off the run."""
    given = config.experiment.resources.dependency
    if not given:
        return "singleton"
    return given if "?" in given or "singleton" in given.split(",") else f"singleton,{given}"


def _when_warned(value: Callable[[Config], Value]) -> Callable[[Config, Path], Any]:
    """An option only for a launcher that warns the workers, and so requeues (Slurm's)."""

    def when_warned(config: Config, run_dir: Path) -> Any:
        return ABSENT if launcher_for(config.site).warning_seconds is None else value(config)

    return when_warned


def _signal(config: Config) -> Value:
    # To the job steps (no "B:"): the workers get the warning, save and exit 75.
    return f"{config.site.preemption.signal}@{config.site.preemption.warning_seconds}"


_REQUEUE = "hpctf requeues preempted jobs itself (the site's preemption.max_requeues)"
_OUTPUT = "hpctf writes the job's output to the run directory"
_APPEND = "hpctf appends every start's output to the job's slurm-<job>.out in the run directory"
_CONTAINER = (
    "hpctf starts the workers in the site's container: set the site's `container:` "
    "(runtime, image, mounts, env)"
)
_CONTAINER_OPTIONS = (
    "container",
    "container-id",
    "container-image",
    "container-mounts",
    "container-name",
    "container-workdir",
    "container-env",
    "container-save",
    "container-mount-home",
    "no-container-mount-home",
    "container-remap-root",
    "no-container-remap-root",
    "container-entrypoint",
    "no-container-entrypoint",
    "container-entrypoint-log",
    "container-writable",
    "container-readonly",
)

# In the order they are rendered; the options that are never rendered come last.
OPTIONS: tuple[Option, ...] = (
    Option("job-name", ("name",), "set name", "J", lambda c, r: r.name),
    Option("nodes", ("resources", "nodes"), "set resources.nodes", "N", _nodes),
    Option(
        "no-kill",
        ("resources", "spare_nodes"),
        "set resources.spare_nodes: hpctf asks for --no-kill with spare nodes",
        "k",
        _no_kill,
    ),
    Option(
        "ntasks-per-node",
        ("resources", "tasks_per_node"),
        "set resources.tasks_per_node",
        value=_resource("tasks_per_node"),
    ),
    Option(
        "cpus-per-task",
        ("resources", "cpus_per_task"),
        "set resources.cpus_per_task",
        "c",
        _resource("cpus_per_task"),
    ),
    Option("time", ("resources", "time"), "set resources.time", "t", _resource("time")),
    Option(
        "partition",
        ("resources", "partition"),
        "set resources.partition",
        "p",
        _resource("partition"),
    ),
    Option("account", ("resources", "account"), "set resources.account", "A", _resource("account")),
    Option("qos", ("resources", "qos"), "set resources.qos", "q", _resource("qos")),
    Option(
        "constraint",
        ("resources", "constraint"),
        "set resources.constraint",
        "C",
        _resource("constraint"),
    ),
    Option(
        "reservation",
        ("resources", "reservation"),
        "set resources.reservation",
        value=_resource("reservation"),
    ),
    Option("mem", ("resources", "mem"), "set resources.mem", value=_resource("mem")),
    Option(
        "gpus-per-node",
        ("resources", "gpus_per_node"),
        "set resources.gpus_per_node",
        value=_gpus("gpus-per-node"),
    ),
    # Not managed: --gres asks for other resources too; a --gres that would replace hpctf's
    # gpu request is refused where the site asks for GPUs by gres (see the loader).
    Option("gres", ("resources", "gpus_per_node"), value=_gpus("gres")),
    Option("exclusive", ("resources", "exclusive"), "set resources.exclusive", value=_exclusive),
    Option("mail-type", ("resources", "mail_type"), "set resources.mail_type", value=_mail_type),
    Option(
        "mail-user",
        ("resources", "mail_user"),
        "set resources.mail_user",
        value=_mail_user,
    ),
    Option(
        "dependency",
        ("resources", "dependency"),
        "set resources.dependency",
        "d",
        _dependency,
    ),
    Option(
        "signal",
        ("preemption", "warning_seconds"),
        "hpctf owns the job's signals (set the site's preemption.signal)",
        value=_when_warned(_signal),
    ),
    Option("requeue", ("preemption", "max_requeues"), _REQUEUE, value=_when_warned(lambda c: None)),
    Option("output", ("run_dir",), _OUTPUT, "o", lambda c, r: f"{r}/logs/slurm-%j.out"),
    # Every start of a requeued job writes to the same file: appended, the earlier starts'
    # lines stay (Slurm truncates it at each start otherwise).
    Option("open-mode", None, _APPEND, value=lambda c, r: "append"),
    Option("ntasks", instead="set resources.nodes and resources.tasks_per_node", short="n"),
    Option("gpus", instead="set resources.gpus_per_node", short="G"),
    Option("gpus-per-task", instead="set resources.gpus_per_node"),
    # sbatch refuses these beside the --cpus-per-task and --ntasks-per-node hpctf always writes
    # (mutually exclusive options: the job would never be queued).
    Option(
        "cpus-per-gpu",
        instead="sbatch refuses it beside --cpus-per-task, which hpctf always writes; set "
        "resources.cpus_per_task (cores per GPU x GPUs per task)",
    ),
    Option(
        "ntasks-per-gpu",
        instead="sbatch refuses it beside --ntasks-per-node, which hpctf always writes; set "
        "resources.tasks_per_node",
    ),
    Option(
        "ntasks-per-tres",
        instead="sbatch refuses it beside --ntasks-per-node, which hpctf always writes; set "
        "resources.tasks_per_node",
    ),
    Option("error", instead=_OUTPUT, short="e"),
    Option("no-requeue", instead=_REQUEUE),
    # Rendered only for a sweep (hpctf sweep): one task per point, each with its run directory.
    Option("array", instead="use hpctf sweep: one array task per point", short="a"),
    Option("wrap", instead="the rendered script is the job"),
    Option("test-only", instead="use hpctf submit --dry-run"),
    Option("wait", instead="hpctf submit returns once the job is queued", short="W"),
    Option("export", instead="srun inside the script needs the job's environment"),
    # Containers: pyxis adds its srun options to sbatch too, and there they run the whole batch
    # script in the image, where scontrol (hpctf's requeue) and srun are usually missing
    # (https://github.com/NVIDIA/pyxis/wiki/Frequently-asked-questions); --container is
    # Slurm's own OCI bundle option. hpctf puts only the workers in the site's container.
    *(Option(flag, instead=_CONTAINER) for flag in _CONTAINER_OPTIONS),
    # The batch shell's contract: it runs in the directory and as the user hpctf submitted
    # from, with the environment sbatch gives it, and appends to the logs hpctf reads.
    Option("chdir", instead="the job runs where hpctf submitted it", short="D"),
    Option("uid", instead="the job runs as the user who submits it"),
    Option("gid", instead="the job runs as the user who submits it"),
    Option("get-user-env", instead="srun inside the script needs the job's environment"),
    Option("export-file", instead="set env in the experiment or site"),
    Option("open-mode", instead=_OUTPUT),
)

MANAGED: dict[str, str] = {o.flag: o.instead for o in OPTIONS if o.instead}
MANAGED_SHORT: dict[str, str] = {o.short: o.flag for o in OPTIONS if o.short}
EXPLAINED_BY: dict[str, KeyPath] = {o.flag: o.key for o in OPTIONS if o.key}


@dataclass(frozen=True)
class ArrayJob:
    """A sweep's job array: ``spec`` is sbatch's ``--array`` value (``0-2%2``); ``log_dir``
    holds the array's own output (each task then writes into its run directory)."""

    spec: str
    log_dir: Path


def rendered(
    config: Config, run_dir: Path, array: ArrayJob | None = None
) -> list[tuple[str, Value]]:
    """The ``#SBATCH`` options hpctf writes for ``config``, in the table's order; with
    ``array``, ``--array`` after the job name and one output file per task (``%A_%a``: the
    array and task, which name no run directory)."""
    options: list[tuple[str, Value]] = []
    for option in OPTIONS:
        value = option.value(config, run_dir)
        if array is not None and option.flag == "output":
            value = f"{array.log_dir}/slurm-%A_%a.out"
        if array is not None and option.flag == "job-name":
            value = config.experiment.name  # every task of the array carries it
        if array is not None and option.flag == "dependency":
            # Not singleton: the array's tasks share its name, and would run one at a time.
            value = config.experiment.resources.dependency or ABSENT
        if value is not ABSENT:
            options.append((option.flag, value))
        if array is not None and option.flag == "job-name":
            options.append(("array", array.spec))
    return options


# sbatch's short options that take a value (sbatch(1), Slurm 22.05). Any other letter takes
# none, so "-Hx" would be "-H -x": bundles are refused, one option per item.
_SHORT_WITH_VALUE = set("AaBbCcDdeFGiJLMmNnopqStwx")
# What sbatch reads as one argument of an #SBATCH line and nothing more: no whitespace (it
# splits there), no quotes or backslashes (it interprets those), no # (a comment), no $ or `
# (nothing expands there, but a reader would think it does).
SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:/=@%+?&|*\[\]()!^-]+$")
SBATCH_TOKEN_RULE = (
    "letters, digits and _.,:/=@%+?&|*[]()!^- only "
    "(no spaces, quotes, $, backquotes, backslashes or #)"
)


def option_name(token: str) -> str:
    """The long option's name in ``--name[=value]`` (``""`` for anything else)."""
    return token[2:].partition("=")[0] if token.startswith("--") else ""


def normalize_sbatch_option(item: str) -> str:
    """One ``extra_sbatch`` item as a single ``#SBATCH`` token, or ValueError saying why not.

    Accepts ``--name``, ``--name=value``, ``--name value``, ``-X``, ``-Xvalue`` and
    ``-X value``; returns ``--name[=value]`` or ``-X[value]``. Refuses the options in
    :data:`OPTIONS` that hpctf manages in every spelling (abbreviated, short, ``=`` or space).
    """
    parts = item.split()
    if len(parts) == 2 and "=" in parts[0]:
        raise ValueError(f"{item!r}: #SBATCH values cannot hold spaces")
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1].startswith("-")):
        raise ValueError(f"{item!r}: give one sbatch option per item, e.g. --gres-flags=enforce")
    for part in parts:
        if not SBATCH_TOKEN.fullmatch(part):
            raise ValueError(f"{item!r}: #SBATCH values may hold {SBATCH_TOKEN_RULE}")
    head = parts[0]
    if head.startswith("--"):
        name = option_name(head)
        if not re.fullmatch(r"^[a-z][a-z0-9-]*$", name):
            raise ValueError(f"{item!r}: {name!r} is not an sbatch option name")
        managed = sorted(m for m in MANAGED if m.startswith(name))
        if managed:
            full = name if name in managed else managed[0]
            raise ValueError(
                f"{item!r} would override --{full}, which hpctf manages: {MANAGED[full]}"
            )
        return f"--{name}={parts[1]}" if len(parts) == 2 else head
    if len(head) >= 2 and head[0] == "-" and head[1].isalpha():
        letter, rest = head[1], head[2:]
        if letter in MANAGED_SHORT:
            full = MANAGED_SHORT[letter]
            raise ValueError(f"{item!r} is --{full}, which hpctf manages: {MANAGED[full]}")
        value = rest or (parts[1] if len(parts) == 2 else "")
        if letter not in _SHORT_WITH_VALUE:
            if value:
                raise ValueError(f"{item!r}: -{letter} takes no value; one option per item")
            return head
        if not value:
            raise ValueError(f"{item!r}: -{letter} needs a value")
        return f"-{letter}{value}"
    raise ValueError(f"{item!r} is not an sbatch option (--name[=value] or -X [value])")
