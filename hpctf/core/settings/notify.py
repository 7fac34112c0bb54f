"""``notify:`` in an experiment or a site: a message when a run needs its owner.

Events (``on``): ``done``, ``failed``, ``gave_up`` (hpctf will not requeue it: a budget spent,
or a fault only a fix can clear) and ``budget_exhausted`` (the narrower case of ``gave_up``: a
requeue budget spent). Ways: ``email`` (Slurm's own mail: ``--mail-user`` and ``--mail-type``
rendered into the script, :mod:`hpctf.core.settings.sbatch_options`) and ``webhook`` (a URL
for Slack, Teams or Mattermost, a secret: ``config.json`` holds it redacted, ``secrets.env``
its value, :mod:`hpctf.core.run.secret_store`). The experiment's ``notify:`` replaces the
site's as a whole. Sending: :mod:`hpctf.core.run.notifications`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field

from hpctf.core.secrets import REDACTED
from hpctf.core.settings.values import MailUser, MarkableText, Strict

NotifyEvent = Literal["done", "failed", "gave_up", "budget_exhausted"]
DEFAULT_EVENTS: tuple[NotifyEvent, ...] = ("done", "failed", "gave_up")

# The Slurm mail types that stand for each event (sbatch(1), --mail-type): Slurm mails when
# the job ends (END) or fails (FAIL); a run that gave up ends its job with a failure.
MAIL_TYPES: dict[str, str] = {
    "done": "END",
    "failed": "FAIL",
    "gave_up": "FAIL",
    "budget_exhausted": "FAIL",
}


def _events(value: Any) -> Any:
    """``on: done,failed`` and ``on: [done, failed]`` mean the same; case is ignored."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list):
        return [v.lower() if isinstance(v, str) else v for v in value]
    return value


def _webhook(value: str) -> str:
    if value == REDACTED:  # config.json's: the value is in secrets.env
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an https:// (or http://) URL with a host")
    if any(c.isspace() for c in value):
        raise ValueError("must not hold spaces")
    return value


WebhookUrl = Annotated[MarkableText, AfterValidator(_webhook)]


class Notify(Strict):
    """Who is told, how, and of which events."""

    email: MailUser | None = Field(None, description="Slurm mails this address (--mail-user)")
    webhook: WebhookUrl | None = Field(
        None, description="https URL that gets a JSON {text} message per event; kept as a secret"
    )
    on: Annotated[list[NotifyEvent], BeforeValidator(_events)] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description="events: done, failed, gave_up, budget_exhausted",
        min_length=1,
    )


def notify_of(config: Any) -> Notify | None:
    """The run's ``notify:``: the experiment's, else the site's (``config`` a
    :class:`hpctf.core.settings.config.ResolvedConfig`)."""
    given: Notify | None = config.experiment.notify or config.site.notify
    return given


def mail_types(notify: Notify | None) -> list[str]:
    """The Slurm mail types for ``notify``'s events when it has an ``email``, in Slurm's order."""
    if notify is None or notify.email is None:
        return []
    return sorted({MAIL_TYPES[event] for event in notify.on})
