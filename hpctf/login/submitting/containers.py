"""How the batch script starts the workers in the site's container (``container:``).

Pure: :func:`container_launch` turns the resolved config and the run directory into the values
the template lays out around ``hpctf worker``; the template adds the reasons as comments.

- pyxis: srun's own ``--container-image``, ``--container-mounts``, ``--container-name``,
  ``--container-workdir`` and ``--container-env`` (https://github.com/NVIDIA/pyxis/wiki/Usage);
- apptainer: ``srun ... apptainer exec [--nv] --bind ... --pwd RUN_DIR IMAGE python3 -m hpctf
  worker`` (--nv only when the job has GPUs: on a node without the NVIDIA driver it only warns).

Either way the run directory is mounted at its own path (checkpoints, logs, the journal) and
its code snapshot ``RUN_DIR/code`` read-only over it: the workers import the code the run was
submitted with and cannot change it. The site's mounts follow, in its order.

A sweep's point (or a search's trial) holds its code as a relative link into the sweep's one
snapshot store (``SWEEP/code/<digest>``, :func:`hpctf.core.run.snapshot.link`): there the
store is what goes in read-only, at its own path, and the link resolves inside as outside. The
job array of a sweep or search (one script for every task) mounts the sweep directory, where
every point's run directory (and a search's study, which a trial's chief reports to) lies;
each task's workdir and container name are its own run directory's, ``$RUN_DIR``, which the
script sets for the task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpctf.core.errors import UserError
from hpctf.core.run.snapshot import CODE_DIR
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.settings.config import ResolvedConfig


@dataclass(frozen=True)
class ContainerLaunch:
    """What the batch script needs to start ``hpctf worker`` inside the container."""

    runtime: str  # pyxis | apptainer
    image: str
    mounts: str  # SRC:DST[:OPTION],... in order: run dir, its code snapshot (ro), the site's
    # The run directory: it exists inside, whatever the image's WORKDIR. None in a job array's
    # script, where each task's own is "$RUN_DIR" (written so by the template).
    workdir: str | None
    env_names: tuple[str, ...]  # host variables whose host value wins inside
    python: str  # the interpreter inside the image
    name: str | None  # pyxis --container-name; None in an array: "hpctf-" + $RUN_DIR's name
    gpus: bool  # apptainer --nv


def container_name(run_dir: Path) -> str:
    """The pyxis container name of a run: ``hpctf-<run dir name>``, in enroot's alphabet.

    Named, so that pyxis unpacks the image once per node and job rather than per step, and per
    run, so that a container another run left on a node (pyxis's container_scope=global) is
    never taken for this one ("If a container with this name already exists, the existing
    container is used and the import is skipped", pyxis --container-name).
    """
    return "hpctf-" + re.sub(r"[^A-Za-z0-9_.-]", "-", run_dir.name)


def container_launch(
    config: ResolvedConfig, run_dir: Path, *, code_store: Path | None = None, array: bool = False
) -> ContainerLaunch | None:
    """The container launch for ``config`` in ``run_dir``; None when the site has none.

    ``code_store``: a sweep's point, whose ``code/`` links into that store (mounted read-only
    in place of ``RUN_DIR/code``). ``array``: the script of a sweep's (or search's) job array,
    ``run_dir`` its sweep directory: mounted with its code store read-only, each task in its
    own ``$RUN_DIR`` (``workdir`` and ``name`` None).

    A UserError when the run directory's path holds a character both runtimes split their
    mount lists at (the site's runs_root, or HPCTF_RUNS_ROOT, chose it).
    """
    container = launcher_for(config.site).container  # a Slurm launcher's only
    if container is None:
        return None
    path = str(run_dir)
    for each in (path, str(code_store or path)):
        if re.search(r"[,:\s]", each):
            raise UserError(
                f"run directory {each!r} holds ',', ':' or a space, where {container.runtime} "
                "splits its mount list: choose a runs_root without them (the site's runs_root "
                "or HPCTF_RUNS_ROOT)"
            )
    code = str(code_store) if code_store else f"{path}/{CODE_DIR}"
    mounts = [f"{path}:{path}", f"{code}:{code}:ro", *container.mounts]
    # The site's and the experiment's env go in with the host's value too: the batch script
    # exported them for the workers, and an image's own ENV (NGC images set NCCL variables)
    # must not undo that.
    exported = {*config.site.env, *config.experiment.env}
    names = [*container.env, *sorted(exported - set(container.env))]
    return ContainerLaunch(
        runtime=container.runtime,
        image=container.image,
        mounts=",".join(mounts),
        workdir=None if array else path,
        env_names=tuple(names),
        python=container.python,
        name=None if array else container_name(run_dir),
        gpus=config.gpus_per_node > 0,
    )
