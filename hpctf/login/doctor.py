"""``hpctf doctor``: find the broken node or fabric before the training does.

Renders a short job for the site (``templates/doctor.sh.j2``: the site's partition, account,
GPUs, modules, venv, env and setup lines, as the training job gets them) that runs ``hpctf
preflight`` (:mod:`hpctf.compute.preflight`) on every task, and submits it; or runs it inside
the current allocation (``--here``), or as local processes on a local site. Every task writes
its results to ``<runs_root>/doctor-<site>-<time>/results/rank-<N>.json``; this module reads
them and judges them together:

- :func:`evaluate` (pure): per node and check the worst status of its tasks; the versions
  compared across all tasks; tasks that never reported; the all-reduce against the site's
  ``doctor.min_busbw_gbps``;
- :func:`format_table` (pure): one line per node and check, then one line per failed (or
  warned) check naming the node and the fix.

Exit status: 0 when no check failed (warnings allowed), 1 when one did; 2 and 3 as everywhere
(the input, or Slurm itself, failed). Never imports TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hpctf import __version__
from hpctf.core import sbatch_options, slurm
from hpctf.core.config import Experiment, ResolvedConfig, Resources, Site, Train
from hpctf.core.doctor_files import NCCL_DIR, RESULTS_DIR, SETTINGS_FILE
from hpctf.core.errors import UserError
from hpctf.core.hostnames import expand_nodelist
from hpctf.core.rundir import write_atomic
from hpctf.core.sites import read_site
from hpctf.core.sources import Origin
from hpctf.login.local import task_environment
from hpctf.login.render import ENVIRONMENT, ShellCode
from hpctf.login.resolve import ConfigProblems, resolve

TEMPLATE = "doctor.sh.j2"
SEVERITY = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}
CHECKS = (
    "job",
    "report",
    "cluster",
    "versions",
    "tensorflow",
    "memlock",
    "infiniband",
    "hostnames",
    "port",
    "allreduce",
    "nccl",
)
# Options of the training job that a doctor job leaves out: it is not requeued, warned,
# mailed about, or made to wait for another job.
_LEFT_OUT = frozenset({"signal", "requeue", "mail-type", "mail-user", "dependency"})


@dataclass(frozen=True)
class Row:
    """One node's outcome of one check (the worst of its tasks'). ``node`` is ``-`` for what
    belongs to no node (the job, tasks that never said where they ran)."""

    node: str
    check: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Verdict:
    rows: tuple[Row, ...]
    nodes: tuple[str, ...]
    reported: int
    expected: int

    @property
    def failed(self) -> list[Row]:
        return [row for row in self.rows if row.status == "fail"]

    @property
    def warned(self) -> list[Row]:
        return [row for row in self.rows if row.status == "warn"]

    @property
    def passed(self) -> bool:
        return not self.failed


# --- judging the reports (pure) ---------------------------------------------------------------


def size_text(size: int) -> str:
    """1024 -> '1 KiB', 16 << 20 -> '16 MiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def allreduce_text(result: Mapping[str, Any]) -> str:
    """``RING, 2 ranks: 1 KiB 0.61 ms, 64 KiB 0.95 ms 0.07 GB/s, ...`` (bus bandwidth from
    64 KiB up, where it starts to mean something)."""
    parts = []
    for entry in result.get("sizes", []):
        part = f"{size_text(entry['bytes'])} {entry['seconds'] * 1e3:.2f} ms"
        if entry["bytes"] >= 64 << 10 and result.get("ranks", 0) > 1:
            part += f" {entry['busbw_gbps']:.2f} GB/s"
        parts.append(part)
    return f"{result.get('implementation', '?')}, {result.get('ranks', '?')} ranks: " + ", ".join(
        parts
    )


def merge_allreduce(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several tasks' timings of the same all-reduces as one: per size the slowest task's time
    (a collective ends for everyone when the last rank is done), bus bandwidth from that."""
    first = results[0]
    ranks = int(first.get("ranks", 0))
    sizes = []
    for index, entry in enumerate(first.get("sizes", [])):
        seconds = max(r["sizes"][index]["seconds"] for r in results)
        busbw = entry["busbw_gbps"] * entry["seconds"] / seconds if seconds > 0 else 0.0
        sizes.append({"bytes": entry["bytes"], "seconds": seconds, "busbw_gbps": busbw})
    return {**first, "ranks": ranks, "sizes": sizes}


def _allreduce_task(result: Mapping[str, Any], imported: bool, log: str) -> tuple[str, str, str]:
    """(status, detail, fix) of one task's all-reduce, before its node's tasks are merged;
    ``imported``: whether the task got as far as judging TensorFlow."""
    status = result.get("status", "pending")
    if status == "skip":
        return "skip", str(result.get("error", "not run")), ""
    if status == "pending":
        where = "in the all-reduce" if imported else "before TensorFlow was imported"
        return (
            "fail",
            f"did not finish: the task stopped {where} (its time ran out, or it crashed or "
            "was killed)",
            f"see {log} (where the time ran out, it ends with each thread's traceback)",
        )
    if status != "ok":
        return (
            "fail",
            str(result.get("error", "failed")),
            "a peer did not join, or the network between the nodes is blocked: see the other "
            f"checks of each node and {log}",
        )
    return "ok", "", ""


def allreduce_verdict(
    result: Mapping[str, Any], min_busbw_gbps: float | None
) -> tuple[str, str, str]:
    """(status, detail, fix) of a completed all-reduce against the site's threshold, which
    applies to the bus bandwidth at the largest message size."""
    if result.get("ranks", 0) < 2:
        return "ok", f"{result.get('implementation')}, 1 replica: nothing to reduce across", ""
    text = allreduce_text(result)
    sizes = result.get("sizes") or []
    if min_busbw_gbps is not None and sizes:
        largest = max(sizes, key=lambda entry: entry["bytes"])
        if largest["busbw_gbps"] < min_busbw_gbps:
            return (
                "fail",
                f"{text}; busbw {largest['busbw_gbps']:.2f} GB/s at "
                f"{size_text(largest['bytes'])} is below the site's doctor.min_busbw_gbps "
                f"{min_busbw_gbps:g}",
                "check the transport NCCL chose (the nccl check; NCCL_IB_HCA, "
                "NCCL_SOCKET_IFNAME) and the links of each node (ibstat); one slow node slows "
                "every rank: run doctor on fewer nodes to find it",
            )
    return "ok", text, ""


def _version_rows(reports: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, str, str]]:
    """(node, rank, status, detail) per task: its versions against the most common ones."""
    known = [r for r in reports if r.get("facts", {}).get("python")]
    if not known:
        return []
    references = {}
    for key in ("python", "hpctf", "tensorflow"):
        values = [r["facts"].get(key) for r in known if r["facts"].get(key)]
        if values:
            references[key] = Counter(values).most_common(1)[0][0]
    names = {"python": "Python", "hpctf": "hpctf", "tensorflow": "TensorFlow"}
    rows = []
    for report in known:
        facts = report["facts"]
        differ = [
            f"{names[key]} {facts[key]} (most tasks: {reference})"
            for key, reference in references.items()
            if facts.get(key) and facts[key] != reference
        ]
        shown = ", ".join(f"{names[k]} {facts[k]}" for k in names if facts.get(k))
        if differ:
            rows.append((report["node"], report["rank"], "fail", "; ".join(differ)))
        else:
            rows.append((report["node"], report["rank"], "ok", shown))
    return rows


def evaluate(
    reports: Sequence[Mapping[str, Any]],
    expected: int,
    expected_nodes: Sequence[str] | None = None,
    min_busbw_gbps: float | None = None,
    logs: str = "logs",
    job_problem: tuple[str, str] | None = None,
) -> Verdict:
    """Judge every task's report (``results/rank-<N>.json``, as dicts) together.

    ``expected``: how many tasks should have reported; ``expected_nodes``: the nodes they ran
    on, when known (a node without a report fails ``report``); ``logs``: where the task logs
    are, for the fixes; ``job_problem``: (detail, fix) when the job itself failed or timed out.
    """
    per_check: dict[tuple[str, str], list[tuple[int, str, str, str]]] = {}

    def add(node: str, check: str, rank: int, status: str, detail: str, fix: str = "") -> None:
        per_check.setdefault((node, check), []).append((rank, status, detail, fix))

    completed: dict[str, list[Mapping[str, Any]]] = {}
    for report in reports:
        node, rank = str(report.get("node", "?")), int(report.get("rank") or 0)
        for check in report.get("checks", []):
            add(node, check["check"], rank, check["status"], check["detail"], check.get("fix", ""))
        if "cluster" not in {c["check"] for c in report.get("checks", [])}:
            result = report.get("allreduce") or {}
            imported = "tensorflow" in {c["check"] for c in report.get("checks", [])}
            status, detail, fix = _allreduce_task(result, imported, f"{logs}/rank-{rank}.log")
            if status == "ok":
                completed.setdefault(node, []).append(result)
            else:
                add(node, "allreduce", rank, status, detail, fix)
    for node, results in completed.items():
        # Merged only where none of the node's tasks failed it (a failure says more).
        if all(entry[1] == "skip" for entry in per_check.get((node, "allreduce"), [])):
            status, detail, fix = allreduce_verdict(merge_allreduce(results), min_busbw_gbps)
            rank = min(int(r.get("rank") or 0) for r in reports if r.get("node") == node)
            add(node, "allreduce", rank, status, detail, fix)
    for node, rank, status, detail in _version_rows(reports):
        fix = (
            "use one environment on every node: the site's venv or python must name the same "
            "installation everywhere (on the shared filesystem)"
            if status == "fail"
            else ""
        )
        add(node, "versions", rank, status, detail, fix)

    order: list[str] = []
    for report in sorted(reports, key=lambda r: int(r.get("rank") or 0)):
        if str(report.get("node", "?")) not in order:
            order.append(str(report.get("node", "?")))
    extra: list[Row] = []
    if job_problem is not None:
        extra.append(Row("-", "job", "fail", *job_problem))
    missing_nodes = [n for n in expected_nodes or () if n not in order]
    for node in missing_nodes:
        extra.append(
            Row(
                node,
                "report",
                "fail",
                "no result from this node",
                f"see {logs}: the task did not start, or the site's python cannot run hpctf "
                "there (`python -m hpctf --version` on the node)",
            )
        )
    ranks = {int(r["rank"]) for r in reports if r.get("rank") is not None}
    if len(ranks) < expected and not missing_nodes:
        absent = [str(r) for r in range(expected) if r not in ranks]
        extra.append(
            Row(
                "-",
                "report",
                "fail",
                f"{len(absent)} of {expected} tasks wrote no result (ranks {', '.join(absent)})",
                f"see {logs}: the tasks did not start, or the site's python cannot run hpctf "
                "(`python -m hpctf --version` on the node)",
            )
        )

    rows = []
    for (node, check), entries in per_check.items():
        worst = max(SEVERITY.get(status, 3) for _, status, _, _ in entries)
        chosen = [e for e in entries if SEVERITY.get(e[1], 3) == worst]
        chosen.sort()
        details = {detail for _, _, detail, _ in chosen}
        if len(details) == 1:
            detail = chosen[0][2]
        elif worst <= SEVERITY["ok"]:  # all well: the first task's words stand for the rest
            rank, status, text, _ = chosen[0]
            detail = f"{text} (rank {rank}; {len(chosen) - 1} other task(s) {status} too)"
        else:
            detail = "; ".join(f"rank {rank}: {text}" for rank, _, text, _ in chosen)
        fix = next((fix for _, _, _, fix in chosen if fix), "")
        rows.append(Row(node, check, chosen[0][1], detail, fix))
    position = {node: i for i, node in enumerate(order)}
    rows.sort(
        key=lambda row: (
            position.get(row.node, len(order)),
            CHECKS.index(row.check) if row.check in CHECKS else len(CHECKS),
        )
    )
    nodes = tuple(order) + tuple(missing_nodes)
    return Verdict(tuple(extra + rows), nodes, len(ranks), expected)


def format_table(verdict: Verdict) -> str:
    """The table (one line per node and check), then one line per failed and warned check
    naming node and fix, then a summary line."""
    header = Row("NODE", "CHECK", "STATUS", "DETAIL")
    rows = [header, *verdict.rows]
    node_width = max(len(row.node) for row in rows)
    check_width = max(len(row.check) for row in rows)
    lines = [
        f"{row.node.ljust(node_width)}  {row.check.ljust(check_width)}  {row.status.ljust(6)}  "
        f"{row.detail}".rstrip()
        for row in rows
    ]
    problems = verdict.failed + verdict.warned
    if problems:
        lines.append("")
    for row in problems:
        where = row.node if row.node != "-" else "job"
        fix = f"; fix: {row.fix}" if row.fix else ""
        lines.append(f"{row.status.upper()} {where}: {row.check}: {row.detail}{fix}")
    nodes = len([n for n in verdict.nodes if n != "-"])
    scope = f"{nodes} node(s), {verdict.reported} of {verdict.expected} task(s) reported"
    if verdict.passed:
        warned = f" ({len(verdict.warned)} warning(s))" if verdict.warned else ""
        lines.append(f"doctor: all checks passed{warned}; {scope}")
    else:
        lines.append(
            f"doctor: {len(verdict.failed)} check(s) failed, {len(verdict.warned)} warning(s); "
            f"{scope}"
        )
    return "\n".join(lines) + "\n"


def verdict_document(verdict: Verdict, **context: Any) -> dict[str, Any]:
    """What ``--json`` prints: the context (site, directory, job) and the judged rows."""
    return {
        **context,
        "passed": verdict.passed,
        "nodes": list(verdict.nodes),
        "tasks_reported": verdict.reported,
        "tasks_expected": verdict.expected,
        "rows": [asdict(row) for row in verdict.rows],
        "failed": [asdict(row) for row in verdict.failed],
        "warned": [asdict(row) for row in verdict.warned],
    }


# --- planning, rendering, running -------------------------------------------------------------


def doctor_config(site: Site, nodes: int, timeout: int, env: Mapping[str, str]) -> ResolvedConfig:
    """The site resolved as for a training job of ``nodes`` nodes limited to ``timeout``:
    every request default, the python and runs_root expanded, by the same merge as submit."""
    minutes = max(1, math.ceil(timeout / 60))
    experiment = Experiment(
        name="hpctf-doctor",
        resources=Resources(nodes=nodes, time=str(minutes)),
        train=Train(entry="hpctf.compute.preflight:run_preflight", global_batch_size=1, steps=1),
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
    root = Path(config.site.runs_root).resolve()
    base = f"doctor-{config.site.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    for attempt in range(1000):
        path = root / (base if attempt == 0 else f"{base}-{attempt}")
        if not path.exists():
            return path
    raise UserError(f"cannot find a free doctor directory name under {root}")


def render_script(config: ResolvedConfig, directory: Path) -> str:
    """The doctor's batch script, through the one Jinja environment (its quoting rules)."""
    res = config.experiment.resources
    context = {
        "version": __version__,
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
        "env": sorted(config.site.env.items()),
        "setup": [ShellCode(line.rstrip("\n")) for line in config.site.setup],
        "nodes": res.nodes,
        "tasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
    }
    return ENVIRONMENT.get_template(TEMPLATE).render(context)


def prepare_directory(config: ResolvedConfig, directory: Path, timeout: int) -> Path:
    """Create the doctor directory with its settings and script; return the script's path."""
    try:
        for sub in ("logs", RESULTS_DIR, NCCL_DIR):
            (directory / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {directory}: {exc.strerror or exc}") from None
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
    write_atomic(script, render_script(config, directory))
    script.chmod(0o755)
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
    """The tasks as processes on this machine (as :mod:`hpctf.login.local` starts workers);
    returns how many ran. Unlike a training run, one task failing stops none of the others."""
    ntasks = config.ntasks
    base = {**env, **config.site.env}
    job_id = os.getpid()
    procs = []
    for rank in range(ntasks):
        with (directory / "logs" / f"rank-{rank}.log").open("ab") as log_file:
            procs.append(
                subprocess.Popen(
                    [config.python, "-m", "hpctf", "preflight", str(directory)],
                    env=task_environment(base, job_id, ntasks, rank),
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return ntasks


def run_slurm(
    directory: Path, script: Path, env: Mapping[str, str], timeout: int
) -> tuple[str, list[str] | None, tuple[str, str] | None]:
    """Submit the doctor's job and wait for it: (job id, its nodes, a job-level problem)."""
    job_id, dropped = slurm.sbatch(script, env)
    if dropped:
        click.echo(f"doctor: left out {', '.join(dropped)} from your shell", err=True)
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
    (directory / "logs" / "here.out").write_text(output + "\n", encoding="utf-8")
    if proc.returncode != 0:
        last = output.splitlines()[-1][:300] if output else "no output"
        return (
            f"the script exited {proc.returncode}: {last}",
            f"see {directory / 'logs' / 'here.out'}",
        )
    return None


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
    if here:
        if site.scheduler != "slurm":
            raise UserError(f"--here runs inside a Slurm allocation; site {site.name} is local")
        if not env.get("SLURM_JOB_ID"):
            raise UserError(
                "--here runs inside an allocation, but SLURM_JOB_ID is not set: start one "
                "(salloc -N 2 ...) and run hpctf doctor --here in it, or leave out --here"
            )
        allocated = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
        nodes = nodes or (int(allocated) if allocated.isdigit() else 1)
    config = doctor_config(site, nodes or 2, timeout, env)
    directory = plan_directory(config)
    script = prepare_directory(config, directory, timeout)
    logs = str(directory / "logs")
    job_id: str | None = None
    expected_nodes: list[str] | None = None
    problem: tuple[str, str] | None = None
    if site.scheduler == "local":
        click.echo(f"doctor: {config.ntasks} local task(s); results in {directory}", err=True)
        run_local(config, directory, env, timeout)
        expected_nodes = ["localhost"]
    elif here:
        click.echo(f"doctor: job {env['SLURM_JOB_ID']}, {nodes} node(s); in {directory}", err=True)
        job_id = env["SLURM_JOB_ID"]
        problem = run_here(script, env, timeout, directory)
        allocation = env.get("SLURM_JOB_NODELIST", "")
        if allocation and str(nodes) == env.get("SLURM_JOB_NUM_NODES"):
            expected_nodes = expand_nodelist(allocation)
    else:
        job_id, expected_nodes, problem = run_slurm(directory, script, env, timeout)
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
