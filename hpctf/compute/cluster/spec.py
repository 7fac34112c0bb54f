"""SLURM environment -> TensorFlow cluster spec. Pure: no TensorFlow, no os.environ, no sockets.

:func:`cluster_spec` takes a copy of one task's environment and returns every worker of the job
step in SLURM_PROCID order, which worker this task is, its port, the GPUs it may use and the
TF_CONFIG JSON. Every task of a step computes the same worker list from the same variables, so
no task has to talk to another to agree on it. What needs I/O (test-binding the port, resolving
the addresses) lives in :mod:`hpctf.compute.start.runtime`.

Where each rank is (nodes, tasks, distribution) is :mod:`hpctf.compute.cluster.placement`'s.

TF's own SlurmClusterResolver is not used
(tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver.py): it sorts hosts as
strings (in ``node[9-10]`` rank 0 gets node10's address), assumes block distribution, gives
every job port 8888 (two jobs sharing a node collide), rewrites CUDA_VISIBLE_DEVICES and calls
nvidia-smi when that is unset. Here nodelists are expanded by python-hostlist in Slurm's own
order, ranks are placed the way srun placed them, and the result is checked against what Slurm
says this task is (SLURMD_NODENAME, SLURM_NODEID, SLURM_LOCALID) before anything starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpctf.compute.cluster.gpu_bind import gpu_binding
from hpctf.compute.cluster.placement import layout, plane_size, slurm_int, step_tasks
from hpctf.core.errors import SlurmEnvironmentProblem, UserError
from hpctf.core.run import journal
from hpctf.core.scheduler.hostnames import check_hostname_template

# Consecutive job ids start their port windows this far apart, so two jobs that share a node
# collide only if their ids differ by a multiple of (span / gcd(span, stride)) -- not for
# neighbouring ids, which is where job-id-modulo schemes collide. Both are primes, so they are
# coprime with every span: 10,000 consecutive job ids use 10,000 different window starts.
_JOB_STRIDE = 1009
_STEP_STRIDE = 101


@dataclass(frozen=True)
class ClusterSpec:
    """The workers of one job step, in SLURM_PROCID order, and which one this task is.

    ``workers[i]`` is the ``host:port`` of SLURM_PROCID ``i``; ``nodes[i]`` the Slurm node it
    runs on. ``host`` is this task's address host (the site's ``hostname_template`` applied to
    its node name). ``gpus`` are the devices this task trains on, in CUDA_VISIBLE_DEVICES
    numbering; when ``bind_gpus`` is true the worker must set CUDA_VISIBLE_DEVICES to them
    before TensorFlow starts (one worker per GPU). ``gpu_devices`` are the node's device
    numbers of the same GPUs, ``gpu_how`` the binding they came from
    (:mod:`hpctf.compute.cluster.gpu_bind`).
    """

    workers: tuple[str, ...]
    nodes: tuple[str, ...]
    task_index: int
    node: str
    node_index: int
    local_id: int
    host: str
    port: int
    gpus: tuple[str, ...]
    bind_gpus: bool
    job_id: int
    step_id: int
    hostname_template: str = "{host}"
    # The job as the run's journal and Slurm commands name it (hpctf.core.run.journal.job_handle:
    # ``<array>_<task>`` for a task of a job array, else the job id).
    journal_job: str = ""
    gpu_devices: tuple[str, ...] = ()
    gpu_how: str = ""

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def address(self) -> str:
        return self.workers[self.task_index]

    @property
    def chief_host(self) -> str:
        """The address host of worker 0, which every worker dials first."""
        return self.workers[0].rpartition(":")[0]

    def tf_config(self) -> str:
        """The TF_CONFIG JSON for this task."""
        return json.dumps(
            {
                "cluster": {"worker": list(self.workers)},
                "task": {"type": "worker", "index": self.task_index},
            }
        )

    def environment(self) -> dict[str, str]:
        """The variables to set before TensorFlow is imported."""
        env = {"TF_CONFIG": self.tf_config()}
        if self.bind_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env

    def describe(self) -> str:
        """One line for logs: who this task is and what it was given."""
        devices = ",".join(self.gpus)
        node_devices = ",".join(self.gpu_devices)
        on_node = f"node GPU {node_devices}" if node_devices != devices else ""
        how = "; ".join(part for part in (on_node, self.gpu_how) if part)
        if self.bind_gpus:
            gpus = f"CUDA_VISIBLE_DEVICES={devices} (one worker per GPU: {how})"
        else:
            gpus = f"GPUs {devices} (as Slurm set them: {how})" if devices else "no GPUs"
        return (
            f"worker {self.task_index} of {len(self.workers)} at {self.address} on node "
            f"{self.node} (SLURM_NODEID {self.node_index}, SLURM_LOCALID {self.local_id}); {gpus}"
        )


def port_window(job_id: int, step_id: int, port_range: tuple[int, int]) -> Callable[[int], int]:
    """The port of each slot (a task's rank, see :func:`cluster_spec`) in ``[low, high)``.

    Slots 0..span-1 of one step get distinct ports; the window start moves with job and step id.
    """
    low, high = port_range
    span = high - low
    offset = (job_id * _JOB_STRIDE + step_id * _STEP_STRIDE) % span

    def port(slot: int) -> int:
        return low + (offset + slot) % span

    return port


def _require_step(env: Mapping[str, str]) -> tuple[int, int]:
    """Job and step id; a UserError when ``env`` is not a task of a job step."""
    if not env.get("SLURM_JOB_ID"):
        raise UserError(
            "SLURM_JOB_ID is not set: this is not a Slurm job; run it inside one, "
            "e.g. srun -N2 --ntasks-per-node=1 hpctf tfconfig"
        )
    job_id = slurm_int(env, "SLURM_JOB_ID")
    # The batch script has SLURM_JOB_ID, SLURM_PROCID=0 and the job's task counts but no step:
    # a spec built there would describe tasks that do not exist.
    if not env.get("SLURM_STEP_ID"):
        raise UserError(
            f"SLURM_STEP_ID is not set: this is job {job_id}'s batch script, not a job step; "
            "run it under srun"
        )
    return job_id, slurm_int(env, "SLURM_STEP_ID")


def cluster_spec(
    env: Mapping[str, str],
    port_range: tuple[int, int],
    hostname_template: str = "{host}",
) -> ClusterSpec:
    """The cluster of the job step described by ``env`` (a copy of a task's environment).

    Reads SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE (else
    SLURM_TASKS_PER_NODE), SLURM_NTASKS, SLURM_PROCID, SLURM_DISTRIBUTION, SLURM_JOB_ID,
    SLURM_STEP_ID; checks the result against SLURMD_NODENAME, SLURM_NODEID and SLURM_LOCALID;
    takes GPUs from CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS. Anything missing, malformed or
    inconsistent is a SlurmEnvironmentProblem (exit 3) with a one-line reason; not being
    in a job step at all is a UserError.
    Each task's port: :func:`_port_slots`.
    """
    job_id, step_id = _require_step(env)
    _check_template(hostname_template)
    step = step_tasks(env)
    span = _port_span(port_range, max(step.counts))
    node_of, local_of = layout(step.counts, plane_size(env.get("SLURM_DISTRIBUTION", ""), env))
    slots = _port_slots(step.ntasks, span, local_of)
    workers = _worker_addresses(
        step.hosts, node_of, slots, hostname_template, port_window(job_id, step_id, port_range)
    )
    proc_id = step.proc_id
    node_index, local_id = node_of[proc_id], local_of[proc_id]
    node = step.hosts[node_index]
    _self_check(env, proc_id, node, node_index, local_id, step.nodelist, step.tasks_text)
    binding = gpu_binding(env, max(step.counts), local_id, node)
    host, _, port = workers[proc_id].rpartition(":")
    return ClusterSpec(
        workers=workers,
        nodes=tuple(step.hosts[index] for index in node_of),
        task_index=proc_id,
        node=node,
        node_index=node_index,
        local_id=local_id,
        host=host,
        port=int(port),
        gpus=binding.gpus,
        bind_gpus=binding.rewrite,
        job_id=job_id,
        step_id=step_id,
        hostname_template=hostname_template,
        journal_job=journal.job_handle(env) or str(job_id),
        gpu_devices=binding.devices,
        gpu_how=binding.how,
    )


def _check_template(hostname_template: str) -> None:
    """A UserError when the site's ``hostname_template`` is not one hpctf accepts."""
    try:
        check_hostname_template(hostname_template)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _port_span(port_range: tuple[int, int], per_node: int) -> int:
    """How many ports ``port_range`` holds; a UserError when fewer than one node's tasks."""
    low, high = port_range
    span = high - low
    if per_node > span:
        raise UserError(
            f"{per_node} tasks per node need more ports than port_range {low}-{high} holds"
        )
    return span


def _port_slots(ntasks: int, span: int, local_of: Sequence[int]) -> Sequence[int]:
    """Each task's slot in the port window: while the step's tasks fit in the range, task
    ``rank`` gets slot ``rank``, so every (host, port) pair is distinct even when all nodes
    share one IP address (as on the test cluster). A step with more tasks than the range holds
    gets slot SLURM_LOCALID instead: distinct per node, which is enough on a real cluster where
    each node has its own address."""
    return range(ntasks) if ntasks <= span else local_of


def _worker_addresses(
    hosts: Sequence[str],
    node_of: Sequence[int],
    slots: Sequence[int],
    hostname_template: str,
    port_of: Callable[[int], int],
) -> tuple[str, ...]:
    """``address:port`` of every task, by rank: its node's name through the template, the
    port of its slot. Distinct: hosts are distinct, the template is injective, and slots are
    distinct per step (ranks) or per node (local ids)."""
    if hostname_template == "{host}":
        addresses = list(hosts)
    else:
        addresses = [hostname_template.format(host=host) for host in hosts]
    return tuple(
        f"{addresses[node]}:{port_of(slot)}" for node, slot in zip(node_of, slots, strict=True)
    )


def _self_check(
    env: Mapping[str, str],
    proc_id: int,
    node: str,
    node_index: int,
    local_id: int,
    nodelist: str,
    tasks_text: str,
) -> None:
    """Fail now, with expected and actual side by side, if Slurm placed this rank elsewhere.

    A rank on another node than its TF_CONFIG entry does not crash: every worker waits in the
    first collective for a peer that listens somewhere else, until walltime.
    """
    expected = {"SLURMD_NODENAME": node, "SLURM_NODEID": node_index, "SLURM_LOCALID": local_id}
    diffs = []
    for key, want in expected.items():
        actual = env.get(key)
        if actual is not None and actual != str(want):
            diffs.append(f"{key} expected {want} actual {actual}")
    if diffs:
        distribution = env.get("SLURM_DISTRIBUTION") or "block (default)"
        raise SlurmEnvironmentProblem(
            f"SLURM_PROCID {proc_id} is not where the cluster spec puts it: {'; '.join(diffs)} "
            f"(nodelist {nodelist!r}, tasks per node {tasks_text!r}, distribution "
            f"{distribution}); start workers with srun --distribution=block:block"
        )
