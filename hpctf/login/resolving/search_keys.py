"""A search's parameter keys checked against the experiment, before anything is written.

Each key of ``sweep.parameters`` must be one a trial may set: not one the job array's script
is rendered from (:func:`hpctf.core.search.trial_config.fixed_key`), not one ``--set`` gives
too, and one the experiment takes with the values the distribution draws: the experiment is
resolved again with each parameter at its ends (a range's low and high, each choice), as
``hpctf submit --set KEY=VALUE`` would resolve it, so that an unknown key, a ``train.args``
name the entry does not take, or a value of the wrong type is refused now, not as a failed
trial on the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from hpctf.core.errors import UserError
from hpctf.core.search.trial_config import fixed_key
from hpctf.core.settings.search import CategoricalParam, Choice, Param, Search
from hpctf.core.settings.sources import parse_yaml
from hpctf.login.resolving.loader import load_config
from hpctf.login.resolving.readings import Readings

# Choices of one categorical parameter resolved at most: each resolve reads no file again
# (Readings), but a parameter with 10,000 choices would still be 10,000 resolves.
MAX_CHECKED_CHOICES = 50


def set_text(value: Choice) -> str:
    """``value`` as ``--set KEY=TEXT`` gives it back (YAML: ``true``, ``0.01``, ``relu``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    try:
        parsed = parse_yaml(value)
    except yaml.YAMLError:  # `@home`, a backtick, `[a`: --set gives text YAML cannot parse back
        return value
    return value if parsed == value else json.dumps(value)


def _samples(param: Param) -> list[Choice]:
    if isinstance(param, CategoricalParam):
        return list(param.choices[:MAX_CHECKED_CHOICES])
    return [param.low, param.high]


def check_search_keys(
    experiment: Path, site_name: str | None, overrides: Sequence[str], search: Search,
    env: Mapping[str, str], readings: Readings | None = None,
) -> None:  # fmt: skip
    """Every problem with the search's keys, one line each, in one UserError; nothing when
    they are all keys a trial may set."""
    readings = readings or Readings()
    given = {item.partition("=")[0].strip() for item in overrides}
    problems: list[str] = []
    for key, param in search.parameters.items():
        problem = fixed_key(key)
        if problem is None and key in given:
            problem = f"{key}: searched (sweep.parameters) and also given by --set; give it once"
        if problem is not None:
            problems.append(f"{experiment}: sweep.parameters.{problem}")
            continue
        for value in _samples(param):
            setting = f"{key}={set_text(value)}"
            try:
                load_config(experiment, site_name, [*overrides, setting], env, readings=readings)
            except UserError as exc:
                first = str(exc).splitlines()[0].removesuffix(f" (from --set {setting})")
                first = re.sub(rf"^{re.escape(str(experiment))}(:\d+)?: ", "", first)
                problems.append(f"{experiment}: sweep.parameters.{key} = {value!r}: {first}")
                break
    if problems:
        raise UserError("\n".join(problems))
