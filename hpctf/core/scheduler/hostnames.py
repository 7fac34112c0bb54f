"""Node names, shared by both wings: Slurm nodelists expanded in Slurm's own order, and a
site's ``hostname_template`` (how a Slurm node name becomes the address in TF_CONFIG).

The site schema validates the template on the login node and the cluster spec
(:mod:`hpctf.compute.cluster.spec`) checks it again on every task, from the same code; ``hpctf
doctor`` and the cluster spec expand nodelists with the same function.
"""

from __future__ import annotations

import re
import string

import hostlist

from hpctf.core.errors import SlurmEnvironmentProblem

# Characters of Slurm node names and the nodelist syntax (brackets, ranges, commas). Anything
# else (spaces, quotes, newlines) did not come from Slurm.
_NODELIST_RE = re.compile(r"^[A-Za-z0-9._\-\[\],]+$")
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


def expand_nodelist(text: str) -> list[str]:
    """Hosts of a Slurm nodelist, in Slurm's order (``node[9-10]`` -> node9, node10).

    Same answer as ``scontrol show hostnames`` (tests/test_cluster_slurm.py compares them):
    zero padding kept, bracket groups expanded left to right, duplicates kept.
    """
    if not _NODELIST_RE.match(text):
        raise SlurmEnvironmentProblem(
            f"cannot expand nodelist {text!r}: only letters, digits, '._-', brackets and "
            "commas occur in Slurm nodelists"
        )
    try:
        hosts: list[str] = hostlist.expand_hostlist(text, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise SlurmEnvironmentProblem(f"cannot expand nodelist {text!r}: {exc}") from None
    if not hosts:
        raise SlurmEnvironmentProblem(f"nodelist {text!r} names no host")
    return hosts
