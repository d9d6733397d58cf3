"""What one change costs the server, stage by stage, as the mesh grows: no gRPC, no clients.

    python bench/change_cost.py                       # 1,000 / 5,000 / 10,000 services, 1,000 proxies
    python bench/change_cost.py --services 1000 --proxies 1000 --runs 3
    python bench/change_cost.py --services 1000 --dns-port 15053   # every sidecar with a DNS listener
    python bench/change_cost.py --services 10000 --runs 1 --profile /tmp/prof   # a .prof per change

The mesh is the fleet benchmark's (`bench/fleet.py`), written to a temporary directory and loaded
by the very parts `meshctl serve` runs: the directory watcher into a config store, the file
registry, `Discovery.build` and the `ResourceCache` (its `resolve` binds each node). Each change of the fleet
benchmark (a VirtualService every proxy imports, a DestinationRule one namespace imports, an
EnvoyFilter one namespace's proxies take, a WorkloadEntry added and removed), plus one
ServiceEntry added to a file of N entries, is applied to the files and timed through each stage
the server runs between the file write and the bytes a stream sends:

- reload+registry: the watcher rescans the tree, parses what changed and updates the store,
  whose change the file registry (following the store) applies to its service model;
- snapshot: `Discovery.build` and the snapshot's index;
- bind + resources: every connected proxy bound to the new snapshot and its resources looked up
  or generated (`ResourceCache.resolve`, as the servicer asks): the publication's work on the generation thread;
- streams: each stream's `Connection.update` and `pushes()`, and the responses encoded (what the
  event loop does before `write`).

With `--dns-port`, every proxy's node asks for a DNS listener (`xds/dns_table.py`), as `meshctl
bootstrap --dns-port` writes it; the result then also says what LDS weighs per proxy, how much of
it the DNS listener is, and how many distinct DNS listeners the fleet's proxies hold (shared per
view, as the other listeners are).

The numbers are CPU seconds of this process (`time.process_time`), best of `--runs`, so they
move little with the machine's load. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest  # noqa: E402

from bench.fleet import Fleet, FleetSpec, parse_int_list, write_atomically  # noqa: E402
from meshctl.config.store import ConfigStore  # noqa: E402
from meshctl.config.watcher import DirectoryWatcher  # noqa: E402
from meshctl.registry.aggregate import AggregateRegistry  # noqa: E402
from meshctl.registry.files import FileRegistry  # noqa: E402
from meshctl.server.cache import ResourceCache  # noqa: E402
from meshctl.server.connection import Connection  # noqa: E402
from meshctl.server.discovery import Discovery  # noqa: E402
from meshctl.server.encode import BlockCache, encode_sotw  # noqa: E402
from meshctl.snapshot.model import Snapshot  # noqa: E402
from meshctl.snapshot.node import parse_node_id  # noqa: E402
from meshctl.xds import types  # noqa: E402

STAGES = ("reload+registry", "snapshot", "bind+resources", "streams")


class Server:
    """The server's pipeline, driven by hand, one stage at a time."""

    def __init__(self, root: Path, node_ids: list[str], metadata: dict[str, str] | None = None) -> None:
        self.store = ConfigStore()
        self.watcher = DirectoryWatcher([root], self.store)
        self.files = FileRegistry()
        self.files.follow(self.store)
        self.registry = AggregateRegistry([self.files])
        self.discovery = Discovery(self.store, self.registry, _no_publish)
        self.cache = ResourceCache()
        self.blocks = BlockCache()
        # As `meshctl serve` binds the fleet's proxies: no identity proven, so no keys, and
        # config without mutual TLS (`WorkloadSecrets`; bench/mtls_cost.py measures it with).
        self.nodes = [replace(parse_node_id(n, metadata), mesh_certificates=False) for n in node_ids]
        self.views: list[Any] = []
        self.connections = [Connection(str(i), delta=False) for i in range(len(node_ids))]
        self.timings: dict[str, float] = {}
        self.snapshot: Snapshot | None = None
        self.pushed = 0

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.process_time()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.process_time() - started

    def change(self) -> dict[str, float]:
        """Run every stage once for what changed on disk since the last call."""
        self.timings = {}
        self.pushed = 0
        with self.stage("reload+registry"):
            self.watcher.reload_now()
        with self.stage("snapshot"):
            snapshot = self.discovery.build_next()
            snapshot.index.endpoints_at("")
        with self.stage("bind+resources"):
            # As the servicer asks: `resolve` keeps a binding across a change that leaves its inputs.
            views = [self.cache.resolve(node, snapshot).resources for node in self.nodes]
        self.views = views
        with self.stage("streams"):
            for conn, view in zip(self.connections, views, strict=True):
                conn.update(view)
                if self.snapshot is None:
                    _subscribe(conn, view)
                for push in conn.pushes():
                    encode_sotw(push, blocks=self.blocks)
                    self.pushed += 1
                    _ack(conn, push)
        self.snapshot = snapshot
        return self.timings


async def _no_publish(_snapshot: Snapshot, _seen: float) -> None:
    return None


def sotw_request(type_url: str, names: list[str], *, version: str = "", nonce: str = "") -> DiscoveryRequest:
    return DiscoveryRequest(type_url=type_url, resource_names=names, version_info=version, response_nonce=nonce)


def _subscribe(conn: Connection, view: Any) -> None:
    """Subscribe as Envoy does: CDS and LDS wildcard, EDS and RDS by the names they give."""
    for type_url in (types.CLUSTER, types.LISTENER):
        conn.handle(type_url, sotw_request(type_url, []))
    conn.handle(types.ENDPOINT, sotw_request(types.ENDPOINT, sorted(view.of(types.ENDPOINT))))
    conn.handle(types.ROUTE, sotw_request(types.ROUTE, sorted(view.of(types.ROUTE))))


def _ack(conn: Connection, push: Any) -> None:
    sub = conn.subscriptions[push.type_url]
    names = sorted(sub.names) if not sub.wildcard else []
    conn.handle(push.type_url, sotw_request(push.type_url, names, version=push.version, nonce=push.nonce))


def lds_weight(views: list[Any]) -> dict[str, Any]:
    """LDS bytes per proxy (mean), the DNS listener's part of them, and how many distinct DNS
    listener resources the proxies hold between them (one per view when shared)."""
    listeners = [view.of(types.LISTENER) for view in views]
    total = [sum(len(r.body) for r in held.values()) for held in listeners]
    dns = [r for held in listeners for name, r in held.items() if name.startswith("dns_")]
    return {
        "lds_bytes_per_proxy": round(sum(total) / max(len(total), 1)),
        "dns_bytes_per_proxy": round(sum(len(r.body) for r in dns) / max(len(total), 1)),
        "distinct_dns_listeners": len({id(r) for r in dns}),
    }


def measure(services: int, proxies: int, runs: int, dns_port: int = 0, profile: Path | None = None) -> dict[str, Any]:
    spec = FleetSpec(services=services, endpoints=10, proxies=proxies)
    with tempfile.TemporaryDirectory(prefix="meshctl-cost-") as tmp:
        fleet = Fleet(spec, Path(tmp))
        fleet.write()
        big = _big_file(fleet)
        metadata = {"DNS_PORT": str(dns_port)} if dns_port else None
        server = Server(Path(tmp), [p.node_id for p in fleet.proxies], metadata)
        cold = server.change()
        weight = lds_weight(server.views)
        gc.collect()
        gc.freeze()  # as `meshctl serve` does after start-up
        churn = fleet.churn_path()

        def add_churn(step: int) -> None:
            # A VM the server has not seen at each step (a snapshot of its own), as in the fleet
            # benchmark; the removal takes the mesh back to the snapshot before it, as there.
            write_atomically(churn, fleet.churn_entry(step))

        def remove_churn(_step: int) -> None:
            churn.unlink(missing_ok=True)

        # (name, do, undo): `do` is timed, from the state `undo` leaves.
        changes: list[tuple[str, Callable[[int], None], Callable[[int], None]]] = [
            ("VirtualService", lambda s: _write(fleet.route_change(s)), lambda s: _write(fleet.route_change(s + 50))),
            (
                "DestinationRule",
                lambda s: _write(fleet.policy_change(s)),
                lambda s: _write(fleet.policy_change(s + 50)),
            ),
            (
                "EnvoyFilter",
                lambda s: _write(_envoy_filter(fleet, s)),
                lambda _s: fleet.envoy_filter_change()[1].unlink(missing_ok=True),
            ),
            ("endpoint added", add_churn, remove_churn),
            ("endpoint removed", remove_churn, add_churn),
            ("ServiceEntry added to a big file", big, lambda _s: big(0)),
        ]
        results: dict[str, dict[str, float]] = {}
        for name, do, undo in changes:
            best: dict[str, float] | None = None
            pushes = 0
            for run in range(runs):
                undo(run + 1)
                _settle_mtime()
                server.change()
                do(run + 1)
                _settle_mtime()
                profiler = cProfile.Profile() if profile is not None else None
                if profiler is not None:
                    profiler.enable()
                timings = server.change()
                if profiler is not None and profile is not None:
                    profiler.disable()
                    profile.mkdir(parents=True, exist_ok=True)
                    profiler.dump_stats(profile / f"{services}-{name.replace(' ', '-')}.prof")
                if best is None or sum(timings.values()) < sum(best.values()):
                    best, pushes = timings, server.pushed
            assert best is not None
            results[name] = {k: round(v, 4) for k, v in best.items()} | {"pushes": pushes}
    gc.unfreeze()
    return {
        "services": services,
        "proxies": proxies,
        "cold": {k: round(v, 3) for k, v in cold.items()},
        "lds": weight,
        "changes": results,
    }


def _envoy_filter(fleet: Fleet, step: int) -> tuple[Any, Path, str]:
    """The fleet benchmark's EnvoyFilter, its content new at each step (an annotation), so no
    run finds the last one's config still in the cache."""
    change, path, text = fleet.envoy_filter_change()
    return change, path, text.replace("metadata: {", f"metadata: {{annotations: {{step: '{step}'}}, ", 1)


def _write(change: tuple[Any, Path, str]) -> None:
    _, path, text = change
    write_atomically(path, text)


def _settle_mtime() -> None:
    """The watcher holds a file written within its debounce of the scan (a writer may still be
    writing): wait it out, as the server's own debounce would."""
    time.sleep(0.12)


def _big_file(fleet: Fleet) -> Callable[[int], None]:
    """One file holding as many ServiceEntries as the mesh has services (in a namespace of its
    own); `edit(n)` adds entry `ext-new-n` at its end (none for 0). Each run adds another one,
    so no run finds its mesh already generated (the cache keeps the two latest versions)."""
    from bench.meshgen import SE

    path = fleet.root / "catalog" / "entries.yaml"
    path.parent.mkdir(exist_ok=True)
    docs = [
        SE.format(name=f"ext-{i}", ns="catalog", host=f"ext-{i}.catalog.mesh", port=9080, target=8080)
        for i in range(len(fleet.services))
    ]
    write_atomically(path, "---\n".join(docs))

    def edit(added: int) -> None:
        name = f"ext-new-{added}"
        extra = [SE.format(name=name, ns="catalog", host=f"{name}.catalog.mesh", port=9080, target=8080)]
        write_atomically(path, "---\n".join(docs + (extra if added else [])))

    return edit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=parse_int_list, default=[1000, 5000, 10000])
    parser.add_argument("--proxies", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dns-port", type=int, default=0, help="give every proxy a DNS listener on this port")
    parser.add_argument(
        "--profile", type=Path, help="write a cProfile of each change here (its timings then include the profiler's)"
    )
    args = parser.parse_args(argv)
    out = []
    for n in args.services:
        gc.collect()
        result = measure(n, args.proxies, args.runs, args.dns_port, args.profile)
        out.append(result)
        print(f"\n{n:,} services, {args.proxies:,} proxies (CPU s; cold: {result['cold']})", file=sys.stderr)
        print(f"LDS: {result['lds']}", file=sys.stderr)
        print("| change | " + " | ".join(STAGES) + " | total | pushes |", file=sys.stderr)
        print("|---" * (len(STAGES) + 3) + "|", file=sys.stderr)
        for name, t in result["changes"].items():
            total = sum(t.get(s, 0.0) for s in STAGES)
            cells = " | ".join(f"{t.get(s, 0.0):.3f}" for s in STAGES)
            print(f"| {name} | {cells} | {total:.3f} | {t['pushes']} |", file=sys.stderr)
    print(json.dumps({"runs": out, "load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
