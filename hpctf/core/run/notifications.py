"""``notify:``'s webhook: one message per event a run's owner asked for (done, failed,
gave_up, budget_exhausted), sent by whoever ends a start (``hpctf job-end``, ``job-start``
when the budgets say no, the local launcher), after the end is recorded and only when no
requeue follows.

Once per event: each message sent is recorded in the run's journal (``notified``, with the
start it is about), and a retried job-end finds it there. Never in the way: a receiver that
is down, slow, dribbling or redirecting costs at most :data:`TIMEOUT_S` in all and one warning
line on stderr, and nothing is recorded (a later job-end of the same start tries again). The
URL is a secret (:mod:`hpctf.core.run.secret_store`): no line names more of it than its host.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hpctf.core.printable import printable
from hpctf.core.run import journal
from hpctf.core.run.history import RunStatus, read_history
from hpctf.core.run.rundir import RunDir
from hpctf.core.secrets import redact
from hpctf.core.settings.notify import NotifyEvent, notify_of

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

# Seconds one message may take: a batch shell that ends a job waits no longer.
TIMEOUT_S = 5.0

# The run's states after an end that its owner may want to hear of, and their events.
_FINAL: dict[RunStatus, NotifyEvent] = {
    RunStatus.DONE: "done",
    RunStatus.FAILED: "failed",
    RunStatus.GAVE_UP: "gave_up",
}
# Words of runstate's why for a run that gave up because a requeue budget is spent
# (hpctf.core.run.history.runstate.after_end and before_start).
_BUDGET_WORDS = ("requeues used of", "over the budget of")

Post = Callable[[str, bytes, float], None]


def event_of(state: RunStatus, why: str) -> NotifyEvent | None:
    """The notify event for a run in ``state`` (``why``: runstate's reason), or None."""
    if state == RunStatus.GAVE_UP and any(words in why for words in _BUDGET_WORDS):
        return "budget_exhausted"
    return _FINAL.get(state)


def wanted(event: str, on: Sequence[str]) -> bool:
    """Whether ``event`` is one the owner picked: ``gave_up`` covers ``budget_exhausted``."""
    return event in on or (event == "budget_exhausted" and _FINAL[RunStatus.GAVE_UP] in on)


def message(run_name: str, run_dir: str, event: str, why: str) -> dict[str, Any]:
    """The JSON a webhook gets: ``text`` for Slack, Teams and Mattermost, and the fields."""
    why = redact(why)  # the team's chat: a user exception's line may quote a token
    said = f"hpctf: run {run_name} {event.replace('_', ' ')}" + (f": {why}" if why else "")
    return {"text": said, "run": run_name, "run_dir": run_dir, "event": event, "why": why}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is no delivery: urllib would follow a 302 as a GET without the message and
    count it sent."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        raise urllib.error.HTTPError(
            req.full_url,
            code,
            f"redirected ({code}): give notify.webhook the address it redirects to",
            headers,
            fp,
        )


def post_json(url: str, body: bytes, timeout: float) -> None:
    """POST ``body`` (JSON) to ``url``; raise OSError (URLError, HTTPError, TimeoutError) when
    it does not answer 2xx within ``timeout`` seconds in all: connect, send and read together.
    urllib's own timeout bounds each socket operation, not the whole, so a receiver that
    dribbles a byte every few seconds held job-end (and the job's node) for 15 minutes; the
    request runs in a thread of its own that the caller stops waiting for (a daemon thread:
    the process leaves without it). Redirects are refused, not followed."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(_NoRedirect)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            with opener.open(request, timeout=timeout) as response:
                response.read(1024)
            outcome.append(None)
        except BaseException as exc:  # given to the caller's thread, raised there
            outcome.append(exc)

    thread = threading.Thread(target=send, name="hpctf-notify", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        raise TimeoutError(f"no whole answer within {timeout:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def notify_end(
    run: RunDir,
    config: ResolvedConfig,
    job_id: str,
    post: Post = post_json,
    err: IO[str] | None = None,
    timeout: float = TIMEOUT_S,
) -> str | None:
    """Tell the run's owner how the start that just ended left the run, when ``notify:`` has
    a webhook and asked for that event and no message for it and this start went out before;
    return the event sent, else None."""
    notify = notify_of(config)
    if notify is None or not notify.webhook:
        return None
    history = read_history(run)
    state = history.state
    event = event_of(state.state, state.why)
    if event is None or not wanted(event, notify.on):
        return None
    start = len(state.starts)
    if history.notified(event, start):
        return None
    body = json.dumps(message(run.path.name, str(run.path), event, state.why)).encode()
    try:
        post(notify.webhook, body, timeout)
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors
        host = urlsplit(notify.webhook).hostname or "?"
        why = getattr(exc, "reason", None) or exc.__class__.__name__
        line = f"hpctf: warning: notify: {event} not sent to {host}: {why}"
        print(printable(line, keep_lines=False), file=err or sys.stderr)
        return None
    journal.record_notified(run, job_id, event, start, "webhook")
    return event
