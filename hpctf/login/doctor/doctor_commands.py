"""``hpctf doctor``: find the broken node or fabric before the training does.

Renders a short job for the site (``templates/doctor.sh.j2``: the site's partition, account,
GPUs, modules, venv, env and setup lines, as the training job gets them) that runs ``hpctf
preflight`` (:mod:`hpctf.compute.start.preflight`) on every task, and submits it; or runs it inside
the current allocation (``--here``), or as local processes on a local site. Every task writes
its results to ``<runs_root>/doctor-<site>-<time>/results/rank-<N>.json``; this module reads
them and :mod:`hpctf.login.doctor.verdict` judges them together.

Exit status: 0 when no check failed (warnings allowed), 1 when one did; 2 and 3 as everywhere
(the input, or Slurm itself, failed). Never imports TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hpctf.core.doctor_files import NCCL_DIR, RESULTS_DIR, SETTINGS_FILE
from hpctf.core.errors import EnvironmentProblem, UserError
from hpctf.core.run.rundir import free_path, runs_root
from hpctf.core.safe_files import umask, write_atomic
from hpctf.core.scheduler import slurm
from hpctf.core.scheduler.hostnames import expand_nodelist
from hpctf.core.scheduler.launcher import launcher_for
from hpctf.core.secrets import public_env, secret_env
from hpctf.core.settings import sbatch_options
from hpctf.core.settings.config import Experiment, ResolvedConfig, Resources, Site
from hpctf.core.settings.replicas import expected_replicas
from hpctf.core.settings.sites import read_site
from hpctf.core.settings.sources import Origin
from hpctf.core.settings.train import Train
from hpctf.core.version import VERSION
from hpctf.login.doctor.verdict import evaluate, format_table, verdict_document
from hpctf.login.resolving.resolve import ConfigProblems, merge_resources, resolve
from hpctf.login.submitting.launchers import slurm_jobs
from hpctf.login.submitting.local import spawn_tasks, stop_tasks
from hpctf.login.submitting.pipeline import submit
from hpctf.login.templating import ENVIRONMENT, ShellCode

TEMPLATE = "doctor.sh.j2"
# Options of the training job that a doctor job leaves out: it is not requeued, warned,
# mailed about, or made to wait for another job.
_LEFT_OUT = frozenset({"signal", "requeue", "mail-type", "mail-user", "dependency"})


# --- planning, rendering, running -------------------------------------------------------------


def doctor_config(site: Site, nodes: int, timeout: int, env: Mapping[str, str]) -> ResolvedConfig:
    """The site resolved as for a training job of ``nodes`` nodes limited to ``timeout``:
    every request default, the python and runs_root expanded, by the same merge as submit."""
    minutes = max(1, math.ceil(timeout / 60))
    resources = Resources(nodes=nodes, time=str(minutes))
    # Nothing is trained: a batch of one example per replica only passes resolve()'s check.
    batch = expected_replicas(merge_resources(resources, site, {}, {})[0])
    experiment = Experiment(
        name="hpctf-doctor",
        resources=resources,
        train=Train(
            entry="hpctf.compute.start.preflight:run_preflight", global_batch_size=batch, steps=1
        ),
    )
    if env.get("HPCTF_RUNS_ROOT"):
        site = site.model_copy(update={"runs_root": env["HPCTF_RUNS_ROOT"]})
    # The doctor's job gets no --signal (see _LEFT_OUT), so a short one is no conflict with the
    # site's preemption warning, which resolve() would otherwise refuse.
    warning = site.preemption.model_copy(update={"warning_seconds": 1})
    site = site.model_copy(update={"preemption": warning})
    try:
        loaded = resolve(
            Path("doctor"), experiment, {}, site, {}, Origin("--site", detail=site.name), None, env
        )
    except ConfigProblems as exc:
        raise UserError(
            "\n".join(f"site {site.name}: {'.'.join(key)}: {text}" for key, text in exc.problems)
        ) from None
    return loaded.config


def plan_directory(config: ResolvedConfig) -> Path:
    """A new ``<runs_root>/doctor-<site>-<time>`` (not created)."""
    base = f"doctor-{config.site.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return free_path(runs_root(config), base, "doctor directory")


def render_script(config: ResolvedConfig, directory: Path) -> str:
    """The doctor's batch script, through the one Jinja environment (its quoting rules)."""
    res = config.experiment.resources
    context = {
        "version": VERSION,
        "site": config.site.name,
        "sbatch_options": [
            (flag, value)
            for flag, value in sbatch_options.rendered(config, directory)
            if flag not in _LEFT_OUT
        ],
        "extra_sbatch": list(res.extra_sbatch),
        "doctor_dir": str(directory),
        "python": config.python,
        "modules": config.site.modules,
        "venv": config.site.venv,
        "env": sorted(public_env(config.site.env).items()),
        "setup": [ShellCode(line.rstrip("\n")) for line in config.site.setup],
        "nodes": res.nodes,
        "tasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
    }
    return ENVIRONMENT.get_template(TEMPLATE).render(context)


def prepare_directory(
    config: ResolvedConfig, directory: Path, timeout: int, script_text: str | None = None
) -> Path:
    """Create the doctor directory with its settings and script (``script_text``, rendered
    here when not given); return the script's path."""
    try:
        for sub in ("logs", RESULTS_DIR, NCCL_DIR):
            (directory / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create {directory}: {exc.strerror or exc}") from exc
    res = config.experiment.resources
    settings = {
        "site": config.site.model_dump(mode="json"),
        "nodes": res.nodes,
        "tasks_per_node": res.tasks_per_node,
        "gpus_per_node": config.gpus_per_node,
        "timeout_s": timeout,
        "python": config.python,
    }
    write_atomic(directory / SETTINGS_FILE, json.dumps(settings, indent=1) + "\n")
    script = directory / "doctor.sh"
    # The site's env goes into the script as it is: yours alone when it holds a secret
    # (hpctf.core.secrets), else executable as the umask allows.
    mode = 0o700 if secret_env(config.site.env) else 0o777 & ~umask()
    text = script_text if script_text is not None else render_script(config, directory)
    write_atomic(script, text, mode=mode)
    return script


def read_reports(directory: Path) -> list[dict[str, Any]]:
    """Every task's report; an unreadable one becomes a report of its own failure."""
    reports = []
    for path in sorted((directory / RESULTS_DIR).glob("*.json")):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            rank = path.stem.removeprefix("rank-")
            reports.append(
                {
                    "rank": int(rank) if rank.isdigit() else None,
                    "node": "?",
                    "checks": [{"check": "report", "status": "fail", "detail": f"{path}: {exc}"}],
                    "allreduce": {"status": "skip", "error": "report unreadable"},
                }
            )
    return reports


def run_local(config: ResolvedConfig, directory: Path, env: Mapping[str, str], timeout: int) -> int:
    """The tasks as processes on this machine, by the local spawner that starts a run's
    workers (:func:`hpctf.login.submitting.local.spawn_tasks`); returns how many ran. Unlike a
    training run, one task failing stops none of the others."""
    ntasks = config.ntasks
    preflight = [config.python, "-m", "hpctf", "preflight", str(directory)]
    logs = directory / "logs"
    procs = spawn_tasks(preflight, ntasks, {**env, **public_env(config.site.env)}, _rank_log(logs))
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        stop_tasks(procs)
    return ntasks


def _rank_log(logs: Path) -> Callable[[int], Path]:
    return lambda rank: logs / f"rank-{rank}.log"


def run_slurm(
    site: Site, directory: Path, script: Path, env: Mapping[str, str], timeout: int
) -> tuple[str, list[str] | None, tuple[str, str] | None]:
    """Submit the doctor's job and wait for it: (job id, its nodes, a job-level problem)."""
    job_id = slurm_jobs(site).submit_script(script)
    click.echo(f"doctor: submitted job {job_id}; results in {directory}", err=True)
    info = slurm.wait_for_job(job_id, timeout, env=env)
    problem: tuple[str, str] | None = None
    if info is None:
        info = slurm.job_info(job_id, env=env) or {}
        slurm.cancel([job_id], env=env)
        problem = (
            f"job {job_id} still {info.get('JobState', '?')} after {timeout} s "
            f"({info.get('Reason', 'no reason given')}); cancelled",
            "the partition is busy or the nodes are slow: raise --timeout, or run doctor "
            "inside an allocation with --here",
        )
    elif info and info.get("JobState") != "COMPLETED":
        output = directory / "logs" / f"slurm-{job_id}.out"
        problem = (
            f"job {job_id} ended {info.get('JobState')} (exit {info.get('ExitCode', '?')}): "
            f"{_last_line(output)}",
            f"see {output}",
        )
    nodelist = info.get("NodeList", "") if info else ""
    nodes = expand_nodelist(nodelist) if nodelist and nodelist != "(null)" else None
    return job_id, nodes, problem


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"no output ({path})"
    return lines[-1][:300] if lines else "no output"


def run_here(
    script: Path, env: Mapping[str, str], timeout: int, directory: Path
) -> tuple[str, str] | None:
    """Run the doctor's script with bash inside the current allocation (its srun makes a job
    step there); a problem when it failed or did not finish."""
    try:
        proc = subprocess.run(
            ["bash", str(script)],
            env=dict(env),
            timeout=timeout,
            capture_output=True,
            text=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return (
            f"the job step did not finish within {timeout} s",
            f"see {directory / 'logs'}; raise --timeout",
        )
    output = (proc.stdout + proc.stderr).strip()
    write_atomic(directory / "logs" / "here.out", output + "\n")
    if proc.returncode != 0:
        last = output.splitlines()[-1][:300] if output else "no output"
        return (
            f"the script exited {proc.returncode}: {last}",
            f"see {directory / 'logs' / 'here.out'}",
        )
    return None


@dataclass(frozen=True)
class DoctorJob:
    """The doctor's test job, through the submission pipeline
    (:func:`hpctf.login.submitting.pipeline.submit`): its directory planned, its script
    rendered once, the directory created, and the job started by the site's launcher (local
    processes, sbatch) or, with ``here``, inside the current allocation. The start's result:
    (job id, the nodes expected, a job-level problem)."""

    config: ResolvedConfig
    env: Mapping[str, str]
    timeout: int
    here: bool = False

    def plan(self) -> Path:
        return plan_directory(self.config)

    def render(self, planned: Path) -> str:
        return render_script(self.config, planned)

    def create(self, planned: Path, script: str) -> Path:
        prepare_directory(self.config, planned, self.timeout, script)
        return planned

    def start(self, created: Path) -> tuple[str | None, list[str] | None, tuple[str, str] | None]:
        config, env, timeout = self.config, self.env, self.timeout
        script = created / "doctor.sh"
        if not launcher_for(config.site).slurm:
            click.echo(f"doctor: {config.ntasks} local task(s); results in {created}", err=True)
            run_local(config, created, env, timeout)
            return None, ["localhost"], None
        if not self.here:
            return run_slurm(config.site, created, script, env, timeout)
        nodes = config.experiment.resources.nodes
        click.echo(f"doctor: job {env['SLURM_JOB_ID']}, {nodes} node(s); in {created}", err=True)
        problem = run_here(script, env, timeout, created)
        allocation = env.get("SLURM_JOB_NODELIST", "")
        expected = None
        if allocation and str(nodes) == env.get("SLURM_JOB_NUM_NODES"):
            expected = expand_nodelist(allocation)
        return env["SLURM_JOB_ID"], expected, problem


def _allocation_nodes(
    site: Site, slurm_site: bool, nodes: int | None, env: Mapping[str, str]
) -> int:
    """``--here``: the nodes to check inside the current allocation, or a UserError."""
    if not slurm_site:
        raise UserError(f"--here runs inside a Slurm allocation; site {site.name} is local")
    if not env.get("SLURM_JOB_ID"):
        raise UserError(
            "--here runs inside an allocation, but SLURM_JOB_ID is not set: start one "
            "(salloc -N 2 ...) and run hpctf doctor --here in it, or leave out --here"
        )
    allocated = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    return nodes or (int(allocated) if allocated.isdigit() else 1)


@click.command()
@click.option(
    "--site",
    "site_name",
    default="local",
    show_default=True,
    metavar="NAME",
    help="The site to check (name or path).",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 100_000),
    help="Nodes to check (default 2; with --here, the allocation's). On a local site: "
    "processes, times the site's tasks_per_node.",
)
@click.option("--here", is_flag=True, help="Run inside the current allocation (srun, no sbatch).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON, not a table.")
@click.option(
    "--timeout",
    type=click.IntRange(30, 7 * 24 * 3600),
    default=300,
    show_default=True,
    metavar="S",
    help="Give up after S seconds, waiting in the queue included (the job is cancelled).",
)
def doctor(site_name: str, nodes: int | None, here: bool, as_json: bool, timeout: int) -> None:
    """Check the site's nodes before training on them: one table, exit 0 only if all pass.

    On every node: Python, hpctf and TensorFlow versions equal everywhere; TensorFlow's build
    and GPUs against what Slurm gave; the locked-memory limit; InfiniBand ports; every node's
    name (hostname_template) resolves; the worker port is free; then an all-reduce across all
    tasks as the training makes it (NCCL on GPUs, RING on CPUs), with latency and bus
    bandwidth (against the site's doctor.min_busbw_gbps), and NCCL's log checked for a
    fallback to TCP sockets.
    """
    env = dict(os.environ)
    site, _ = read_site(site_name, env)
    slurm_site = launcher_for(site).slurm
    if here:
        nodes = _allocation_nodes(site, slurm_site, nodes, env)
    job = DoctorJob(doctor_config(site, nodes or 2, timeout, env), env, timeout, here)
    done = submit(job)
    directory = done.planned
    assert done.result is not None  # not a dry run
    job_id, expected_nodes, problem = done.result
    config = job.config
    logs = str(directory / "logs")
    verdict = evaluate(
        read_reports(directory),
        config.ntasks,
        expected_nodes,
        site.doctor.min_busbw_gbps,
        logs,
        problem,
    )
    document = verdict_document(verdict, site=site.name, directory=str(directory), job_id=job_id)
    write_atomic(directory / "verdict.json", json.dumps(document, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(document, indent=1))
    else:
        click.echo(format_table(verdict), nl=False)
        click.echo(f"doctor: details in {directory}", err=True)
    sys.exit(0 if verdict.passed else 1)
