"""A run directory's secrets in one file: ``RUN_DIR/secrets.env`` (0600).

``config.json`` holds every secret (:mod:`hpctf.core.secrets`) redacted: a secret ``env:``
value reads ``***``, the tracking URI ``http://alice:***@host``. The values are in
``secrets.env`` alone: one ``export NAME='value'`` line per secret ``env:`` entry (which the
batch script sources) and one unexported ``HPCTF_TRACKING_URI='...'`` line for a tracking URI
holding a password, and one unexported line per ``notify.webhook`` (:data:`WEBHOOK_VARS`).
:meth:`RunDir.load_config` puts them back (:func:`restore`) for whoever may
read ``secrets.env`` -- the run's owner: the worker, ``resubmit``, ``sweep``, ``render -o``;
anyone else reads the redacted config.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctf.core.safe_files import NotARegularFile, read_bounded, write_atomic
from hpctf.core.secrets import (
    REDACTED,
    SECRETS_FILE,
    redact,
    remember,
    reveal,
    secret_env,
    shell_file,
    uri_credentials,
)

if TYPE_CHECKING:  # the config's models (pydantic) are imported where a config is read:
    # `hpctf status` of runs already indexed reads none
    from hpctf.core.settings.config import ResolvedConfig

# secrets.env's name for the tracking URI: read back by restore(), never exported to the job.
TRACKING_URI_VAR = "HPCTF_TRACKING_URI"
# secrets.env's names for the notify: webhooks (a Slack or Teams URL is its own credential),
# the experiment's and the site's: read back by restore(), never exported to the job.
WEBHOOK_VARS = {"experiment": "HPCTF_NOTIFY_WEBHOOK", "site": "HPCTF_SITE_NOTIFY_WEBHOOK"}
UNEXPORTED = frozenset({TRACKING_URI_VAR, *WEBHOOK_VARS.values()})


def split(config: ResolvedConfig) -> tuple[ResolvedConfig, dict[str, str]]:
    """``config`` with its secrets redacted, and the secrets: ``{NAME: value}`` of the env's
    secret entries (site and experiment merged, as the job sees them), plus
    :data:`TRACKING_URI_VAR` when the tracking URI holds credentials. The env's secrets are
    of the secret type already, dumped as ``***``."""
    secrets = secret_env({**config.site.env, **config.experiment.env})
    experiment = config.experiment
    mlflow = config.experiment.tracking.mlflow
    if mlflow is not None and mlflow.tracking_uri and uri_credentials(mlflow.tracking_uri):
        secrets[TRACKING_URI_VAR] = mlflow.tracking_uri
        tracking = experiment.tracking.model_copy(
            update={
                "mlflow": mlflow.model_copy(update={"tracking_uri": redact(mlflow.tracking_uri)})
            }
        )
        experiment = experiment.model_copy(update={"tracking": tracking})
    experiment, site = _webhooks_swapped(
        experiment, config.site, lambda where, url: REDACTED, secrets
    )
    _remember(secrets)
    return config.model_copy(update={"site": site, "experiment": experiment}), secrets


def _remember(secrets: dict[str, str]) -> None:
    """From now on this process's redaction knows ``secrets``, and the credentials in them."""
    remember([*secrets.values(), *(c for v in secrets.values() for c in uri_credentials(v))])


def _webhooks_swapped(
    experiment: Any, site: Any, new: Callable[[str, str], str], found: dict[str, str] | None
) -> tuple[Any, Any]:
    """``experiment`` and ``site`` with each ``notify.webhook`` replaced by ``new(where,
    url)``; each URL kept in ``found`` (by :data:`WEBHOOK_VARS`' name) when given."""
    parts = {"experiment": experiment, "site": site}
    for where, part in parts.items():
        notify = part.notify
        if notify is None or not notify.webhook:
            continue
        if found is not None:
            found[WEBHOOK_VARS[where]] = notify.webhook
        swapped = notify.model_copy(update={"webhook": new(where, notify.webhook)})
        parts[where] = part.model_copy(update={"notify": swapped})
    return parts["experiment"], parts["site"]


def restore(config: ResolvedConfig, secrets: dict[str, str]) -> ResolvedConfig:
    """``config`` as read from ``config.json``, its redacted secrets put back from
    ``secrets`` (:func:`read`)."""
    if not secrets:
        return config

    from hpctf.core.settings.values import Secret

    _remember(secrets)

    def back(env: dict[str, Any]) -> dict[str, Any]:
        return {
            k: Secret(secrets[k]) if reveal(v) == REDACTED and k in secrets else v
            for k, v in env.items()
        }

    experiment = config.experiment.model_copy(update={"env": back(config.experiment.env)})
    mlflow = experiment.tracking.mlflow
    if mlflow is not None and TRACKING_URI_VAR in secrets:
        tracking = experiment.tracking.model_copy(
            update={"mlflow": mlflow.model_copy(update={"tracking_uri": secrets[TRACKING_URI_VAR]})}
        )
        experiment = experiment.model_copy(update={"tracking": tracking})
    site = config.site.model_copy(update={"env": back(config.site.env)})
    experiment, site = _webhooks_swapped(
        experiment, site, lambda where, url: secrets.get(WEBHOOK_VARS[where], url), None
    )
    return config.model_copy(update={"site": site, "experiment": experiment})


def text(secrets: dict[str, str]) -> str:
    """``secrets.env``'s text for ``secrets`` (:func:`split`'s)."""
    exported = {k: v for k, v in secrets.items() if k not in UNEXPORTED}
    out = shell_file(exported)
    for name in sorted(UNEXPORTED & set(secrets)):
        out += f"{name}={shlex.quote(secrets[name])}\n"
    return out


def read(run_path: Path) -> dict[str, str]:
    """The secrets in ``run_path/secrets.env``; {} when there is none or it is not ours to read
    (another user's run: its config stays redacted)."""
    try:
        data = read_bounded(run_path / SECRETS_FILE, 1 << 20, SECRETS_FILE)
        lines = data.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError, NotARegularFile):
        return {}
    found: dict[str, str] = {}
    for line in lines:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words and words[0] == "export":
            words = words[1:]
        if len(words) == 1 and "=" in words[0]:
            name, _, value = words[0].partition("=")
            found[name] = value
    return found


def write_frozen(run_path: Path, config: ResolvedConfig) -> None:
    """Write ``config`` as the run's ``config.json`` (0600), redacted, and its secrets, when it
    has any, to ``secrets.env`` (0600) first: the config is never there without them."""
    redacted, secrets = split(config)
    if secrets:
        write_atomic(run_path / SECRETS_FILE, text(secrets), mode=0o600)
    write_atomic(run_path / "config.json", redacted.model_dump_json(indent=2))
