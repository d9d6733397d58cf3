"""Throughput and peak memory of `meshctl validate` on a generated mesh.

    python bench/validate.py [--resources 10000]

Runs the real command in a child process (so its peak RSS is its own) and prints a Markdown
row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from meshgen import write_mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--resources", type=int, default=10_000, help="about this many resources")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # Per service: 1 ServiceEntry + 8 WorkloadEntries + (1 DR + 1 VS for a fifth) = 9.4 resources.
    services = max(1, round(args.resources / 9.4))
    with tempfile.TemporaryDirectory() as tmp:
        count = write_mesh(Path(tmp), services, 8)
        meshctl = Path(sys.executable).with_name("meshctl")
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            proc = subprocess.run(
                [str(meshctl), "validate", tmp], capture_output=True, text=True, check=False
            )
            times.append(time.perf_counter() - start)
            if proc.returncode != 0:
                sys.exit(f"validate failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    best = min(times)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| resources | files | best of runs (s) | resources/s | peak RSS (MB) |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {count} | {services} | {best:.2f} | {count / best:,.0f} | {peak_mb:.0f} |")


if __name__ == "__main__":
    main()
