"""What differs between a site's ways of running jobs, in one type: a :class:`Launcher` per
``scheduler`` (:class:`SlurmLauncher`, :class:`LocalLauncher`), got with :func:`launcher_for`.

The rest of hpctf asks the launcher (its warning, whether it leaves nodes out, whether
``sbatch --test-only`` can judge a script, whether status asks Slurm about the jobs) and
compares no scheduler names; the one exception is the site schema's own check that a
container needs Slurm (:func:`allows_containers`, before a site exists). Starting, cancelling and
describing jobs is :class:`hpctf.login.submitting.launchers.JobLauncher`'s, one per kind of
launcher here, since local processes are a login-node thing the worker never imports.

Nothing here imports the site's schema (:mod:`hpctf.core.settings`, which asks the launchers
what they allow): a site is read through :class:`SchedulerSite`, generic in its container's
type.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from hpctf.core.errors import UserError
from hpctf.core.scheduler import slurm

ContainerT = TypeVar("ContainerT", covariant=True)


class _Preemption(Protocol):
    @property
    def warning_seconds(self) -> int: ...


class SchedulerSite(Protocol[ContainerT]):
    """What a launcher reads of a site (:class:`hpctf.core.settings.config.Site` has it): a
    protocol, so that the site's schema may ask the launchers what they allow."""

    @property
    def scheduler(self) -> str: ...

    @property
    def preemption(self) -> _Preemption: ...

    @property
    def container(self) -> ContainerT | None: ...


class Launcher(Generic[ContainerT]):
    """How a site runs a job: the base says what a launcher without Slurm does."""

    name: ClassVar[str]
    #: The run's jobs are Slurm jobs: status, ``logs -f``, cancel and resubmit ask Slurm about
    #: them, and a sweep is one job array.
    slurm: ClassVar[bool] = False

    def __init__(self, site: SchedulerSite[ContainerT]) -> None:
        self.site = site

    @property
    def warning_seconds(self) -> int | None:
        """How long before the end the scheduler warns the workers (``--signal``), None when
        it does not: it bounds the ranks' agreement and conflicts with a shorter time limit."""
        return None

    @property
    def container(self) -> ContainerT | None:
        """The container the workers run in, or None."""
        return None

    def check_exclude(self, exclude: str | None, where: Path) -> None:
        """UserError when nodes to leave out (``--exclude``) mean nothing to this launcher."""
        if exclude:
            raise UserError(f"--exclude needs a Slurm site; {where} runs on a local one")

    def leave_out(self, exclude: str | None, failed: Sequence[str]) -> str | None:
        """The nodes the next start leaves out: ``exclude`` and, where nodes are chosen by the
        scheduler, the ``failed`` ones of earlier starts."""
        return exclude

    def test_only(self, script: str) -> bool:
        """Have the scheduler judge ``script`` without running it (a SlurmFailure carries its
        words); False when nothing could judge it."""
        return False


class LocalLauncher(Launcher[ContainerT]):
    """``scheduler: local``: the job's tasks as processes on this machine."""

    name = "local"


class SlurmLauncher(Launcher[ContainerT]):
    """``scheduler: slurm``: one sbatch job per start (an array per sweep), warned with the
    site's ``preemption.signal`` and requeued by the batch script."""

    name = "slurm"
    slurm = True

    @property
    def warning_seconds(self) -> int | None:
        return self.site.preemption.warning_seconds

    @property
    def container(self) -> ContainerT | None:
        return self.site.container

    def check_exclude(self, exclude: str | None, where: Path) -> None:
        return None

    def leave_out(self, exclude: str | None, failed: Sequence[str]) -> str | None:
        return ",".join([*([exclude] if exclude else []), *failed]) or None

    def test_only(self, script: str) -> bool:
        if not shutil.which("sbatch"):
            return False
        slurm.test_only(script)
        return True


LAUNCHERS: dict[str, type[Launcher[Any]]] = {
    kind.name: kind for kind in (SlurmLauncher, LocalLauncher)
}


def launcher_for(site: SchedulerSite[ContainerT]) -> Launcher[ContainerT]:
    """The launcher of ``site``."""
    return LAUNCHERS[site.scheduler](site)


def is_slurm(scheduler: object) -> bool:
    """Whether a recorded scheduler name (a sweep's record) is a Slurm one."""
    kind = LAUNCHERS.get(str(scheduler))
    return kind is not None and kind.slurm


def allows_containers(scheduler: object) -> bool:
    """Whether a site of ``scheduler`` may name a container (before the site exists)."""
    return is_slurm(scheduler)
