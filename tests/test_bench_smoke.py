"""The fleet benchmark still runs end to end: a benchmark that silently breaks is worse than none.

Runs `bench/run.py` as a user would, at a tiny size (5 services, 5 proxies, the floor included,
no sweep), and checks the machine-readable last line. No numbers are asserted: they come from
benchmarks run on demand, not from a test on a shared machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_tiny_fleet_benchmark_prints_its_json_line_last() -> None:
    command = [sys.executable, str(RUN), "--services", "5", "--endpoints", "2", "--proxies", "5"]
    command += ["--idle", "0.5", "--workers", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.keys() >= KEYS
    assert (result["proxies"], result["services"]) == (5, 5)
    assert result["failures"] == 0 and result["nacks"] == 0 and result["server_errors"] == 0
    for key in KEYS - {"proxies", "services"}:
        assert isinstance(result[key], float) and result[key] > 0, key
    # Every change reached every proxy it affects, on meshctl and on the floor.
    assert set(result["phases"]) == {"VirtualService", "DestinationRule", "endpoint added", "endpoint removed"}
    assert all(p["missing"] == 0 for p in [*result["phases"].values(), *result["floor"]["phases"].values()])
    assert "| phase |" in proc.stdout
