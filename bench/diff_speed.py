"""How long `meshctl diff --all-proxies` takes for a one-VirtualService change on a large mesh.

    python bench/diff_speed.py --services 1000 --proxies 1000
    python bench/diff_speed.py --services 10000 --proxies 1000 --runs 1

The mesh is the fleet benchmark's (`bench/fleet.py`): `services` ServiceEntries in ten
namespaces, each namespace scoped by a Sidecar, a fifth of the services with a DestinationRule
and a VirtualService. `diff --all-proxies` diffs the proxy of every WorkloadEntry, so the mesh
has exactly `proxies` WorkloadEntries: the first `proxies` services get one VM each and the rest
none (their endpoints would be proxies too). The change is the fleet's route change: a new
timeout on the VirtualService of a service every namespace imports, so every proxy changes.

The command runs as a user runs it, in its own process (`python -m meshctl diff OLD NEW
--all-proxies`, text output to a file), and is timed by wall clock and by that process's CPU
time; the machine's load averages are printed with each run, as the wall time moves with them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.fleet import Fleet, FleetSpec, write_atomically  # noqa: E402


def make_trees(root: Path, services: int, proxies: int) -> tuple[Path, Path]:
    """The mesh before and after the change, as two directories."""
    before, after = root / "before", root / "after"
    fleet = Fleet(FleetSpec(services=services, endpoints=1, proxies=proxies), before)
    fleet.write()
    for svc in fleet.services[proxies:]:  # a VM only for the first `proxies` services
        path = before / fleet.namespace_of(svc) / f"{svc.name}.yaml"
        path.write_text(path.read_text().split("---\n")[0])
    shutil.copytree(before, after)
    _change, path, text = fleet.route_change(1)
    write_atomically(after / path.relative_to(before), text)
    return before, after


def run_once(before: Path, after: Path, out: Path) -> dict[str, float]:
    load = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with out.open("w") as sink:
        code = subprocess.run(
            [sys.executable, "-m", "meshctl", "diff", str(before), str(after), "--all-proxies"],
            stdout=sink,
            stderr=subprocess.DEVNULL,
            check=False,
        ).returncode
    wall = time.monotonic() - start
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 1:
        raise SystemExit(f"diff exited {code}, expected 1 (changes)")
    cpu = (done.ru_utime - usage.ru_utime) + (done.ru_stime - usage.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1m": load[0], "load_5m": load[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--proxies", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write the trees and the output here and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        before, after = make_trees(root, args.services, args.proxies)
        for _ in range(args.runs):
            result = run_once(before, after, root / "diff.txt")
            lines = sum(1 for _ in (root / "diff.txt").open())
            print(json.dumps({"services": args.services, "proxies": args.proxies, "output_lines": lines, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
