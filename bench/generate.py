"""How long config generation takes on a large VM mesh, for one proxy and for the whole fleet.

    python bench/generate.py [--services 1000] [--endpoints 10] [--sample 20] [--all]

The mesh comes from `meshgen.write_mesh` (ServiceEntries with WorkloadEntries, a fifth of the
services with a DestinationRule and a VirtualService) and is loaded the way the server loads it
(`load_tree`). Every WorkloadEntry is a VM running a sidecar, so the fleet is services x endpoints
proxies. Three ways of producing their config are timed:

- one proxy: `generate` (clusters, endpoints, listeners, routes), best of `--runs`, for a
  WorkloadEntry's sidecar and for a sidecar without a workload (which also gets listeners);
- every proxy with `generate`, each on its own, as a server without a cache would;
- every proxy through one `ResourceCache`, as the server does: config is generated once per
  proxy generation key, ClusterLoadAssignments once per cluster, and everything is serialized.

Generating for a whole fleet of 10,000 large proxies takes hours, so by default the fleet rows
time an evenly spread `--sample` of the proxies and extrapolate to all of them (the cache row from
the number of distinct generation keys in the fleet, counted exactly, and the EDS work measured
once); `--all` runs every proxy instead. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

# The script's own directory comes first on sys.path, where a module named like a package the
# Envoy protos import (`validate`) would shadow it; so it is taken off and meshgen loaded by path.
BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]

from meshctl.cli.offline import load_tree  # noqa: E402
from meshctl.server.cache import ResourceCache  # noqa: E402
from meshctl.snapshot.binding import bind_proxy  # noqa: E402
from meshctl.snapshot.model import Snapshot, spec  # noqa: E402
from meshctl.snapshot.node import parse_node_id  # noqa: E402
from meshctl.snapshot.proxy import Proxy  # noqa: E402
from meshctl.xds import types  # noqa: E402
from meshctl.xds.generate import generate  # noqa: E402


def _meshgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("meshgen", BENCH / "meshgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Timing:
    """Wall-clock and CPU seconds of the same work: on a shared machine the wall clock also
    counts time spent waiting for a core, the CPU time does not."""

    wall: float = 0.0
    cpu: float = 0.0

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall + other.wall, self.cpu + other.cpu)

    def __mul__(self, factor: float) -> Timing:
        return Timing(self.wall * factor, self.cpu * factor)


def timed(fn: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def best_of(runs: int, fn: Callable[[], object]) -> Timing:
    return min((timed(fn) for _ in range(runs)), key=lambda t: t.cpu)


def total(timings: Sequence[Timing]) -> Timing:
    return sum(timings, Timing())


def mean(timings: Sequence[Timing]) -> Timing:
    return total(timings) * (1 / len(timings))


@dataclass(frozen=True)
class Row:
    what: str
    proxies: int
    timing: Timing
    note: str = ""

    def markdown(self) -> str:
        proxies = f"{self.proxies:,}" if self.proxies else ""
        ms = self.timing.cpu / self.proxies * 1000 if self.proxies else 0.0
        per = "" if not self.proxies else f"{ms:,.0f}" if ms >= 10 else f"{ms:.1f}"
        wall, cpu = self.timing.wall, self.timing.cpu
        return f"| {self.what} | {proxies} | {wall:,.1f} | {cpu:,.1f} | {per} | {self.note} |"


def node_ids(snapshot: Snapshot) -> list[str]:
    """Every WorkloadEntry as its VM's sidecar would name itself."""
    return [
        f"sidecar~{spec(we).address}~{we.name}.{we.namespace}~{we.namespace}.svc.cluster.local"
        for we in snapshot.of_kind("WorkloadEntry")
    ]


def spread(items: Sequence[Proxy], count: int) -> list[Proxy]:
    """`count` items evenly spread over `items` (every service and namespace gets its turn)."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def count_resources(snapshot: Snapshot, proxy: Proxy) -> str:
    resources = generate(snapshot, proxy)
    names = {types.CLUSTER: "clusters", types.ENDPOINT: "EDS", types.LISTENER: "listeners", types.ROUTE: "routes"}
    return ", ".join(f"{len(resources[t]):,} {n}" for t, n in names.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=10, help="WorkloadEntries (VMs) per service")
    parser.add_argument("--sample", type=int, default=20, help="proxies timed for the fleet rows")
    parser.add_argument("--all", action="store_true", help="time every proxy instead of a sample (hours)")
    parser.add_argument("--runs", type=int, default=3, help="runs of the one-proxy timing (best is kept)")
    args = parser.parse_args()
    # Generators log, per proxy, each port they skip; thousands of lines would drown the table.
    logging.disable(logging.WARNING)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        count = _meshgen().write_mesh(Path(tmp), args.services, args.endpoints)
        loaded: list[Snapshot] = []
        load = timed(lambda: loaded.append(load_tree(Path(tmp)).snapshot))
    snapshot = loaded[0]

    proxies: list[Proxy] = []
    bind = timed(lambda: proxies.extend(bind_proxy(parse_node_id(n), snapshot) for n in node_ids(snapshot)))
    keys = len({p.generation_key() for p in proxies})
    outbound_keys = len({p.outbound for p in proxies})
    fleet = len(proxies)

    one = proxies[0]
    shape = count_resources(snapshot, one)
    best = best_of(args.runs, lambda: generate(snapshot, one))
    # A VM's sidecar does not bind its app's own port, and every service here is on one port, so
    # the WorkloadEntries' sidecars get no outbound listeners; a sidecar without a workload does.
    client = bind_proxy(parse_node_id("sidecar~10.255.0.1~client.ns-0~ns-0.svc.cluster.local"), snapshot)
    client_shape = count_resources(snapshot, client)
    client_best = best_of(args.runs, lambda: generate(snapshot, client))

    chosen = proxies if args.all else spread(proxies, args.sample)
    per_proxy = [timed(partial(generate, snapshot, p)) for p in chosen]
    cache = ResourceCache()
    cached = [timed(partial(cache.resources, snapshot, p)) for p in chosen]
    # The first proxy through the cache builds every ClusterLoadAssignment (each proxy has every
    # cluster here); the others find them shared and only generate and serialize their own config.
    shared = (
        f"{cache.outbound_generations:,} outbound and {cache.generations - cache.outbound_generations:,} "
        f"inbound generations, {cache.eds_builds:,} EDS builds"
    )
    # The whole fleet through a fresh cache: with outbound config shared per outbound key, this is
    # measured, not extrapolated.
    fleet_cache = ResourceCache()
    whole = timed(lambda: [fleet_cache.resources(snapshot, p) for p in proxies])
    whole_shared = (
        f"{fleet_cache.outbound_generations:,} outbound and "
        f"{fleet_cache.generations - fleet_cache.outbound_generations:,} inbound generations, "
        f"{fleet_cache.eds_builds:,} EDS builds"
    )

    rows = [
        Row(f"load {count:,} resources and build the snapshot", 0, load),
        Row("bind every WorkloadEntry's sidecar to the snapshot", fleet, bind),
        Row(f"one sidecar, `generate` (best of {args.runs})", 1, best, shape),
        Row(f"one sidecar without a WorkloadEntry, `generate` (best of {args.runs})", 1, client_best, client_shape),
    ]
    if args.all:
        rows += [
            Row("every sidecar, `generate` each", fleet, total(per_proxy)),
            Row("every sidecar, through `ResourceCache`", fleet, total(cached), shared),
        ]
    else:
        n = len(chosen)
        rows += [
            Row(f"{n} sidecars, `generate` each", n, total(per_proxy)),
            Row(
                "every sidecar, `generate` each (extrapolated)",
                fleet,
                mean(per_proxy) * fleet,
                f"mean of {n} x {fleet:,}",
            ),
            Row(f"{n} sidecars, through `ResourceCache`", n, total(cached), shared),
            Row("every sidecar, through `ResourceCache`", fleet, whole, whole_shared),
        ]

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(
        f"mesh: {args.services:,} services x {args.endpoints} endpoints = {fleet:,} sidecars, "
        f"{keys:,} distinct generation keys, {outbound_keys:,} outbound keys"
    )
    print()
    print("| what | proxies | wall s | CPU s | CPU ms per proxy | notes |")
    print("|---|---:|---:|---:|---:|---|")
    for row in rows:
        print(row.markdown())


if __name__ == "__main__":
    main()
