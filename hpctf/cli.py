"""The command line: one click group holding the commands of both wings, and the one place
where errors are turned into what the user sees, by whose fault they are:

- UserError: ``Error: <what was wrong and what is allowed>``, one line per problem, exit 2;
- EnvironmentProblem (Slurm down or slow, a full disk): ``Error: <what failed>``, exit 3;
- anything else is hpctf's bug: the traceback and a line asking to report it, exit 70.

Each room of a wing brings its commands: :mod:`hpctf.login.submitting` (init to resubmit),
:mod:`hpctf.login.watching` (status, runs, logs, cancel, plot), :mod:`hpctf.login.sweeps`,
:mod:`hpctf.login.doctor`; the batch script's hooks come from :mod:`hpctf.batch`, the
compute-node ones from :mod:`hpctf.compute.commands`.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from hpctf.batch import commands as batch
from hpctf.compute import commands as compute_commands
from hpctf.core.errors import BUG_EXIT, EnvironmentProblem, UserError
from hpctf.login.doctor.commands import doctor
from hpctf.login.submitting import commands as submitting
from hpctf.login.sweeps.start import sweep
from hpctf.login.watching import cancel, logs, plot, status


class _UserFailure(click.ClickException):
    """Shown by click as ``Error: message`` on stderr."""

    exit_code = UserError.exit_code


class _EnvironmentFailure(click.ClickException):
    exit_code = EnvironmentProblem.exit_code


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise _UserFailure(str(exc)) from None
        except EnvironmentProblem as exc:
            raise _EnvironmentFailure(str(exc)) from exc


@click.group(cls=_Group)
@click.version_option(package_name="hpctf")
def cli() -> None:
    """From one experiment.yaml to multi-node TensorFlow training on Slurm."""


for _command in (
    *submitting.COMMANDS,
    sweep,
    doctor,
    *status.COMMANDS,
    logs.logs,
    cancel.cancel,
    plot.plot,
    *batch.COMMANDS,
    *compute_commands.COMMANDS,
):
    cli.add_command(_command)


def main() -> None:
    try:
        cli(prog_name="hpctf")
    except Exception:
        traceback.print_exc()
        click.echo(
            "hpctf: the error above is a bug in hpctf, not in your input or your cluster; "
            "please report it with the command you ran and this output",
            err=True,
        )
        sys.exit(BUG_EXIT)
