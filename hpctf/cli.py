"""The command line: one click group holding the commands of both wings, and the one place
where errors are turned into what the user sees, by whose fault they are:

- UserError: ``Error: <what was wrong and what is allowed>``, one line per problem, exit 2;
- EnvironmentProblem (Slurm down, slow or missing, a full disk, a damaged journal, a rank that
  could not join): ``Error: <what failed> (cause: ...)``, one line, exit 3;
- anything else is hpctf's bug: the traceback and a line asking to report it, exit 70.

Each room of a wing brings its commands: :mod:`hpctf.login.submitting` (init to resubmit),
:mod:`hpctf.login.watching` (status, runs, logs, cancel, plot), :mod:`hpctf.login.sweeps`,
:mod:`hpctf.login.doctor`, :mod:`hpctf.login.dashboard` (ui); the batch script's hooks come from
:mod:`hpctf.batch`, the compute-node ones from :mod:`hpctf.compute.worker_commands`. They are
added when first asked for: a compute-node command imports only the compute wing's commands
(see :data:`COMPUTE`), and ``status`` and ``runs`` only their own module (see :data:`ALONE`).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

import click

from hpctf.core.errors import BUG_EXIT, EnvironmentProblem, UserError, environment_line
from hpctf.core.printable import printable
from hpctf.core.secrets import redact

# The commands every task of a job runs (`srun hpctf worker` on each): they need neither the
# login wing nor the batch hooks, whose imports (jinja2, sweeps, doctor, ...: 69 modules, about
# 0.05 s of CPU) each task would otherwise pay before its first step, and at 4,000 tasks read
# from the shared filesystem at once.
COMPUTE = ("worker", "tfconfig", "preflight")


class _UserFailure(click.ClickException):
    """Shown by click as ``Error: message`` on stderr."""

    exit_code = UserError.exit_code


class _EnvironmentFailure(click.ClickException):
    exit_code = EnvironmentProblem.exit_code


# Login commands that need no other command's module, and theirs: `hpctf status` of a
# 1,000-point sweep from a cold page cache was mostly reading the modules of every other
# command (pydantic's models, jinja2, yaml) from disk.
ALONE = {"status": "hpctf.login.watching.status", "runs": "hpctf.login.watching.status"}


class _Group(click.Group):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            if cmd_name in ALONE:
                command = getattr(importlib.import_module(ALONE[cmd_name]), cmd_name)
                cli.add_command(command)
            else:
                _add_commands(every=cmd_name not in COMPUTE)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _add_commands(every=True)
        return super().list_commands(ctx)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise _UserFailure(printable(redact(str(exc)))) from None
        except EnvironmentProblem as exc:
            raise _EnvironmentFailure(printable(redact(environment_line(exc)))) from exc


@click.group(cls=_Group)
@click.version_option(package_name="hpctf")
def cli() -> None:
    """From one experiment.yaml to multi-node TensorFlow training on Slurm."""


def _add_commands(every: bool) -> None:
    """Add the compute-node commands to :func:`cli`; with ``every``, all the others too."""
    from hpctf.compute import worker_commands as compute_commands

    found: list[click.Command] = list(compute_commands.COMMANDS)
    if every:
        from hpctf.batch import job_commands as batch
        from hpctf.batch import search_agent
        from hpctf.login.dashboard import ui_command
        from hpctf.login.doctor.doctor_commands import doctor
        from hpctf.login.remote import cluster_side
        from hpctf.login.submitting import submit_commands as submitting
        from hpctf.login.sweeps.resubmit_command import resubmit
        from hpctf.login.sweeps.start import sweep
        from hpctf.login.watching import cancel, logs, plot, status

        found = [
            *submitting.COMMANDS,
            resubmit,
            sweep,
            doctor,
            *status.COMMANDS,
            logs.logs,
            cancel.cancel,
            plot.plot,
            *ui_command.COMMANDS,
            *batch.COMMANDS,
            *search_agent.COMMANDS,
            *cluster_side.COMMANDS,
            *found,
        ]
    for command in found:
        if command.name not in cli.commands:
            cli.add_command(command)


def _command_named(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    if command is None:
        raise AssertionError(f"no command {name!r}")
    return command


def _over_ssh(args: list[str]) -> list[str]:
    """The SSH path (:mod:`hpctf.login.remote`): on the cluster, ``_remote SITE_JSON ARGS``
    becomes ARGS with the laptop's site known; on a laptop, a command whose site is behind
    SSH runs on the cluster and exits with its status. The arguments to run here, if any."""
    if args[:1] == ["_remote"] and len(args) > 1:
        from hpctf.login.remote.site_file import enter

        enter(args[1], os.environ)
        return args[2:]
    if args and args[0] not in COMPUTE:
        from hpctf.login.remote.forward import COMMANDS, forwarded

        status = forwarded(args, os.environ, _command_named) if args[0] in COMMANDS else None
        if status is not None:
            sys.exit(status)
    return args


def main() -> None:
    try:
        try:
            args = _over_ssh(sys.argv[1:])
        except UserError as exc:
            raise _UserFailure(printable(redact(str(exc)))) from None
        except EnvironmentProblem as exc:
            raise _EnvironmentFailure(printable(redact(str(exc)))) from exc
        cli(args=args, prog_name="hpctf")
    except click.ClickException as failure:
        failure.show()
        sys.exit(failure.exit_code)
    except Exception:
        traceback.print_exc()
        click.echo(
            "hpctf: the error above is a bug in hpctf, not in your input or your cluster; "
            "please report it with the command you ran and this output",
            err=True,
        )
        sys.exit(BUG_EXIT)
