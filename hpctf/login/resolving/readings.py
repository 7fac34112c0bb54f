"""What :func:`hpctf.login.resolving.loader.load_config` reads from files, read once.

A sweep resolves the same experiment and site for every point, with only ``--set`` values
changing; reading and parsing the YAML files and the entry's source again for each point took
~75 % of a 2,500-point plan (issue #21). A :class:`Readings` keeps what was read, so each point
is a copy of the parsed experiment with its values applied, then validated and resolved as
``hpctf submit`` does: the same checks, the same error lines. One :class:`Readings` serves one
command: it assumes the files and the environment do not change while it lives.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctf.core.settings.config import Site
from hpctf.core.settings.sites import find_site, read_site_file
from hpctf.core.settings.sources import KeyPath, Origins, load_yaml

EntryKey = tuple[Any, ...]
EntrySource = tuple[str | None, ast.Module | None]


class Readings:
    """Parsed files by path, site paths by name and entry-module checks by their inputs.

    Only successes are kept: a file that fails raises anew on every call, with the same error.
    Callers get their own copies of anything they may change (the origins mappings); the parsed
    YAML is handed out as is, since every reader copies it before applying overrides
    (:func:`hpctf.core.settings.validation.apply_overrides`).
    """

    def __init__(self) -> None:
        self._yaml: dict[Path, tuple[dict[str, Any], dict[KeyPath, int]]] = {}
        self._site_paths: dict[str, Path] = {}
        self._sites: dict[Path, tuple[Site, Origins]] = {}
        self._entries: dict[EntryKey, EntrySource] = {}
        self._real: dict[Path, Path] = {}

    def yaml(self, path: Path) -> tuple[dict[str, Any], dict[KeyPath, int]]:
        if path not in self._yaml:
            self._yaml[path] = load_yaml(path)
        return self._yaml[path]

    def site_path(self, name: str, env: Mapping[str, str]) -> Path:
        if name not in self._site_paths:
            self._site_paths[name] = find_site(name, env)
        return self._site_paths[name]

    def site(self, path: Path, env: Mapping[str, str]) -> tuple[Site, Origins]:
        if path not in self._sites:
            self._sites[path] = read_site_file(path, env)
        site, origins = self._sites[path]
        return site, dict(origins)

    def real(self, path: Path) -> Path:
        """``path.resolve()``, once per path."""
        if path not in self._real:
            self._real[path] = path.resolve()
        return self._real[path]

    def entry(self, key: EntryKey, find: Callable[[], EntrySource]) -> EntrySource:
        """``find()``'s answer for an entry point, once per ``key`` (everything it depends on)."""
        if key not in self._entries:
            self._entries[key] = find()
        return self._entries[key]
