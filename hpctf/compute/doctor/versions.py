"""The worker's hpctf against the one that started the job on the host: with a container, the
batch script's ``hpctf job-start`` (and ``job-end``, the requeues) run the host's install and the
workers the image's, which nothing else keeps in step. Pure: the run's history in, a check
out. A difference is a warning (the rank goes on): the journal and run directory are shared
between the two, and a release that changed them would misread the other's records."""

from __future__ import annotations

from hpctf.compute.doctor.node_checks import Check
from hpctf.core.run.history import RunHistory


def version_check(history: RunHistory, job: str, mine: str, image: str | None) -> Check:
    """Compare ``mine`` (this worker's hpctf) with the ``hpctf`` of this job's latest
    ``started`` record (written by the host's job-start); skip when the record has none."""
    host = history.version_started(job)
    if host is None:
        return Check("hpctf_version", "skip", "the job's start recorded no hpctf version")
    if host == mine:
        return Check("hpctf_version", "ok", f"hpctf {mine} here and on the host")
    where = f"container image {image}" if image else "the workers' environment"
    return Check(
        "hpctf_version",
        "warn",
        f"hpctf {mine} in {where} but {host} on the host (job-start): the two share the run's "
        "journal",
        "install the host's hpctf version in the image (pip install hpctf==" + host + "), or "
        "the image's on the host",
    )
