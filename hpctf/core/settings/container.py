"""A site's ``container:`` setting: the image the workers run in, and how it is started.

Only the workers (``hpctf worker`` on every task) run inside the container. Everything the
batch shell runs itself stays on the host: ``module load``, the site's setup lines, and hpctf's
own ``job-start``/``job-signal``/``job-end``, which call ``scontrol requeue``; scontrol is often
missing inside an image (Lightning-AI/pytorch-lightning#21404), and a containerized batch script
(``sbatch --container-image``) could not run srun at all (pyxis FAQ:
https://github.com/NVIDIA/pyxis/wiki/Frequently-asked-questions).

This module holds the schema only (shared by both wings); :mod:`hpctf.login.submitting.containers`
turns it into the srun or apptainer words of the batch script.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from hpctf.core.settings.values import ENV_NAME_RE, Strict

# The mount options both runtimes understand (pyxis joins its flags with "+", apptainer takes a
# comma list, and they share no other spelling).
MOUNT_OPTIONS = ("ro", "rw")


def _check_image(value: str) -> str:
    if not value or value.startswith("-") or re.search(r"[\s\0]", value):
        raise ValueError(
            f"{value!r} is not an image: give a registry reference (pyxis: "
            "nvcr.io#nvidia/tensorflow:25.02-tf2-py3; apptainer: docker://tensorflow/tensorflow:"
            "2.21.0-gpu) or an image file path (.sqsh, .sif), without spaces or a leading -"
        )
    return value


def _check_path(value: str, what: str) -> str:
    # "," separates mounts and ":" source from destination in both runtimes' mount lists.
    if not value.startswith("/") or re.search(r"[,:\s\0]", value):
        raise ValueError(
            f"{what} {value!r} must be an absolute path without ',', ':' or spaces "
            "(both runtimes split mount lists there)"
        )
    return value


def _check_mount(value: str) -> str:
    """``SRC``, ``SRC:DST`` or ``SRC:DST:ro|rw``; returned as ``SRC:DST[:OPTION]``."""
    parts = value.split(":")
    if len(parts) > 3:
        raise ValueError(f"{value!r} is not a mount: give SRC, SRC:DST or SRC:DST:ro|rw")
    source = _check_path(parts[0], "mount source")
    target = _check_path(parts[1], "mount destination") if len(parts) > 1 else source
    if len(parts) == 3 and parts[2] not in MOUNT_OPTIONS:
        raise ValueError(f"{value!r}: mount option {parts[2]!r} is not one of ro, rw")
    return ":".join([source, target, *parts[2:]])


def _check_env_name(value: str) -> str:
    if not ENV_NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return value


def _check_python(value: str) -> str:
    if not value or value.startswith("-") or re.search(r"[\s\0]", value):
        raise ValueError(f"{value!r} is not a command (a name on the image's PATH, or a path)")
    return value


Mount = Annotated[str, AfterValidator(_check_mount)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]


class Container(Strict):
    """``container:`` in a site file: the workers run in ``image`` under ``runtime``.

    The run directory (with the code snapshot, ``RUN_DIR/code``, mounted read-only over it) is
    always mounted at its own path; ``mounts`` adds the site's (datasets, scratch). ``env``
    names host variables the workers must see with the host's value even where the image sets
    its own.
    """

    runtime: Literal["pyxis", "apptainer"] = Field(
        description="pyxis: srun --container-image (enroot); apptainer: apptainer exec"
    )
    image: Annotated[str, AfterValidator(_check_image)] = Field(
        description="registry reference or image file (.sqsh for pyxis, .sif for apptainer) "
        "with TensorFlow and hpctf installed"
    )
    mounts: list[Mount] = Field(
        default_factory=list,
        description="more host paths for the workers: SRC, SRC:DST or SRC:DST:ro|rw",
    )
    env: list[EnvName] = Field(
        default_factory=list,
        description="host environment variables passed in, winning over the image's values",
    )
    python: Annotated[str, AfterValidator(_check_python)] = Field(
        "python3", description="the interpreter inside the image that has hpctf and TensorFlow"
    )

    @field_validator("env")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} given more than once")
        return names
