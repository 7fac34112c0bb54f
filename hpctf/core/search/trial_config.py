"""A trial's config: the search's base experiment with the trial's parameters set (pure).

The base is resolved and validated once, on the login node, by ``hpctf sweep`` (every
parameter key checked there against the experiment and its entry's arguments,
:mod:`hpctf.login.sweeps.search_start`); here the batch wing only sets the values Optuna drew
and validates the experiment again, so that a value the schema refuses is a failed trial, not
a run with a wrong config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from hpctf.core.errors import UserError
from hpctf.core.settings.config import Experiment, ResolvedConfig

# Keys a trial may not set: what the array's script was rendered from (its resources, site,
# job name, environment and setup lines) is the array's, the same for every trial; and the
# search itself.
FIXED_BY_THE_ARRAY = ("name", "site", "resources", "env", "setup", "sweep")


def fixed_key(key: str) -> str | None:
    """Why a search may not set ``key``, or None when it may."""
    top = key.split(".", 1)[0]
    if top in FIXED_BY_THE_ARRAY:
        return (
            f"{key}: a search's parameter may not set {top}"
            f"{'.*' if top in ('resources', 'env', 'sweep') else ''}: the job array's script "
            "(resources, site, name, env, setup) is one for every trial; give it outside "
            "sweep.parameters"
        )
    return None


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def with_params(config: ResolvedConfig, params: Mapping[str, Any]) -> ResolvedConfig:
    """``config`` (the search's base) with every ``key.path -> value`` of ``params`` set in its
    experiment, validated again, and its ``sweep:`` dropped (a trial is a plain run; its
    ``trial.json`` links it to the study). A UserError names a key the schema refuses."""
    data = config.experiment.model_dump()
    for key, value in params.items():
        problem = fixed_key(key)
        if problem:
            raise UserError(problem)
        _set(data, key, value)
    data["sweep"] = None
    try:
        experiment = Experiment.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"a trial's parameters: {where}: {first['msg']}") from None
    return config.model_copy(update={"experiment": experiment})
