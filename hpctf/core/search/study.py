"""A search's Optuna study, kept in the sweep directory on the shared filesystem.

Optuna's journal storage appends every change of the study to one file, and its
``JournalFileOpenLock`` locks by creating a file with ``O_CREAT | O_EXCL``, which holds on NFS
and Lustre where ``flock`` may not (https://optuna.readthedocs.io/en/stable/reference/generated/
optuna.storages.journal.JournalFileBackend.html): no database server. Optuna is imported here
and only when a study is opened, so neither ``hpctf status`` of a grid nor a worker of a plain
run pays for it. Samplers are not stored in a study: each process that asks for a trial builds
its own from the search (seeded, plus the trial's number so that two askers differ).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpctf.core.errors import UserError
from hpctf.core.settings.search import Pruner, Search

if TYPE_CHECKING:
    import optuna

JOURNAL_FILE = "study.journal"
OPTUNA_MISSING = (
    "a search (the experiment's sweep: section) needs Optuna on this machine: "
    "pip install 'hpctf[search]'"
)


def _optuna() -> ModuleType:
    try:
        import optuna
    except ImportError as err:
        raise UserError(OPTUNA_MISSING) from err
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def build_pruner(spec: Pruner) -> optuna.pruners.BasePruner:
    """The pruner a search names; an evaluation is one unit of Optuna's resource."""
    lib = _optuna()
    pruner: optuna.pruners.BasePruner
    if spec.kind == "asha":
        pruner = lib.pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_evals, reduction_factor=spec.reduction_factor
        )
    elif spec.kind == "hyperband":
        pruner = lib.pruners.HyperbandPruner(
            min_resource=spec.min_evals,
            max_resource=spec.max_evals or "auto",
            reduction_factor=spec.reduction_factor,
        )
    else:
        pruner = lib.pruners.NopPruner()
    return pruner


def storage(journal: Path) -> optuna.storages.BaseStorage:
    """The journal storage of one study file (created on first use)."""
    lib = _optuna()
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = str(journal)
    journal_storage: optuna.storages.BaseStorage = lib.storages.JournalStorage(
        JournalFileBackend(path, lock_obj=JournalFileOpenLock(path))
    )
    return journal_storage


def open_study(
    journal: Path, name: str, pruner: Pruner, sampler: optuna.samplers.BaseSampler | None = None
) -> optuna.Study:
    """The study ``name`` in ``journal``, created if it is not there yet (its direction is set
    by :func:`create_study`; here it is read back)."""
    lib = _optuna()
    study: optuna.Study = lib.load_study(
        study_name=name, storage=storage(journal), pruner=build_pruner(pruner), sampler=sampler
    )
    return study


def create_study(journal: Path, name: str, search: Search) -> optuna.Study:
    """A new study for ``search`` in ``journal`` (the sweep directory's); an existing one of
    that name is loaded instead, so a retried submit does not start over."""
    lib = _optuna()
    study: optuna.Study = lib.create_study(
        study_name=name,
        storage=storage(journal),
        direction=search.objective.direction,
        pruner=build_pruner(search.pruner),
        load_if_exists=True,
    )
    return study
