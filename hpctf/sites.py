"""Finding site files by name.

Search order, first match wins: the directories in ``HPCTF_SITE_PATH`` (colon-separated), then
``~/.config/hpctf/sites/``, then the site_configs/ shipped with hpctf. So a user or a cluster's
admins can override a shipped site by putting a file of the same name earlier in the path.
A ``--site`` value that names an existing ``.yaml`` file is used as that file directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpctf.assets import shipped_dir
from hpctf.config import Site, load_site
from hpctf.errors import UserError


def search_path(env: Mapping[str, str]) -> list[Path]:
    """The directories searched for ``<name>.yaml``, in order."""
    dirs = [Path(p).expanduser() for p in env.get("HPCTF_SITE_PATH", "").split(":") if p]
    dirs.append(Path(env.get("HOME", "~")).expanduser() / ".config" / "hpctf" / "sites")
    dirs.append(shipped_dir("site_configs"))
    return dirs


def available(env: Mapping[str, str]) -> dict[str, Path]:
    """Every site name on the search path -> the file that wins for it."""
    found: dict[str, Path] = {}
    for directory in search_path(env):
        if directory.is_dir():
            for file in sorted(directory.glob("*.yaml")):
                found.setdefault(file.stem, file)
    return found


def find_site(name: str, env: Mapping[str, str]) -> Path:
    """The file for site ``name`` (or ``name`` itself when it is a path to a YAML file)."""
    as_path = Path(name).expanduser()
    if name.endswith((".yaml", ".yml")) and as_path.is_file():
        return as_path
    sites = available(env)
    if name not in sites:
        raise UserError(
            f"unknown site {name!r}; available: {', '.join(sorted(sites)) or 'none'} "
            "(add sites with HPCTF_SITE_PATH or ~/.config/hpctf/sites/)"
        )
    return sites[name]


def load_named_site(name: str, env: Mapping[str, str]) -> Site:
    return load_site(find_site(name, env))
