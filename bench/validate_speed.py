"""Throughput and peak memory of `meshctl validate` on a generated mesh.

    python bench/validate_speed.py [--resources 10000] [--runs 5] [--jobs N]

Runs the real command in a child process (so start-up counts, and its peak RSS is its own and its
workers') and prints a Markdown row for docs/benchmarks.md. Wall time depends on what else the
machine runs, so the best and the median of several runs are shown with the load average around
them, next to the CPU time the runs used (user + system, workers included), which moves less when
the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from meshgen import write_mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=10_000, help="about this many resources")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=None, help="meshctl validate --jobs (default: its own)")
    args = parser.parse_args()
    # Per service: 1 ServiceEntry + 8 WorkloadEntries + (1 DR + 1 VS for a fifth) = 9.4 resources.
    services = max(1, round(args.resources / 9.4))
    meshctl = Path(sys.executable).with_name("meshctl")
    with tempfile.TemporaryDirectory() as tmp:
        count = write_mesh(Path(tmp), services, 8)
        command = [str(meshctl), "validate", tmp]
        if args.jobs is not None:
            command += ["--jobs", str(args.jobs)]
        load_before = os.getloadavg()
        walls, cpus = [], []
        for _ in range(args.runs):
            before = os.times()
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - start)
            after = os.times()
            cpus.append(after.children_user + after.children_system - before.children_user - before.children_system)
            if proc.returncode != 0:
                sys.exit(f"validate failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        load_after = os.getloadavg()
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    best = min(walls)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(f"wall (s): {', '.join(f'{t:.2f}' for t in walls)}")
    print("| resources | files | jobs | best wall (s) | median wall (s) | resources/s | best CPU (s) | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    jobs = "auto" if args.jobs is None else str(args.jobs)
    print(
        f"| {count} | {services} | {jobs} | {best:.2f} | {statistics.median(walls):.2f} | {count / best:,.0f} "
        f"| {min(cpus):.2f} | {peak_mb:.0f} |"
    )


if __name__ == "__main__":
    main()
