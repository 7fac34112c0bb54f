"""A typed call (:mod:`hpctf.login.calls`) sent to the login host of a site behind SSH, and
answered there: the request and the laptop's site on ssh's standard input (an argument vector
is what ``ps`` shows every user of both hosts), the answer one JSON document on its standard
output, the command's own words on its standard error."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click
from pydantic import ValidationError

from hpctf.core.errors import EnvironmentProblem, UserError, environment_line
from hpctf.core.secrets import redact
from hpctf.core.settings.config import Site
from hpctf.login.calls.models import VERSION, Answer, Call, Failure, Request, Result
from hpctf.login.remote.site_file import enter, site_document
from hpctf.login.remote.ssh import Connection

# A call is a few paths and options: more is no request hpctf sent.
MAX_CALL_BYTES = 1 << 20


def remote_call(connection: Connection, site: Site, request: Request) -> Result:
    """Run ``request`` on ``connection``'s login host with ``site`` known there; its result,
    or the UserError or EnvironmentProblem it failed with there."""
    from hpctf.login.calls.table import RESULTS

    call = Call(site=site_document(site), request=request)
    proc = connection.run(["_call"], stdin=call.model_dump_json().encode(), capture=True)
    host = connection.login.host
    try:
        answer = Answer.model_validate_json(proc.stdout)
    except ValidationError:
        said = proc.stderr.strip().splitlines()[-1:] or ["no message"]
        raise EnvironmentProblem(
            f"{host}: hpctf _call exited {proc.returncode} without an answer ({said[0]}); is "
            "hpctf there as new as here? (hpctf --version on both)"
        ) from None
    if answer.failure is not None:
        if answer.failure.kind == "user":
            raise UserError(f"{host}: {answer.failure.message}")
        raise EnvironmentProblem(f"{host}: {answer.failure.message}")
    return RESULTS[request.command].model_validate(answer.result)


@click.command("_call", hidden=True)
def call_command() -> None:
    """Answer the typed call on stdin (:func:`remote_call`) with one JSON document on stdout:
    its result, or what failed (exit 2: the user's input; 3: the environment)."""
    read = _read_call(sys.stdin.buffer.read(MAX_CALL_BYTES))
    failure, result = (read, None) if isinstance(read, Failure) else _answered(read)
    document = Answer(
        result=None if result is None else result.model_dump(mode="json"), failure=failure
    )
    click.echo(document.model_dump_json())
    if failure is not None:
        sys.exit(UserError.exit_code if failure.kind == "user" else EnvironmentProblem.exit_code)


def _read_call(data: bytes) -> Call | Failure:
    """The call in ``data``, or why it is none this hpctf answers."""
    try:
        call = Call.model_validate_json(data)
    except ValidationError as exc:
        said = exc.errors()[0]["msg"]
        return Failure(kind="user", message=f"_call: not a request hpctf sent ({said})")
    if call.version > VERSION:
        return Failure(
            kind="environment",
            message=f"the request is of call version {call.version}, this hpctf answers "
            f"{VERSION}: install the same hpctf version on both machines",
        )
    return call


def _answered(call: Call) -> tuple[Failure | None, Result | None]:
    """``call`` answered here, with the laptop's site known: its result, or whose fault its
    failure was (redacted: the answer travels back over SSH to a terminal)."""
    from hpctf.login.calls.table import answer

    enter(json.dumps(call.site, sort_keys=True), os.environ)
    # The command's own words (notes, warnings) are for the user, not the answer.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            return None, answer(call.request)
        except UserError as exc:
            return Failure(kind="user", message=redact(str(exc))), None
        except EnvironmentProblem as exc:
            return Failure(kind="environment", message=redact(environment_line(exc))), None
