"""Secrets in a config, and keeping them out of what others can read.

Two kinds: the password of a URI's userinfo (``tracking.mlflow.tracking_uri:
http://alice:SECRET@host``) and the value of an ``env:`` entry whose name says it is one
(:func:`is_secret_name`: ``*_TOKEN``, ``*_KEY``, ``*_PASSWORD``, ``*_SECRET``...). Where they go:

- log lines, error lines, tracker parameters and ``status``: redacted (:func:`redact`),
  ``http://alice:***@host``;
- the batch script (``job.sbatch``, ``render -o``): never; it sources ``RUN_DIR/secrets.env``
  (mode 0600, :data:`SECRETS_FILE`), the one file of the run directory that holds them:
  ``config.json`` holds them redacted and whoever reads it as the run's owner gets them back
  from there (:mod:`hpctf.core.run.secret_store`);
- the code snapshot: a copied file holding one has it replaced by ``***``; a Python source
  holding one is kept, made 0400 (owner only), and named at submit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

SECRETS_FILE = "secrets.env"
REDACTED = "***"

# Names of environment variables whose values are secrets (case-insensitive): a name that is
# or ends in one of these words. AWS_SECRET_ACCESS_KEY, HF_TOKEN, WANDB_API_KEY, DB_PASSWORD.
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|KEY|PASSWORD|PASSWD|PASS|SECRET|CREDENTIALS?)$", re.IGNORECASE
)
# scheme://user:password@ -- the password is what goes.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):(?P<password>[^/@\s]*)@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable called ``name`` holds a secret, by its name."""
    return bool(_SECRET_NAME.search(name))


def uri_passwords(text: str) -> list[str]:
    """The passwords in the userinfo of every URI in ``text``."""
    return [m.group("password") for m in _USERINFO.finditer(text) if m.group("password")]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URI's password and each of ``secrets`` replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def secret_env(env: Mapping[str, str]) -> dict[str, str]:
    """The entries of ``env`` that are secrets (by name, or a URI holding a password)."""
    return {k: v for k, v in env.items() if is_secret_name(k) or uri_passwords(v)}


def shell_file(secrets: Mapping[str, str]) -> str:
    """``secrets.env``'s text: one ``export NAME='value'`` line per secret, for ``.`` in the
    batch script."""
    lines = ["# hpctf: the secrets of this run's env:, read by job.sbatch; mode 0600"]
    for name, value in sorted(secrets.items()):
        quoted = "'" + value.replace("'", "'\"'\"'") + "'"
        lines.append(f"export {name}={quoted}")
    return "\n".join(lines) + "\n"
