"""`hpctf doctor`: the pure judging and table, the rendered script, and real runs (local
processes, the Slurm test cluster, and a site whose hostname_template gives names that do not
resolve)."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpctf.cli import cli
from hpctf.compute.doctor.infiniband import IbPort, infiniband_check, read_infiniband
from hpctf.compute.doctor.node_checks import hostnames_check, memlock_check, scan_nccl_log
from hpctf.compute.start.preflight import busbw_gbps, error_line
from hpctf.core.errors import UserError
from hpctf.core.scheduler import slurm
from hpctf.core.settings.sites import load_named_site
from hpctf.login.doctor.doctor_commands import doctor_config, prepare_directory, render_script
from hpctf.login.doctor.verdict import evaluate, format_table, merge_allreduce, verdict_document
from hpctf.login.resolving.loader import load_config
from hpctf.login.submitting.render import render
from tests.conftest import DIGITS, HPCTF, require_tool, write

# --- the checks a task judges itself -----------------------------------------------------------


def test_memlock_unlimited_is_ok_and_a_low_limit_warns_only_with_infiniband() -> None:
    assert memlock_check(resource.RLIM_INFINITY, infiniband=True).status == "ok"
    assert memlock_check(64 * 1024, infiniband=False).status == "ok"
    low = memlock_check(64 * 1024, infiniband=True)
    assert (low.status, low.detail) == ("warn", "64 KiB with InfiniBand: RDMA may fail")
    assert "memlock unlimited" in low.fix and "PropagateResourceLimits" in low.fix


def port(device: str, state: str = "ACTIVE", number: str = "1") -> IbPort:
    return IbPort(device, number, state, "200 Gb/sec (4X HDR)", "InfiniBand")


def test_infiniband_skipped_without_sysfs_but_failed_when_the_site_names_hcas() -> None:
    assert infiniband_check(None, None).status == "skip"
    assert infiniband_check([], "").status == "skip"
    missing = infiniband_check(None, "=mlx5_0")
    assert missing.status == "fail" and "driver is not loaded" in missing.fix
    assert infiniband_check(None, "^mlx5_0").status == "skip"  # only excludes


def test_infiniband_ports_against_nccl_ib_hca() -> None:
    ports = [port("mlx5_0"), port("mlx5_1", "DOWN"), port("mlx5_10")]
    ok = infiniband_check([ports[0]], None)
    assert (ok.status, ok.detail) == ("ok", "mlx5_0:1 ACTIVE 200 Gb/sec (4X HDR)")
    # Every port may be used: one down among others is a warning.
    assert infiniband_check(ports, None).status == "warn"
    # Named by the site: a down port NCCL was told to use fails.
    assert infiniband_check(ports, "=mlx5_0,mlx5_1").status == "fail"
    # Without "=", mlx5_1 is a prefix: it also picks mlx5_10 (NCCL's rule).
    assert "mlx5_10:1" in infiniband_check(ports, "mlx5_1").detail
    assert "mlx5_10" not in infiniband_check(ports, "=mlx5_1").detail
    assert infiniband_check(ports, "^mlx5_1").status == "ok"  # the down ones excluded
    assert infiniband_check(ports, "=mlx5_0:1").status == "ok"
    absent = infiniband_check(ports, "=mlx5_0,mlx5_7")
    assert absent.status == "fail" and "names mlx5_7, which this node lacks" in absent.detail
    assert infiniband_check([port("a", "DOWN"), port("b", "INIT")], None).status == "fail"


def test_read_infiniband_from_sysfs(tmp_path: Path) -> None:
    assert read_infiniband(tmp_path / "absent") is None
    for device, state in (("mlx5_1", "1: DOWN"), ("mlx5_0", "4: ACTIVE")):
        base = tmp_path / device / "ports" / "1"
        write(base / "state", state + "\n")
        write(base / "rate", "100 Gb/sec (4X EDR)\n")
        write(base / "link_layer", "InfiniBand\n")
    assert read_infiniband(tmp_path) == [
        IbPort("mlx5_0", "1", "ACTIVE", "100 Gb/sec (4X EDR)", "InfiniBand"),
        IbPort("mlx5_1", "1", "DOWN", "100 Gb/sec (4X EDR)", "InfiniBand"),
    ]


def test_hostnames_name_each_unresolved_node_and_the_fix() -> None:
    names = [("node1-ib", "node1"), ("node2-ib", "node2")]
    assert hostnames_check(names, "{host}-ib", lambda n: None).status == "ok"
    bad = hostnames_check(names, "{host}-ib", lambda n: "Name or service not known")
    assert bad.status == "fail"
    assert bad.detail == (
        "node1-ib (node1), node2-ib (node2) of 2 names do not resolve here: "
        "Name or service not known"
    )
    assert "hostname_template '{host}-ib'" in bad.fix
    one = hostnames_check(names, "{host}-ib", lambda n: "no" if n == "node2-ib" else None)
    assert one.detail == "node2-ib (node2) does not resolve here: no"


NCCL_IB = """\
node1:1234:1234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
node1:1234:1234 [0] NCCL INFO Using network IB
"""
NCCL_SOCKET = """\
node1:1234:1234 [0] NCCL INFO NET/IB : No device found.
node1:1234:1234 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
node1:1234:1234 [0] NCCL INFO Using network Socket
"""


def test_nccl_log_socket_fallback_fails_only_where_infiniband_exists() -> None:
    fallback = scan_nccl_log(NCCL_SOCKET, infiniband=True, path="nccl/rank-0.log")
    assert fallback.status == "fail"
    assert "NET/Socket" in fallback.detail and "libibverbs" in fallback.fix
    assert "nccl/rank-0.log" in fallback.fix
    assert scan_nccl_log(NCCL_IB, infiniband=True, path="x").status == "ok"
    assert "network IB" in scan_nccl_log(NCCL_IB, infiniband=True, path="x").detail
    assert scan_nccl_log(NCCL_SOCKET, infiniband=False, path="x").status == "ok"
    assert scan_nccl_log("", infiniband=True, path="x").status == "warn"
    channels = "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    assert scan_nccl_log(channels, infiniband=True, path="x").status == "fail"


def test_bus_bandwidth_as_nccl_tests_defines_it() -> None:
    assert busbw_gbps(10**9, 1.0, 2) == pytest.approx(1.0)
    assert busbw_gbps(10**9, 1.0, 8) == pytest.approx(1.75)
    assert busbw_gbps(10**9, 0.5, 4) == pytest.approx(3.0)
    assert busbw_gbps(10**9, 1.0, 1) == 0.0


def test_error_line_keeps_what_tensorflow_said() -> None:
    text = (
        'in user code:\n\n    File "x.py", line 3, in f  *\n        return g()\n\n    boom here\n'
    )
    assert error_line(ValueError(text)) == "ValueError: boom here"
    assert error_line(RuntimeError("DeadlineExceeded: no peer")) == "DeadlineExceeded: no peer"


# --- judging every task's report together --------------------------------------------------


def report(
    rank: int,
    node: str,
    *,
    python: str = "3.11.7",
    checks: list[dict[str, str]] | None = None,
    allreduce: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "rank": rank,
        "node": node,
        "facts": {"python": python, "hpctf": "0.1.0", "tensorflow": "2.21.0"},
        "checks": checks
        if checks is not None
        else [{"check": "port", "status": "ok", "detail": f"worker port {20000 + rank} free"}],
        "allreduce": allreduce if allreduce is not None else ring(0.004),
    }


def ring(seconds: float, ranks: int = 2) -> dict[str, Any]:
    sizes = [(1 << 10, seconds / 2), (1 << 20, seconds)]
    return {
        "status": "ok",
        "implementation": "RING",
        "ranks": ranks,
        "sizes": [
            {"bytes": b, "seconds": s, "busbw_gbps": busbw_gbps(b, s, ranks)} for b, s in sizes
        ],
    }


def test_all_passing_reports_make_one_row_per_node_and_check() -> None:
    verdict = evaluate([report(0, "node1"), report(1, "node2")], 2, ["node1", "node2"])
    assert verdict.passed
    assert [(r.node, r.check, r.status) for r in verdict.rows] == [
        ("node1", "versions", "ok"),
        ("node1", "port", "ok"),
        ("node1", "allreduce", "ok"),
        ("node2", "versions", "ok"),
        ("node2", "port", "ok"),
        ("node2", "allreduce", "ok"),
    ]
    assert verdict.rows[2].detail == "RING, 2 ranks: 1 KiB 2.00 ms, 1 MiB 4.00 ms 0.26 GB/s"
    table = format_table(verdict)
    assert table.splitlines()[0].split() == ["NODE", "CHECK", "STATUS", "DETAIL"]
    assert table.splitlines()[-1] == (
        "doctor: all checks passed; 2 node(s), 2 of 2 task(s) reported"
    )


def test_a_python_that_differs_fails_on_its_node_only() -> None:
    verdict = evaluate([report(0, "n1"), report(1, "n2"), report(2, "n3", python="3.10.12")], 3)
    versions = {r.node: r for r in verdict.rows if r.check == "versions"}
    assert versions["n1"].status == versions["n2"].status == "ok"
    assert versions["n3"].status == "fail"
    assert versions["n3"].detail == "Python 3.10.12 (most tasks: 3.11.7)"
    assert "FAIL n3: versions: Python 3.10.12 (most tasks: 3.11.7); fix: use one environment" in (
        format_table(verdict)
    )


def test_silent_nodes_and_tasks_fail_report() -> None:
    verdict = evaluate([report(0, "node1")], 2, ["node1", "node2"], logs="/d/logs")
    (row,) = [r for r in verdict.rows if r.check == "report"]
    assert (row.node, row.status, row.detail) == ("node2", "fail", "no result from this node")
    assert "/d/logs" in row.fix
    assert verdict.nodes == ("node1", "node2")
    unknown = evaluate([report(0, "node1")], 3)
    (row,) = [r for r in unknown.rows if r.check == "report"]
    assert row.detail == "2 of 3 tasks wrote no result (ranks 1, 2)"


def test_allreduce_outcomes() -> None:
    pending = evaluate([report(0, "a", allreduce={"status": "pending"})], 1)
    assert [r.status for r in pending.rows if r.check == "allreduce"] == ["fail"]
    failed = report(0, "a", allreduce={"status": "fail", "error": "DeadlineExceeded: x"})
    (row,) = [r for r in evaluate([failed], 1).rows if r.check == "allreduce"]
    assert (row.status, row.detail) == ("fail", "DeadlineExceeded: x")
    assert "a peer did not join" in row.fix
    # Skipped because this task's own check failed: that check carries the failure.
    blocked = report(
        0,
        "a",
        checks=[{"check": "hostnames", "status": "fail", "detail": "x", "fix": "y"}],
        allreduce={"status": "skip", "error": "not run: hostnames failed"},
    )
    verdict = evaluate([blocked], 1)
    assert [(r.check, r.status) for r in verdict.failed] == [("hostnames", "fail")]


def test_bandwidth_threshold_applies_to_the_largest_message() -> None:
    reports = [report(0, "a"), report(1, "b")]  # 1 MiB in 4 ms over 2 ranks: 0.26 GB/s
    assert evaluate(reports, 2, min_busbw_gbps=0.2).passed
    slow = evaluate(reports, 2, min_busbw_gbps=5)
    assert {r.node for r in slow.failed} == {"a", "b"}
    assert "busbw 0.26 GB/s at 1 MiB is below the site's doctor.min_busbw_gbps 5" in (
        slow.failed[0].detail
    )


def test_tasks_of_one_node_merge_worst_first_and_slowest_time() -> None:
    fast, slow = ring(0.002), ring(0.008)
    merged = merge_allreduce([fast, slow])
    assert [s["seconds"] for s in merged["sizes"]] == [0.004, 0.008]
    assert merged["sizes"][1]["busbw_gbps"] == pytest.approx(busbw_gbps(1 << 20, 0.008, 2))
    bad_port = [{"check": "port", "status": "fail", "detail": "port 20001 taken", "fix": "f"}]
    verdict = evaluate(
        [
            report(0, "n", allreduce=fast),
            report(1, "n", allreduce=slow, checks=bad_port),
            report(2, "n", allreduce=fast),
        ],
        3,
    )
    rows = {r.check: r for r in verdict.rows}
    assert (rows["port"].status, rows["port"].detail) == ("fail", "port 20001 taken")
    assert "8.00 ms" in rows["allreduce"].detail
    ok = evaluate([report(0, "n"), report(1, "n")], 2)
    port_row = next(r for r in ok.rows if r.check == "port")
    assert port_row.detail == "worker port 20000 free (rank 0; 1 other task(s) ok too)"


def test_job_problem_leads_and_the_document_carries_every_row() -> None:
    verdict = evaluate([], 2, job_problem=("job 7 ended FAILED (exit 1:0): boom", "see out"))
    assert verdict.rows[0].node == "-" and verdict.rows[0].check == "job"
    assert "FAIL job: job: job 7 ended FAILED (exit 1:0): boom; fix: see out" in format_table(
        verdict
    )
    document = verdict_document(verdict, site="s", job_id="7")
    assert document["passed"] is False and document["site"] == "s"
    assert {r["check"] for r in document["failed"]} == {"job", "report"}
    json.dumps(document)


# --- the job -------------------------------------------------------------------------------


def test_doctor_config_takes_the_sites_request_and_leaves_out_its_signal(
    tmp_path: Path, runs_root: Path
) -> None:
    site = load_named_site("ib-8gpu", os.environ)
    config = doctor_config(site, 3, 300, {**os.environ, "HOME": str(tmp_path)})
    res = config.experiment.resources
    assert (res.nodes, res.partition, res.gpus_per_node, res.time) == (3, "gpu", 8, "5")
    script = render_script(config, tmp_path / "d")
    assert "#SBATCH --nodes=3" in script and "#SBATCH --time=5" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert "--signal" not in script and "--requeue" not in script
    assert f"#SBATCH --output={tmp_path}/d/logs/slurm-%j.out" in script
    assert '"$PYTHON" -m hpctf preflight "$DOCTOR_DIR"' in script


def _environment_lines(script: str) -> list[str]:
    keep = ("module load ", "source ", "export ", "ulimit ", "nvidia-smi")
    return [line for line in script.splitlines() if line.startswith(keep)]


def test_doctor_script_sets_up_the_software_exactly_as_the_training_job(
    tmp_path: Path, runs_root: Path
) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    training = load_config(DIGITS, "ib-8gpu", [], env).config
    config = doctor_config(load_named_site("ib-8gpu", env), 2, 300, env)
    doctor_lines = _environment_lines(render_script(config, tmp_path / "d"))
    assert doctor_lines == _environment_lines(render(training, tmp_path / "run"))
    assert any(line.startswith("module load 'cuda/12.4'") for line in doctor_lines)


def test_doctor_script_passes_shellcheck_and_hostile_values_stay_literal(
    tmp_path: Path, runs_root: Path
) -> None:
    hostile = "$(touch pwned) `touch pwned2` 'single' \"double\" * ; & | ${HOME} \\ !x"
    site_file = write(
        tmp_path / "sites" / "hostile.yaml",
        json.dumps(
            {
                "name": "hostile",
                "scheduler": "slurm",
                "runs_root": str(runs_root),
                "env": {"HOSTILE": hostile},
                "modules": ["mod/1"],
            }
        ),
    )
    env = {**os.environ, "HPCTF_SITE_PATH": str(site_file.parent)}
    config = doctor_config(load_named_site("hostile", env), 2, 120, env)
    directory = runs_root / "doctor"
    script = prepare_directory(config, directory, 120)
    lint = subprocess.run([require_tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # srun and module as recorders: what the tasks would get is what the site said.
    bin_dir = tmp_path / "bin"
    got = tmp_path / "got"
    write(bin_dir / "srun", f'#!/bin/bash\nprintf %s "$HOSTILE" > {got}\n').chmod(0o755)
    write(bin_dir / "module", "#!/bin/bash\nexit 0\n").chmod(0o755)
    run_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(script)], env=run_env, cwd=tmp_path, check=True)
    assert got.read_text() == hostile
    assert not list(tmp_path.glob("pwned*"))
    settings = json.loads((directory / "doctor.json").read_text())
    assert settings["site"]["name"] == "hostile" and settings["nodes"] == 2


def test_here_needs_an_allocation_and_a_slurm_site(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = CliRunner().invoke(cli, ["doctor", "--site", "local-slurm", "--here"])
    assert result.exit_code == 2
    assert "SLURM_JOB_ID is not set" in result.output
    result = CliRunner().invoke(cli, ["doctor", "--site", "local", "--here"])
    assert result.exit_code == 2 and "site local is local" in result.output


def test_wait_for_job_polls_until_a_final_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake scontrol (unit test only): RUNNING twice, then COMPLETED; job 6 was forgotten,
    job 7 is stuck."""
    count = tmp_path / "count"
    write(
        tmp_path / "bin" / "scontrol",
        f"""#!/bin/bash
id=${{@: -1}}
[ "$id" = 6 ] && {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }}
n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}
if [ "$id" = 7 ] || [ "$n" -lt 2 ]; then state=RUNNING; else state=COMPLETED; fi
echo "JobId=$id JobState=$state NodeList=node[1-2]"
""",
    ).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    info = slurm.wait_for_job("5", timeout=30, poll=0.01)
    assert info is not None and info["JobState"] == "COMPLETED" and count.read_text() == "3\n"
    assert info["JobId"] == "5"
    assert slurm.wait_for_job("6", timeout=30, poll=0.01) == {}
    assert slurm.wait_for_job("7", timeout=0.1, poll=0.02) is None


def test_unknown_site_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--site", "no-such-site"])
    assert result.exit_code == 2 and "unknown site 'no-such-site'" in result.output
    with pytest.raises(UserError):
        load_named_site("no-such-site", os.environ)


# --- real runs -----------------------------------------------------------------------------


def doctor_run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCTF, "doctor", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


def rows_of(table: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, check) -> (status, detail) from the printed table."""
    rows = {}
    for line in table.splitlines()[1:]:
        if not line.strip() or line.startswith("doctor: "):
            break
        node, check, status, *detail = line.split(maxsplit=3)
        rows[(node, check)] = (status, detail[0] if detail else "")
    return rows


@pytest.mark.tf
def test_doctor_on_the_local_site_passes_with_a_ring_allreduce(
    tmp_path: Path, runs_root: Path
) -> None:
    proc = doctor_run(
        {**os.environ, "HPCTF_RUNS_ROOT": str(runs_root)}, tmp_path, "--site", "local"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_of(proc.stdout)
    checks = [
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
    ]
    assert [check for node, check in rows] == checks
    assert {node for node, _ in rows} == {"localhost"}
    assert {status for status, _ in rows.values()} <= {"ok", "skip"}
    assert re.fullmatch(
        r"RING, 2 ranks: 1 KiB [\d.]+ ms, "
        r"64 KiB [\d.]+ ms [\d.]+ GB/s, 1 MiB [\d.]+ ms [\d.]+ GB/s",
        rows[("localhost", "allreduce")][1],
    )
    assert proc.stdout.splitlines()[-1] == (
        "doctor: all checks passed; 1 node(s), 2 of 2 task(s) reported"
    )
    (directory,) = runs_root.glob("doctor-local-*")
    assert sorted(p.name for p in (directory / "results").iterdir()) == [
        "rank-0.json",
        "rank-1.json",
    ]
    verdict = json.loads((directory / "verdict.json").read_text())
    assert verdict["passed"] is True and verdict["tasks_reported"] == 2


@pytest.mark.slurm
@pytest.mark.tf
def test_doctor_on_two_slurm_nodes_passes(slurm_cluster: dict[str, str], tmp_path: Path) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    proc = doctor_run(env, tmp_path, "--site", "local-slurm", "--nodes", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert document["passed"] is True and document["nodes"] == ["node1", "node2"]
    assert (document["tasks_reported"], document["tasks_expected"]) == (2, 2)
    by_node: dict[str, dict[str, str]] = {}
    for row in document["rows"]:
        by_node.setdefault(row["node"], {})[row["check"]] = row["status"]
    for node in ("node1", "node2"):
        assert by_node[node]["hostnames"] == by_node[node]["allreduce"] == "ok", document
        assert by_node[node]["tensorflow"] == by_node[node]["port"] == "ok"
    assert f"submitted job {document['job_id']}" in proc.stderr


@pytest.mark.slurm
@pytest.mark.tf
def test_doctor_here_runs_inside_an_allocation(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_cluster, "HPCTF_RUNS_ROOT": str(tmp_path / "runs")}
    command = [*HPCTF, "doctor", "--site", "local-slurm", "--here"]
    proc = subprocess.run(
        [require_tool("salloc"), "-N2", "-p", "debug", *command],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_of(proc.stdout)
    assert {node for node, _ in rows} == {"node1", "node2"}
    assert rows[("node1", "allreduce")][1].startswith("RING, 2 ranks: ")
    assert proc.stdout.splitlines()[-1] == (
        "doctor: all checks passed; 2 node(s), 2 of 2 task(s) reported"
    )
    # No job of its own: the step ran in the allocation's job.
    (directory,) = (tmp_path / "runs").glob("doctor-local-slurm-*")
    assert not list((directory / "logs").glob("slurm-*.out"))


@pytest.mark.slurm
@pytest.mark.tf
def test_doctor_names_the_nodes_whose_names_do_not_resolve(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    sites = tmp_path / "sites"
    write(
        sites / "bad-names.yaml",
        'name: bad-names\nextends: local-slurm\nhostname_template: "{host}-nope"\n',
    )
    env = {
        **slurm_cluster,
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_SITE_PATH": str(sites),
    }
    proc = doctor_run(env, tmp_path, "--site", "bad-names", "--nodes", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = rows_of(proc.stdout)
    for node in ("node1", "node2"):
        assert rows[(node, "hostnames")][0] == "fail"
        assert rows[(node, "allreduce")] == ("skip", "not run: hostnames failed")
        failure = next(
            line for line in proc.stdout.splitlines() if line.startswith(f"FAIL {node}:")
        )
        assert failure.startswith(
            f"FAIL {node}: hostnames: node1-nope (node1), node2-nope (node2) of 2 names do not "
            "resolve here"
        )
        assert "; fix: hostname_template '{host}-nope' must give names the nodes resolve" in failure
    assert proc.stdout.splitlines()[-1].startswith("doctor: 2 check(s) failed")


@pytest.mark.slurm
@pytest.mark.tf
def test_doctor_names_the_node_whose_python_lacks_tensorflow(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """The site's python is a wrapper that, on node2 only, finds a tensorflow that does not
    import: node2 fails its tensorflow check, and node1 does not wait for it in the all-reduce."""
    broken = write(
        tmp_path / "broken" / "tensorflow" / "__init__.py",
        'raise ImportError("libcudart.so.12: cannot open shared object file")\n',
    )
    wrapper = write(
        tmp_path / "python",
        f"""#!/bin/bash
if [ "${{SLURMD_NODENAME:-}}" = node2 ]; then export PYTHONPATH={broken.parent.parent}; fi
exec {sys.executable} "$@"
""",
    )
    wrapper.chmod(0o755)
    sites = tmp_path / "sites"
    write(sites / "tf-on-one.yaml", f"name: tf-on-one\nextends: local-slurm\npython: {wrapper}\n")
    env = {
        **slurm_cluster,
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_SITE_PATH": str(sites),
    }
    started = time.monotonic()
    proc = doctor_run(env, tmp_path, "--site", "tf-on-one", "--nodes", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - started < 120  # nobody waited for the watchdog
    rows = rows_of(proc.stdout)
    assert rows[("node1", "tensorflow")][0] == "ok"
    assert rows[("node2", "tensorflow")] == (
        "fail",
        f"cannot import tensorflow with {sys.executable}: libcudart.so.12: cannot open shared "
        "object file",
    )
    assert rows[("node1", "allreduce")] == (
        "skip",
        "not run: tensorflow failed on node2 (rank-1)",
    )
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 1 and failures[0].startswith("FAIL node2: tensorflow: cannot import")
    assert "; fix: install hpctf[tf] (CPU nodes) or hpctf[gpu] (GPU nodes)" in failures[0]


@pytest.mark.slurm
@pytest.mark.tf
def test_doctor_names_the_node_whose_worker_port_is_taken(
    slurm_cluster: dict[str, str], tmp_path: Path
) -> None:
    """The site's python is a wrapper that, on node2 only, first starts a listener on the port
    that node2's task will check (``hpctf tfconfig`` in the same step computes it): node2 fails
    its port check naming the port, and node1 does not wait for it in the all-reduce."""
    holder = write(
        tmp_path / "hold_port.py",
        """import json, socket, sys, time
spec = json.loads(sys.argv[1])
port = int(spec["cluster"]["worker"][spec["task"]["index"]].rpartition(":")[2])
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("", port))
listener.listen()
with open(sys.argv[2], "w") as ready:
    ready.write(str(port))
time.sleep(90)  # ended with the step; bounded in case it is not
""",
    )
    sites = tmp_path / "sites"
    site = write(sites / "port-on-one.yaml", "name: port-on-one\nextends: local-slurm\n")
    held = tmp_path / "held-port"
    wrapper = write(
        tmp_path / "python",
        f"""#!/bin/bash
if [ "${{SLURMD_NODENAME:-}}" = node2 ] && [ "${{3:-}}" = preflight ]; then
  spec=$({sys.executable} -m hpctf tfconfig --site {site}) || exit 1
  {sys.executable} {holder} "$spec" {held}.tmp &
  for _ in $(seq 100); do [ -s {held}.tmp ] && break; sleep 0.1; done
  mv {held}.tmp {held}
fi
exec {sys.executable} "$@"
""",
    )
    wrapper.chmod(0o755)
    site.write_text(site.read_text() + f"python: {wrapper}\n")
    env = {
        **slurm_cluster,
        "HPCTF_RUNS_ROOT": str(tmp_path / "runs"),
        "HPCTF_SITE_PATH": str(sites),
    }
    started = time.monotonic()
    proc = doctor_run(env, tmp_path, "--site", "port-on-one", "--nodes", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - started < 120  # nobody waited for the watchdog
    port = held.read_text()
    rows = rows_of(proc.stdout)
    assert rows[("node1", "port")][0] == "ok"
    assert rows[("node2", "port")] == (
        "fail",
        f"port {port} on node2 is taken (Address already in use): another job or a leftover "
        "process listens there; hpctf picks ports from the site's port_range by job id",
    )
    assert rows[("node1", "allreduce")] == ("skip", "not run: port failed on node2 (rank-1)")
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 1 and failures[0].startswith(f"FAIL node2: port: port {port} on")
    assert f"; fix: find the listener with `ss -ltnp 'sport = :{port}'` on node2" in failures[0]
