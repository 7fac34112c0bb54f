"""The laptop's site as the cluster is told of it with every command sent there
(:func:`site_document`), and as the cluster keeps it (:func:`enter`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hpctf.core.errors import UserError
from hpctf.core.safe_files import NotARegularFile, read_bounded, write_atomic
from hpctf.core.secrets import MARK, secret_env
from hpctf.core.settings.config import Site
from hpctf.login.remote.where import ON_LOGIN

# A site's template travels in ssh's argument vector with every command: one argument holds at
# most 128 KiB on Linux (MAX_ARG_STRLEN), the site's own values beside it.
TEMPLATE_BYTES = 64 << 10


def site_document(site: Site, secrets: bool = False) -> dict[str, Any]:
    """What the cluster is told of the site: the resolved site (``extends`` followed, nothing
    expanded: ``~`` and ``$VARS`` are the cluster's), and the text of its template.

    Without ``secrets`` the site's secret ``env`` values and its ``notify:`` (the webhook URL
    is a secret) are left out: that document travels in ssh's argument vector, which every
    user of both hosts reads with ``ps``, and only a submission needs them (it sends the whole
    document on ssh's standard input, :func:`hpctf.login.remote.shipping.submit_remote`)."""
    data = site.model_dump(mode="json", exclude_none=True, exclude={"extends", "template"})
    hidden, env = secret_env(site.env), data.get("env", {})
    if secrets:  # each with its mark: the cluster side keeps it a secret whatever its name
        data["env"] = {k: {MARK: hidden[k]} if k in hidden else v for k, v in env.items()}
    else:
        data["env"] = {k: v for k, v in env.items() if k not in hidden}
        data.pop("notify", None)
    template = None
    if site.template is not None:
        try:
            text = read_bounded(Path(site.template), TEMPLATE_BYTES, "the site's template")
        except OSError as exc:
            raise UserError(f"site {site.name}: template {site.template}: {exc.strerror}") from None
        except NotARegularFile as exc:
            raise UserError(
                f"site {site.name}: {exc} (it travels with every command sent to the cluster)"
            ) from None
        template = text.decode("utf-8", errors="replace")
    return {"site": data, "template": template}


def enter(site_json: str, env: dict[str, str] | os._Environ[str]) -> None:
    """Keep the laptop's site where the search path finds it first; mark this the login host."""
    try:
        document = json.loads(site_json)
        site, template = dict(document["site"]), document.get("template")
        name = str(site["name"])
    except (ValueError, KeyError, TypeError):
        raise UserError("_remote: the site document is not one hpctf sent") from None
    if "/" in name or name.startswith("."):
        raise UserError(f"_remote: {name!r} is not a site name")
    digest = hashlib.sha256(site_json.encode()).hexdigest()[:16]
    home = Path(env.get("HOME") or "~").expanduser()
    where = home / ".cache" / "hpctf" / "sites" / digest
    if not (where / f"{name}.yaml").is_file():
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        if template is not None:
            write_atomic(where / f"{name}.sbatch.j2", str(template))
            site["template"] = f"{name}.sbatch.j2"
        write_atomic(where / f"{name}.yaml", json.dumps(site))
    env["HPCTF_SITE_PATH"] = ":".join(p for p in (str(where), env.get("HPCTF_SITE_PATH")) if p)
    env[ON_LOGIN] = "1"
