"""The typed command layer (hpctf/login/calls): requests and answers as models, one table of
functions the Python API calls here and ``hpctf _call`` answers on a login host, and whose
fault a failure is, kept across the wire. The SSH path itself: tests/test_remote.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

import hpctf
from hpctf.cli import cli
from hpctf.core.run.history import RunStatus
from hpctf.core.settings.sites import read_site
from hpctf.login.calls.models import Answer, Call, CancelRequest, LogsRequest, StatusRequest
from hpctf.login.calls.table import RESULTS
from hpctf.login.remote.site_file import site_document
from tests.conftest import REPO, write
from tests.fake_slurm import FakeSlurm, new_run, squeue_line

DIGITS = REPO / "examples" / "digits" / "experiment.yaml"


def _site() -> dict[str, Any]:
    return site_document(read_site("local-slurm", {})[0])


def _call(request: Any) -> tuple[int, Answer, str]:
    """``hpctf _call`` with ``request`` on stdin: exit status, answer, stderr."""
    text = request if isinstance(request, str) else Call(site=_site(), request=request)
    data = text if isinstance(text, str) else text.model_dump_json()
    result = CliRunner().invoke(cli, ["_call"], input=data)
    return result.exit_code, Answer.model_validate_json(result.stdout), result.stderr


@pytest.fixture
def queued_run(tmp_path: Path, runs_root: Path, fake_sbatch: Path) -> Path:
    data = yaml.safe_load(DIGITS.read_text())
    data["train"]["python_path"] = [str(DIGITS.parent)]
    experiment = write(tmp_path / "exp" / "experiment.yaml", yaml.safe_dump(data))
    run = hpctf.submit(experiment, site="local-slurm")
    return Path(run.path)


def test_a_request_round_trips_and_names_its_command() -> None:
    call = Call(site={"site": {"name": "x"}}, request=LogsRequest(run_dir="/r", rank=1))
    again = Call.model_validate_json(call.model_dump_json())
    assert again == call and again.request.command == "logs"
    assert set(RESULTS) == {
        "status", "cancel", "resubmit", "metrics", "logs", "sweep",
        "runs_page", "run_page", "sweep_page",  # hpctf ui's pages
    }  # fmt: skip
    with pytest.raises(ValidationError):
        Call.model_validate({"site": {}, "request": {"command": "rm", "run_dir": "/"}})
    with pytest.raises(ValidationError):
        StatusRequest(run_dirs=[])


def test_the_status_of_a_queued_run_is_a_typed_answer(queued_run: Path) -> None:
    status, answer, _ = _call(StatusRequest(run_dirs=[str(queued_run)]))
    assert status == 0 and answer.failure is None and answer.result is not None
    result = RESULTS["status"].model_validate(answer.result)
    document = result.runs[0]  # type: ignore[union-attr]
    assert document["state"] == RunStatus.QUEUED and document["job"] == "4242"
    assert hpctf.run(queued_run).state is RunStatus.QUEUED


def test_a_users_mistake_there_is_a_user_failure_in_one_line(tmp_path: Path) -> None:
    status, answer, _ = _call(LogsRequest(run_dir=str(tmp_path)))
    assert status == 2 and answer.result is None and answer.failure is not None
    assert answer.failure.kind == "user" and "\n" not in answer.failure.message
    assert (
        "not a run directory" in answer.failure.message or str(tmp_path) in answer.failure.message
    )


def test_a_request_hpctf_did_not_send_is_refused_with_an_answer() -> None:
    for raw in ("", "{", json.dumps({"site": {}, "request": {"command": "cancel"}})):
        status, answer, _ = _call(raw)
        assert status == 2 and answer.failure is not None
        assert answer.failure.message.startswith("_call: not a request hpctf sent")


def test_a_cancel_is_typed_and_its_words_stay_off_the_answer(
    runs_root: Path, fake_slurm: FakeSlurm
) -> None:
    """The cancelled job comes back as data, the run's state as a member; what the command
    says to a person goes to stderr (stdout holds the one JSON document)."""
    run = new_run(runs_root, fake_slurm)
    fake_slurm.answer("squeue", squeue_line("4242", "PENDING"))
    status, answer, _ = _call(CancelRequest(run_dir=str(run)))
    assert status == 0 and answer.result is not None, answer
    cancelled = RESULTS["cancel"].model_validate(answer.result)
    assert cancelled.jobs == ["4242"] and cancelled.state is RunStatus.CANCELLED  # type: ignore[union-attr]
    assert any("4242" in call for call in fake_slurm.calls("scancel"))


def test_a_call_of_a_newer_hpctf_is_refused_naming_both_versions() -> None:
    call = Call(site=_site(), request=StatusRequest(run_dirs=["/r"]))
    status, answer, _ = _call(call.model_copy(update={"version": 99}).model_dump_json())
    assert status == 3 and answer.failure is not None and answer.failure.kind == "environment"
    assert (
        "call version 99" in answer.failure.message
        and "same hpctf version" in answer.failure.message
    )
