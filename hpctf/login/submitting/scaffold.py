"""``hpctf init``: a new experiment directory that validates and runs as written: a Task for
hpctf's loop, or (``--fit``) a Keras ``model.fit`` script."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from hpctf.core.assets import shipped_dir
from hpctf.core.errors import UserError
from hpctf.core.settings.sites import find_site

FILES = ("experiment.yaml", "train.py")


def experiment_name(directory: Path) -> str:
    """A valid experiment name made from a directory's name."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", directory.resolve().name).lstrip("-_.")[:64]
    return name or "experiment"


def write(
    directory: Path,
    site: str,
    name: str | None,
    force: bool,
    env: Mapping[str, str],
    fit: bool = False,
) -> list[Path]:
    """Write experiment.yaml and train.py into ``directory`` (with ``fit``: a ``train.script``
    experiment and a Keras fit script); return their paths.

    Refuses (UserError) an unknown site, a bad name, or existing files unless ``force``.
    """
    find_site(site, env)  # fails early, listing the sites there are
    name = name or experiment_name(directory)
    if not re.fullmatch(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
        raise UserError(f"--name {name!r}: use a letter or digit, then letters, digits, _ . -")
    if not re.fullmatch(r"^[A-Za-z0-9_./~-]+$", site):
        raise UserError(f"--site {site!r}: give a site name or a path without spaces or quotes")
    targets = [directory / file for file in FILES]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise UserError(f"{', '.join(existing)} already exist(s); pass --force to overwrite")
    directory.mkdir(parents=True, exist_ok=True)
    source = shipped_dir("templates") / ("init-fit" if fit else "init")
    for file, target in zip(FILES, targets, strict=True):
        text = (source / file).read_text(encoding="utf-8")
        target.write_text(text.replace("__NAME__", name).replace("__SITE__", site))
    return targets
