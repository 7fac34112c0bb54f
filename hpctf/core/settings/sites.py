"""Finding site files by name, and following ``extends:`` from one site to another.

Search order, first match wins: the directories in ``HPCTF_SITE_PATH`` (colon-separated), then
``~/.config/hpctf/sites/``, then the site_configs/ shipped with hpctf. So a user or a cluster's
admins can override a shipped site by putting a file of the same name earlier in the path.
A ``--site`` value that names an existing ``.yaml`` file is used as that file directly.

``extends: NAME`` (or a ``.yaml`` path, relative to the extending file) starts a site from
another one: mappings (``env``) merge key by key, every other value (lists included) is
replaced, and ``name`` and ``description`` are never inherited. A file may extend the site it
shadows: ``~/.config/hpctf/sites/gpu.yaml`` with ``extends: gpu`` starts from the next
``gpu.yaml`` on the search path, not from itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctf.core.assets import shipped_dir
from hpctf.core.errors import UserError
from hpctf.core.safe_files import someone_elses
from hpctf.core.secrets import REDACTED
from hpctf.core.settings.config import Site
from hpctf.core.settings.sources import KeyPath, Origin, Origins, file_origins, load_yaml
from hpctf.core.settings.validation import validate_model

_NOT_INHERITED = ("name", "description")


def search_path(env: Mapping[str, str]) -> list[Path]:
    """The directories searched for ``<name>.yaml``, in order."""
    dirs = [Path(p).expanduser() for p in env.get("HPCTF_SITE_PATH", "").split(":") if p]
    dirs.append(Path(env.get("HOME", "~")).expanduser() / ".config" / "hpctf" / "sites")
    dirs.append(shipped_dir("site_configs"))
    return dirs


def _candidates(name: str, env: Mapping[str, str]) -> list[Path]:
    return [d / f"{name}.yaml" for d in search_path(env) if (d / f"{name}.yaml").is_file()]


def available(env: Mapping[str, str]) -> dict[str, Path]:
    """Every site name on the search path -> the file that wins for it."""
    found: dict[str, Path] = {}
    for directory in search_path(env):
        if directory.is_dir():
            for file in sorted(directory.glob("*.yaml")):
                found.setdefault(file.stem, file)
    return found


@dataclass(frozen=True)
class SiteEntry:
    """One name on the search path: the file that wins, its description, the files it hides."""

    name: str
    path: Path
    description: str
    shadowed: list[Path] = field(default_factory=list)


def listing(env: Mapping[str, str]) -> list[SiteEntry]:
    """Every site on the search path, by name. A file that does not load says why instead."""
    entries = []
    for name, path in sorted(available(env).items()):
        try:
            data, _ = load_yaml(path)
            description = str(data.get("description", "")).strip().splitlines()
            text = description[0] if description else ""
        except UserError as exc:
            text = f"(does not load: {str(exc).splitlines()[0]})"
        shadowed = [p for p in _candidates(name, env) if p != path]
        entries.append(SiteEntry(name, path, text, shadowed))
    return entries


def find_site(name: str, env: Mapping[str, str], after: Path | None = None) -> Path:
    """The file for site ``name`` (or ``name`` itself when it is a path to a YAML file).

    With ``after``, only files later on the search path than ``after`` count (how a site file
    extends the site of the same name that it shadows).
    """
    as_path = Path(name).expanduser()
    if name.endswith((".yaml", ".yml")):
        if as_path.is_file():
            return as_path
        raise UserError(f"site file {name!r}: no such file")
    candidates = _candidates(name, env)
    if after is not None:
        resolved = [c.resolve() for c in candidates]
        if after.resolve() in resolved:
            candidates = candidates[resolved.index(after.resolve()) + 1 :]
    if not candidates:
        names = ", ".join(sorted(available(env))) or "none"
        later = " later on the search path" if after is not None else ""
        raise UserError(
            f"unknown site {name!r}{later}; available: {names} "
            "(add sites with HPCTF_SITE_PATH or ~/.config/hpctf/sites/)"
        )
    return candidates[0]


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _replaced_paths(
    base: Mapping[str, Any], over: Mapping[str, Any], prefix: KeyPath
) -> list[KeyPath]:
    """Key paths whose whole value ``over`` replaces (so the base's origins below them go)."""
    paths: list[KeyPath] = []
    for key, value in over.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            paths.extend(_replaced_paths(base[key], value, path))
        else:
            paths.append(path)
    return paths


# Sites extend a handful of others in practice; each level is a recursion and a file read.
MAX_EXTENDS = 32


def _layers(
    path: Path, env: Mapping[str, str], chain: tuple[Path, ...]
) -> tuple[dict[str, Any], Origins]:
    """The merged data of ``path`` and every site it extends, with each key's origin."""
    data, lines = load_yaml(path)
    origins = file_origins("site", path, lines)
    template = data.get("template")
    if isinstance(template, str) and template:
        # Relative to the file that names it, so an extending site keeps its parent's template.
        data["template"] = str((path.parent / Path(template).expanduser()).resolve())
    parent_ref = data.get("extends")
    if parent_ref is None:
        return data, origins
    where = origins[("extends",)].where()
    if not isinstance(parent_ref, str) or not parent_ref:
        raise UserError(f"{where}: extends: expected a site name or a .yaml path")
    try:
        if parent_ref.endswith((".yaml", ".yml")):
            parent = find_site(str(path.parent / Path(parent_ref).expanduser()), env)
        else:
            same_name = parent_ref == path.stem
            parent = find_site(parent_ref, env, after=path if same_name else None)
    except UserError as exc:
        raise UserError(f"{where}: extends: {exc}") from None
    if len(chain) + 1 >= MAX_EXTENDS:
        raise UserError(
            f"{where}: extends: a chain of more than {MAX_EXTENDS} sites, starting at "
            f"{(chain or (path,))[0]}; a site may extend at most {MAX_EXTENDS - 1} others"
        )
    if parent.resolve() in {p.resolve() for p in (*chain, path)}:
        cycle = " -> ".join(p.name for p in (*chain, path, parent))
        raise UserError(f"{where}: extends: a cycle: {cycle}")
    base, base_origins = _layers(parent, env, (*chain, path))
    for key in _NOT_INHERITED:
        base.pop(key, None)
    merged_origins = {k: v for k, v in base_origins.items() if not (k and k[0] in _NOT_INHERITED)}
    for replaced in _replaced_paths(base, data, ()):
        for known in [k for k in merged_origins if k[: len(replaced)] == replaced]:
            del merged_origins[known]
    merged_origins.update(origins)
    return _merge(base, data), merged_origins


def read_site_file(path: Path, env: Mapping[str, str]) -> tuple[Site, Origins]:
    """Load and validate one site file and the sites it extends; say where each value came from.

    Problems are reported all at once, each naming the file (the extending one or a parent)
    and line where the offending key was given.
    """
    data, origins = _layers(path, env, ())
    site = validate_model(Site, data, origins, str(path))
    if site.login is not None:
        check_ssh_commands(site.login.ssh_options, origins.get(("login", "ssh_options")))
    return site, origins


# ssh options whose value runs a command as the user (or, -F, reads a config file that can:
# ProxyCommand, LocalCommand, Match exec): taken only from a site file the user owns.
_COMMAND_KEYWORDS = {"proxycommand", "localcommand", "permitlocalcommand", "knownhostscommand",
                     "match", "include"}  # fmt: skip


def command_options(options: Sequence[str]) -> list[str]:
    """The options among ``options`` (ssh's arguments) that can run commands."""
    found = []
    for index, option in enumerate(options):
        if option.startswith("-F"):
            found.append("-F")
            continue
        if option == "-o" and index + 1 < len(options):
            value = options[index + 1]
        elif option.startswith("-o"):
            value = option[2:]
        else:
            continue
        keyword = re.split(r"[\s=]", value.strip(), maxsplit=1)[0]
        if keyword.lower() in _COMMAND_KEYWORDS:
            found.append(keyword)
    return found


def check_ssh_commands(options: Sequence[str], origin: Origin | None) -> None:
    """A UserError when ``options`` that run commands come from a file another user owns (a
    shared site directory): their ProxyCommand would run as you at `hpctf status --site X`."""
    found = command_options(options)
    if not found or origin is None or not origin.file:
        return
    name = someone_elses(Path(origin.file))
    if name is None:
        return
    raise UserError(
        f"{origin.where()}: login.ssh_options {', '.join(found)} would run commands as you, and "
        f"this site file is {name}'s: copy it into ~/.config/hpctf/sites/ (yours) after "
        "reading what it runs, or leave those options out"
    )


def read_site(name: str, env: Mapping[str, str]) -> tuple[Site, Origins]:
    """:func:`read_site_file` for a site name (or path) found with :func:`find_site`."""
    return read_site_file(find_site(name, env), env)


def load_named_site(name: str, env: Mapping[str, str]) -> Site:
    return read_site(name, env)[0]


def describe_site(site: Site, origins: Origins) -> str:
    """The resolved site as YAML, each value followed by the file and line it came from."""

    def note(path: KeyPath) -> str:
        parts = path
        while parts and parts not in origins:
            parts = parts[:-1]
        origin = origins.get(parts, Origin("default", key=".".join(path)))
        return f"  # <- {origin}"

    out = [f"# site {site.name}, resolved; search order: HPCTF_SITE_PATH, ~/.config, shipped"]
    data = site.model_dump(mode="json")
    # Secrets are not for the terminal (a screen share, a pasted bug report): a secret env
    # value (dumped as *** by its type) and the webhook URL show as ***; their file and line
    # say where they are.
    if isinstance(data.get("notify"), dict) and data["notify"].get("webhook"):
        data["notify"] = {**data["notify"], "webhook": REDACTED}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.append(f"{key}:")
            out.extend(f"  {k}: {json.dumps(v)}{note((key, str(k)))}" for k, v in value.items())
        elif isinstance(value, list) and value and key != "port_range":
            out.append(f"{key}:")
            out.extend(f"  - {json.dumps(v)}{note((key, str(i)))}" for i, v in enumerate(value))
        else:
            out.append(f"{key}: {json.dumps(value)}{note((key,))}")
    return "\n".join(out) + "\n"
