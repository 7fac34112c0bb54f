"""A site's ``hostname_template``: how a Slurm node name becomes the address in TF_CONFIG.

Standard library only: the site schema validates it on the login node and the cluster spec
(:mod:`hpctf.compute.cluster`) checks it again on every task, from the same code.
"""

from __future__ import annotations

import re
import string

_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_hostname_template(template: str) -> str:
    """Return ``template`` if it is a valid hostname_template, else raise ValueError.

    Valid: ``{host}`` (the Slurm node name) at least once, no other field, no conversion or
    format spec, and a result that is a valid DNS name (labels of letters, digits, hyphens).
    """
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        raise ValueError(f"hostname_template {template!r}: {exc}") from None
    if not fields or any(f != ("host", "", None) for f in fields):
        raise ValueError(
            f"hostname_template {template!r} must contain {{host}} and no other field, "
            "e.g. '{host}-ib' or '{host}.ib.cluster'"
        )
    sample = template.format(host="node001")
    if len(sample) > 253 or not all(_LABEL_RE.match(label) for label in sample.split(".")):
        raise ValueError(
            f"hostname_template {template!r} gives {sample!r} for node001, which is not a valid "
            "host name (letters, digits and hyphens, dot-separated)"
        )
    return template
