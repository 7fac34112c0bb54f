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

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpctf.core.errors import DamagedRecord, UserError
from hpctf.core.settings.search import (
    CategoricalParam,
    Choice,
    FloatParam,
    IntParam,
    Param,
    Pruner,
    Search,
)

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


def require_optuna() -> ModuleType:
    """Optuna, or a UserError naming the extra that brings it."""
    return _optuna()


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


@contextlib.contextmanager
def damage_named(journal: Path) -> Iterator[None]:
    """Optuna's errors for a damaged journal (an append cut short by a full disk or a quota,
    then others after it: every later read fails) as a DamagedRecord naming the file (exit 3,
    one line)."""
    try:
        yield
    except json.JSONDecodeError as exc:
        raise DamagedRecord(f"{journal}: damaged ({exc}); {_DAMAGED}") from None
    except ValueError as exc:
        if str(exc) != "Invalid log format.":  # optuna.storages.journal._file.read_logs
            raise
        raise DamagedRecord(f"{journal}: a line cut short before others; {_DAMAGED}") from None
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        # A line of valid JSON in a shape Optuna's replay cannot take (a hand edit, another
        # tool's write): its error is a bare KeyError or TypeError from inside the replay.
        raise DamagedRecord(
            f"{journal}: a line Optuna cannot replay ({type(exc).__name__}: {exc}); {_DAMAGED}"
        ) from None


_DAMAGED = (
    "the study cannot be read: restore the file from a backup, or remove the damaged line "
    "(each line is one JSON operation)"
)


def open_study(
    journal: Path, name: str, pruner: Pruner, sampler: optuna.samplers.BaseSampler | None = None
) -> optuna.Study:
    """The study ``name`` in ``journal``, created if it is not there yet (its direction is set
    by :func:`create_study`; here it is read back)."""
    lib = _optuna()
    with damage_named(journal):
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


def distribution(param: Param) -> optuna.distributions.BaseDistribution:
    """Optuna's distribution for one parameter of a search."""
    lib = _optuna()
    dist: optuna.distributions.BaseDistribution
    if isinstance(param, FloatParam):
        dist = lib.distributions.FloatDistribution(
            param.low, param.high, log=param.log, step=param.step
        )
    elif isinstance(param, IntParam):
        dist = lib.distributions.IntDistribution(
            param.low, param.high, log=param.log, step=param.step
        )
    else:
        dist = lib.distributions.CategoricalDistribution(param.choices)
    return dist


def distributions(search: Search) -> dict[str, optuna.distributions.BaseDistribution]:
    """Every parameter's distribution, keyed by its experiment key path."""
    return {key: distribution(param) for key, param in search.parameters.items()}


def grid_values(param: Param) -> list[Choice]:
    """Every value the grid sampler takes of one parameter (pure: no Optuna): a float's
    ``low, low+step, ... <= high``, an int's ``low..high`` by ``step``, the choices."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step))
    step = param.step or (param.high - param.low)
    count = math.floor((param.high - param.low) / step + 1e-9) + 1
    # Rounded to the step's own decimals: 0.1 * 3 is 0.30000000000000004, not 0.3.
    digits = max(0, -math.floor(math.log10(step))) + 6
    return [round(param.low + i * step, digits) for i in range(count)]


def grid_size(search: Search) -> int:
    """How many points the grid of every choice has."""
    return math.prod(len(grid_values(p)) for p in search.parameters.values())


def trial_budget(search: Search) -> int:
    """How many trials the search runs: ``trials``, and no more than the grid has points for
    the grid sampler (it would only repeat them)."""
    if search.sampler == "grid":
        return min(search.trials, grid_size(search))
    return search.trials


def build_sampler(search: Search, asked: int) -> optuna.samplers.BaseSampler:
    """The sampler that asks for the search's next trial. Samplers are not stored in the
    study: each asker builds one, seeded by the search's seed plus how many trials were asked
    before (``asked``), so that every ask is reproducible and two askers differ. TPE keeps
    Optuna's constant liar: trials still running count as bad, so that parallel askers spread
    out instead of all sampling the same best guess."""
    lib = _optuna()
    seed = (search.seed + asked) % 2**32
    sampler: optuna.samplers.BaseSampler
    if search.sampler == "grid":
        space = {key: grid_values(p) for key, p in search.parameters.items()}
        sampler = lib.samplers.GridSampler(space, seed=search.seed)
    elif search.sampler == "random":
        sampler = lib.samplers.RandomSampler(seed=seed)
    else:
        sampler = lib.samplers.TPESampler(seed=seed, constant_liar=True)
    return sampler
