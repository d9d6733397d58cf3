"""How long `meshctl simulate` takes on a 1,000-service mesh: one request, and a 1,000-case file.

    python bench/simulate_speed.py [--services 1000] [--endpoints 2] [--cases 1000] [--proxies 10]
                                   [--runs 3] [--profile]

The mesh is the fleet benchmark's (`bench/fleet.py`), unscoped, so every proxy holds every
service: the largest config a proxy of this mesh can have. Measured:

- one request, cold: the real command in a child process (start-up, loading the tree, binding
  and generating that proxy's resources, the walk), as a person or a CI step runs it;
- the same in-process, stage by stage, and warm: a walk over resources already generated;
- a generated file of `--cases` cases (spread over `--proxies` proxies, each expecting the
  cluster its route must choose) through the CLI entry in a child process, end to end.

Goals: one request under 1 s, 1,000 cases under 10 s. `--profile` prints where an in-process
run of the cases file spends its time (cProfile, by cumulative time). Wall time depends on what
else the machine runs, so the load average around the runs is printed with them. The last line
is JSON, for tools.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.fleet import PORT, Fleet, FleetSpec, cluster_name

ONE_REQUEST_GOAL_S = 1.0
CASES_GOAL_S = 10.0


def cases_yaml(fleet: Fleet, count: int, proxies: int) -> str:
    """`count` cases over the first `proxies` proxies, each to another service, with what the
    fleet's VirtualServices make of it: the canary header to v2, else 90/10 over v1 and v2; a
    service without one goes to its only cluster."""
    out = []
    services = fleet.services
    for n in range(count):
        proxy = fleet.proxies[n % proxies]
        svc = services[(n * 7919) % len(services)]
        name = proxy.node_id.split("~")[2]
        canary = svc.routed and n % 2 == 0
        headers = '\n    headers: {x-canary: "true"}' if canary else ""
        if not svc.routed:
            expect = f"cluster: {cluster_name(svc.host)}"
        elif canary:
            expect = f"cluster: outbound|{PORT}|v2|{svc.host}\n    source: VirtualService/{svc.group}/{svc.name}"
        else:
            expect = f"cluster: {{outbound|{PORT}|v1|{svc.host}: 90, outbound|{PORT}|v2|{svc.host}: 10}}"
        out.append(
            f"- name: case {n} {svc.name}\n  proxy: {name}\n  request:\n    url: http://{svc.host}:{PORT}/p/{n}"
            f"{headers}\n  expect:\n    {expect}\n"
        )
    return "".join(out)


def timed_command(command: list[str], runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(command[:3])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return walls


def in_process(root: Path, proxy_ref: str, url: str, warm_runs: int) -> dict[str, float]:
    """The stages of one request, in this process: load, bind and generate, one walk, and the
    median of `warm_runs` walks over the same resources."""
    from meshctl.cli import offline
    from meshctl.cli.simulate import source_lookup
    from meshctl.simulate import Target, parse_request, simulate
    from meshctl.xds.generate import generate

    start = time.perf_counter()
    tree = offline.load_tree(root)
    loaded = time.perf_counter()
    proxy = offline.resolve_proxy(tree, proxy_ref)
    resources = generate(tree.snapshot, proxy)
    generated = time.perf_counter()
    request, target, lookup = parse_request(url), Target(proxy.id), source_lookup(tree.snapshot)
    result = simulate(resources, request, target, lookup)
    walked = time.perf_counter()
    assert result.outcome.routed, result.outcome.reason
    warm = []
    for _ in range(warm_runs):
        begin = time.perf_counter()
        simulate(resources, request, target, lookup)
        warm.append(time.perf_counter() - begin)
    return {
        "load_s": loaded - start,
        "generate_s": generated - loaded,
        "first_walk_s": walked - generated,
        "warm_walk_ms": statistics.median(warm) * 1000,
        "clusters": float(len(resources.get("type.googleapis.com/envoy.config.cluster.v3.Cluster", ()))),
    }


def profile(root: Path, cases: Path, top: int = 25) -> None:
    from meshctl.cli.app import app

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        app(["simulate", "--cases", str(cases), "--config-dir", str(root)], standalone_mode=False)
    finally:
        profiler.disable()
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=2)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--proxies", type=int, default=10, help="distinct proxies the cases are sent by")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile an in-process run of the cases file")
    args = parser.parse_args()
    meshctl = str(Path(sys.executable).with_name("meshctl"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "mesh"
        spec = FleetSpec(args.services, args.endpoints, max(args.proxies, 1), scoped=False)
        fleet = Fleet(spec, root)
        resources = fleet.write()
        cases = Path(tmp) / "cases.yaml"
        cases.write_text(cases_yaml(fleet, args.cases, min(args.proxies, len(fleet.proxies))))
        proxy = fleet.proxies[0].node_id.split("~")[2]
        target = fleet.services[-1]
        url = f"http://{target.host}:{PORT}/"
        load_before = os.getloadavg()
        one = timed_command(
            [meshctl, "simulate", url, "--config-dir", str(root), "--proxy", proxy, "-o", "json"], args.runs
        )
        stages = in_process(root, proxy, url, 200)
        many = timed_command([meshctl, "simulate", "--cases", str(cases), "--config-dir", str(root)], args.runs)
        load_after = os.getloadavg()
        if args.profile:
            profile(root, cases)
    report: dict[str, Any] = {
        "services": args.services,
        "resources": resources,
        "cases": args.cases,
        "proxies": args.proxies,
        "one_request_best_s": round(min(one), 3),
        "one_request_median_s": round(statistics.median(one), 3),
        "cases_best_s": round(min(many), 3),
        "cases_median_s": round(statistics.median(many), 3),
        **{k: round(v, 4) for k, v in stages.items()},
        "load_before": round(load_before[0], 2),
        "load_after": round(load_after[0], 2),
    }
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(f"one request, cold (s): {', '.join(f'{t:.2f}' for t in one)} (goal {ONE_REQUEST_GOAL_S} s)")
    print(
        f"  in-process: load {stages['load_s']:.2f} s, bind+generate {stages['generate_s']:.2f} s"
        f" ({stages['clusters']:.0f} clusters), first walk {stages['first_walk_s'] * 1000:.1f} ms,"
        f" warm walk {stages['warm_walk_ms']:.2f} ms"
    )
    print(f"{args.cases} cases (s): {', '.join(f'{t:.2f}' for t in many)} (goal {CASES_GOAL_S} s)")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
