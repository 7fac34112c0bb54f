"""Warnings about a resolved request that Slurm would accept but that trains badly: printed by
``hpctf validate`` and ``hpctf submit`` (one line each), never a refusal. Pure.

* Cores for the GPUs: the input pipeline and the host side of every GPU step run on the task's
  CPUs. ``cpus_per_task x tasks_per_node`` below the site's ``min_cpus_per_gpu`` per GPU of the
  node starves the GPUs (one core driving 8 GPUs when an experiment pins ``cpus_per_task: 1``
  over a site's 64) and nothing fails.
* Ports: a ``port_range`` inside Linux's default ephemeral range (32768-60999,
  /proc/sys/net/ipv4/ip_local_port_range) shares its ports with every outgoing connection on
  the node, any of which may hold a worker's port when the worker binds it.
* A search submitted as one run: ``hpctf submit`` of an experiment with a ``sweep:`` section
  starts one run with the experiment's own values (a point to try before searching is a fair
  wish), so it says so rather than leave the researcher waiting for trials.
"""

from __future__ import annotations

from pathlib import Path

from hpctf.core.settings.config import ResolvedConfig

EPHEMERAL = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range


def advice(config: ResolvedConfig) -> list[str]:
    """One line per thing worth changing (see the module's docstring); empty when none."""
    lines = []
    resources = config.experiment.resources
    site = config.site
    gpus = config.gpus_per_node
    cpus = resources.cpus_per_task * resources.tasks_per_node
    if gpus and site.min_cpus_per_gpu and cpus < site.min_cpus_per_gpu * gpus:
        per_task = -(-site.min_cpus_per_gpu * gpus // resources.tasks_per_node)
        lines.append(
            f"{cpus} CPU(s) for {gpus} GPU(s) per node (cpus_per_task {resources.cpus_per_task} "
            f"x tasks_per_node {resources.tasks_per_node}): site {site.name} wants at least "
            f"{site.min_cpus_per_gpu} per GPU to keep them fed; set resources.cpus_per_task: "
            f"{per_task} (or leave it to the site)"
        )
    low, high = site.port_range
    if low <= EPHEMERAL[1] and high > EPHEMERAL[0]:
        lines.append(
            f"site {site.name}'s port_range {low}-{high} overlaps Linux's ephemeral ports "
            f"{EPHEMERAL[0]}-{EPHEMERAL[1]} (the nodes' ip_local_port_range), where any "
            "outgoing connection may take a worker's port first; move it below 32768 or above "
            "60999"
        )
    return lines


def search_as_one_run(config: ResolvedConfig, experiment: Path) -> str | None:
    """The line ``hpctf submit`` prints when ``experiment`` holds a search; None when not."""
    if config.experiment.sweep is None:
        return None
    return (
        f"{experiment} has a sweep: section, which submit does not read: this starts one run "
        f"with the experiment's own values; `hpctf sweep {experiment}` runs the search"
    )
