"""How long `meshctl serve` takes to start on a large mesh, and what it weighs once ready.

    python bench/serve_start.py                        # 10,000 services, 2 WorkloadEntries each
    python bench/serve_start.py --services 1000 --runs 3
    python bench/serve_start.py --profile /tmp/serve.prof   # one run under cProfile

The mesh is `bench/meshgen.py`'s, written to a temporary directory. `meshctl serve` is started
as a user would start it (`python -m meshctl serve`, its own state directory, free ports), and
its admin port is asked for `/ready` until it answers 200: the time from the process start to
then is the start-up. Then its resident memory (VmRSS, and the peak VmHWM), its CPU seconds
(user + system, from /proc) and whether pydantic was loaded into it (`pydantic_core` among its
mappings) are read, and it is stopped with SIGTERM. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.meshgen import write_mesh  # noqa: E402
from meshctl.testing.envoy import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in MB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM"}:
            out[key] = int(value.split()[0]) // 1024
    return out


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_once(mesh: Path, state: Path, profile: str | None) -> dict[str, Any]:
    xds, admin = free_port(), free_port()
    command = [sys.executable]
    if profile:
        command += ["-m", "cProfile", "-o", profile]
    command += ["-m", "meshctl", "serve", "--config-dir", str(mesh), "--state-dir", str(state)]
    command += ["--xds-address", f"127.0.0.1:{xds}", "--admin-address", f"127.0.0.1:{admin}"]
    command += ["--log-level", "warning"]
    began = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"meshctl serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() - began > 600:
                raise RuntimeError("meshctl serve was not ready within 600 s")
            time.sleep(0.05)
        ready = time.monotonic() - began
        status = proc_status(proc.pid)
        cpu = proc_cpu(proc.pid)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "ready_s": round(ready, 2),
        "cpu_s": round(cpu, 2),
        "rss_mb": status["VmRSS"],
        "peak_rss_mb": status["VmHWM"],
        "pydantic_loaded": "pydantic_core" in maps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=2, help="WorkloadEntries per service")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", help="run once under cProfile, writing its stats here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="serve-start-") as tmp:
        mesh, state = Path(tmp) / "mesh", Path(tmp) / "state"
        resources = write_mesh(mesh, args.services, args.endpoints)
        count = 1 if args.profile else args.runs
        runs = [start_once(mesh, state, args.profile if i == 0 else None) for i in range(count)]
    load_after = os.getloadavg()
    print("| run | ready s | CPU s | RSS MB | peak RSS MB | pydantic loaded |")
    print("|---:|---:|---:|---:|---:|---|")
    for i, run in enumerate(runs, 1):
        print(
            f"| {i} | {run['ready_s']:.2f} | {run['cpu_s']:.2f} | {run['rss_mb']} | {run['peak_rss_mb']} |"
            f" {'yes' if run['pydantic_loaded'] else 'no'} |"
        )
    print(
        f"{args.services:,} services, {resources:,} resources; median ready"
        f" {statistics.median(r['ready_s'] for r in runs):.2f} s, load average {load_before[0]:.1f} before,"
        f" {load_after[0]:.1f} after"
    )
    result = {"services": args.services, "resources": resources, "runs": runs}
    print(json.dumps(result | {"load_before": load_before, "load_after": load_after}))


if __name__ == "__main__":
    main()
