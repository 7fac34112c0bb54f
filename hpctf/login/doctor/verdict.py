"""The doctor's verdict, pure: every task's report of ``hpctf preflight`` judged together.

- :func:`evaluate`: per node and check the worst status of its tasks; the versions compared
  across all tasks; tasks that never reported; the all-reduce against the site's
  ``doctor.min_busbw_gbps``;
- :func:`format_table`: one line per node and check, then one line per failed (or warned)
  check naming the node and the fix;
- :func:`verdict_document`: the same as one JSON-ready mapping (``--json``, verdict.json).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SEVERITY = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}
CHECKS = (
    "job",
    "report",
    "cluster",
    "versions",
    "tensorflow",
    "memlock",
    "infiniband",
    "nccl_ib_hca",
    "nccl_socket_ifname",
    "verbs",
    "hostnames",
    "port",
    "allreduce",
    "nccl",
)


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


# (rank, status, detail, fix) of every task's result, by (node, check)
_Entries = dict[tuple[str, str], list[tuple[int, str, str, str]]]


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
    per_check = _task_entries(reports, min_busbw_gbps, logs)
    order: list[str] = []
    for report in sorted(reports, key=lambda r: int(r.get("rank") or 0)):
        if str(report.get("node", "?")) not in order:
            order.append(str(report.get("node", "?")))
    missing_nodes = [n for n in expected_nodes or () if n not in order]
    ranks = {int(r["rank"]) for r in reports if r.get("rank") is not None}
    extra = _missing_rows(ranks, expected, missing_nodes, logs, job_problem)
    rows = [_merged_row(node, check, entries) for (node, check), entries in per_check.items()]
    position = {node: i for i, node in enumerate(order)}
    rows.sort(
        key=lambda row: (
            position.get(row.node, len(order)),
            CHECKS.index(row.check) if row.check in CHECKS else len(CHECKS),
        )
    )
    nodes = tuple(order) + tuple(missing_nodes)
    return Verdict(tuple(extra + rows), nodes, len(ranks), expected)


def _task_entries(
    reports: Sequence[Mapping[str, Any]], min_busbw_gbps: float | None, logs: str
) -> _Entries:
    """Every task's checks, its all-reduce (merged per node where none of the node's tasks
    failed it) and its versions against the most common ones."""
    per_check: _Entries = {}

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
    return per_check


def _missing_rows(
    ranks: set[int],
    expected: int,
    missing_nodes: Sequence[str],
    logs: str,
    job_problem: tuple[str, str] | None,
) -> list[Row]:
    """The rows for what did not report: the job itself, whole nodes, single tasks."""
    extra: list[Row] = []
    if job_problem is not None:
        extra.append(Row("-", "job", "fail", *job_problem))
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
    return extra


def _merged_row(node: str, check: str, entries: list[tuple[int, str, str, str]]) -> Row:
    """One row for the tasks of ``node`` that ran ``check``: the worst status, in its tasks'
    words (one text when they agree)."""
    worst = max(SEVERITY.get(status, 3) for _, status, _, _ in entries)
    chosen = sorted(e for e in entries if SEVERITY.get(e[1], 3) == worst)
    details = {detail for _, _, detail, _ in chosen}
    if len(details) == 1:
        detail = chosen[0][2]
    elif worst <= SEVERITY["ok"]:  # all well: the first task's words stand for the rest
        rank, status, text, _ = chosen[0]
        detail = f"{text} (rank {rank}; {len(chosen) - 1} other task(s) {status} too)"
    else:
        detail = "; ".join(f"rank {rank}: {text}" for rank, _, text, _ in chosen)
    fix = next((fix for _, _, _, fix in chosen if fix), "")
    return Row(node, check, chosen[0][1], detail, fix)


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
