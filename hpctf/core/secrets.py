"""Secrets in a config, and keeping them out of what others can read.

A value is a secret because its file says so or because a rule finds it, and from the parse on
it is a secret *type* (:class:`hpctf.core.settings.values.Secret`, a pydantic ``SecretStr``
that prints and serialises as ``***``):

- marked: ``env: {DB_CONN: !secret "host=db password=..."}`` or, where a YAML tag cannot be
  written (``--set``, JSON), ``{secret: "..."}``;
- by rule (:func:`is_secret_name`, :func:`uri_credentials`): an ``env:`` name with a word
  that names a credential (``HF_TOKEN_PRIMARY``, ``MY_APIKEY``, ``SLACK_WEBHOOK_URL``,
  ``DB_PASSWORD``...), and any URI's credentials (``scheme://user:password@`` -- a password
  holding ``@`` too -- and ``scheme://TOKEN@``), in any value.

Where they go:

- every line hpctf writes where others may read it -- rank logs (the user's own tracebacks
  too), the journal, error lines, webhook messages, tracker parameters, ``status`` -- passes
  :func:`redact`, which knows every secret value this process has met (:func:`remember`: the
  run's, once its config is read), so a value quoted in an exception's text goes too;
- the batch script (``job.sbatch``, ``render -o``): never; it sources ``RUN_DIR/secrets.env``
  (mode 0600, :data:`SECRETS_FILE`), the one file of the run directory that holds them:
  ``config.json`` holds them redacted and whoever reads it as the run's owner gets them back
  from there (:mod:`hpctf.core.run.secret_store`);
- the code snapshot: a copied file holding one has it replaced by ``***``; a Python source
  holding one is kept, made 0400 (owner only), and named at submit.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

SECRETS_FILE = "secrets.env"
REDACTED = "***"
# The key of the mark written without a YAML tag: ``{secret: "value"}`` (``!secret`` loads
# as this too, hpctf.core.settings.sources).
MARK = "secret"
# A secret shorter than this is not redacted by value: replacing every "ab" of a log would
# say nothing and hide everything (it is still never written to a file others read). Nor is a
# value no credential has (a name rule's false find, USE_AUTH=true): every "true" of a log
# would go.
MIN_REDACTED_LENGTH = 4
_NO_CREDENTIAL = re.compile(r"(?i:true|false|yes|no|none|null|on|off)|\d{1,7}")

# A word of an environment variable's name (split at "_", case-insensitive) that says its
# value is a credential: AWS_SECRET_ACCESS_KEY, HF_TOKEN_PRIMARY, WANDB_API_KEY, MY_APIKEY,
# DB_PASSWORD, SLACK_WEBHOOK_URL, GITHUB_PAT, AZURE_CLIENT_CREDENTIALS.
# A name found by a word that is no credential only costs redaction of its value in logs.
_SECRET_WORD = re.compile(
    r"[A-Z]*(?:KEY|TOKEN)|PASSWORD|PASSWD|PASS|SECRET|CREDENTIALS?|WEBHOOK|PAT|AUTH",
    re.IGNORECASE,
)
# Words ending in KEY or TOKEN that are no credential.
_NOT_SECRET_WORDS = frozenset({"MONKEY", "HOCKEY", "TURKEY", "JOCKEY", "DONKEY", "WHISKEY"})
# scheme://userinfo@ -- the userinfo runs to the last "@" before the path, so a password
# holding "@" is all of it; user:password keeps the user, a lone token goes whole.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*)@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable called ``name`` holds a secret, by its name."""
    return any(
        _SECRET_WORD.fullmatch(word) and word.upper() not in _NOT_SECRET_WORDS
        for word in name.split("_")
    )


def uri_credentials(text: str) -> list[str]:
    """The credentials in the userinfo of every URI in ``text``: the password of
    ``user:password@``, the whole of ``token@``."""
    found = []
    for match in _USERINFO.finditer(text):
        user, colon, password = match.group("userinfo").partition(":")
        secret = password if colon else user
        if secret:
            found.append(secret)
    return found


def _redacted_userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match.group("userinfo").partition(":")
    kept = f"{user}:{REDACTED}" if colon else REDACTED
    return f"{match.group('scheme')}{kept}@"


def _redactable(value: str) -> bool:
    return len(value) >= MIN_REDACTED_LENGTH and not _NO_CREDENTIAL.fullmatch(value)


_known: set[str] = set()
# The known values longest first (a secret holding another goes whole), made once per
# remember: redact runs on every line a worker writes.
_ordered: tuple[str, ...] = ()
_known_lock = threading.Lock()


def remember(values: Iterable[str]) -> None:
    """Make :func:`redact` replace each of ``values`` in this process from now on (a run's
    secrets, once its config is read)."""
    global _ordered
    with _known_lock:
        _known.update(v for v in values if _redactable(v))
        _ordered = tuple(sorted(_known, key=len, reverse=True))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URI's credentials, each secret :func:`remember`-ed and each of
    ``secrets`` replaced by ``***``."""
    text = _USERINFO.sub(_redacted_userinfo, text)
    extra = {s for s in secrets if _redactable(s)}
    known = _ordered
    values = sorted({*known, *extra}, key=len, reverse=True) if extra else known
    for secret in values:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_data(value: Any) -> Any:
    """``value`` (JSON-like data: a record about to be written where others may read it) with
    every string in it :func:`redact`-ed."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item) for item in value]
    return value


def is_secret(value: Any) -> bool:
    """Whether ``value`` is of the secret type (a pydantic ``SecretStr``; duck-typed so that
    this module, imported by every command, does not import pydantic)."""
    return callable(getattr(value, "get_secret_value", None))


def reveal(value: Any) -> str:
    """The text of ``value``, a secret or a plain string: for the one place that needs it (a
    process's environment, secrets.env)."""
    return str(value.get_secret_value()) if is_secret(value) else str(value)


def plain_env(env: Mapping[str, Any]) -> dict[str, str]:
    """``env`` as the process it is given to sees it: every value revealed."""
    return {name: reveal(value) for name, value in env.items()}


def public_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The entries of a validated ``env:`` that are not secrets."""
    return {name: str(value) for name, value in env.items() if not is_secret(value)}


def secret_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The entries of a validated ``env:`` that are secrets, revealed."""
    return {name: reveal(value) for name, value in env.items() if is_secret(value)}


def is_secret_entry(name: str, value: str) -> bool:
    """Whether an ``env:`` entry left unmarked is a secret by rule: its name, or a URI's
    credentials in its value (decided once, where the config is validated)."""
    return is_secret_name(name) or bool(uri_credentials(value))


def shell_file(secrets: Mapping[str, str]) -> str:
    """``secrets.env``'s text: one ``export NAME='value'`` line per secret, for ``.`` in the
    batch script."""
    lines = ["# hpctf: the secrets of this run's env:, read by job.sbatch; mode 0600"]
    for name, value in sorted(secrets.items()):
        quoted = "'" + value.replace("'", "'\"'\"'") + "'"
        lines.append(f"export {name}={quoted}")
    return "\n".join(lines) + "\n"
