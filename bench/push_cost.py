"""What the ADS servicer costs per change beyond the write: every stream's publication, push and
ACK, in one process, without gRPC.

    python bench/push_cost.py                          # 1,000 services, 1,000 proxies
    python bench/push_cost.py --proxies 2000 --runs 5
    python bench/push_cost.py --profile /tmp/push.prof   # cProfiles of the timed changes
    python bench/push_cost.py --only VirtualService     # one change
    python bench/push_cost.py --delta                   # the clients speak incremental xDS

The mesh is the fleet benchmark's (`bench/fleet.py`), loaded by the parts `meshctl serve` runs
(as in bench/change_cost.py). The servicer is the real `AdsServicer`, with the real `Delivery`
as its observer (metrics, push history in a state directory, the rollout between it and the
cache). Only gRPC is left out: each stream's context writes into a list, and its client, on the
loop, answers each response with the ACK Envoy would send (every name again, for EDS and RDS).
What the clients do (decoding a response, making its ACK) is timed apart and taken off. With
`--delta` the clients speak incremental xDS, as Envoy does with meshctl's default bootstrap:
clusters and listeners by wildcard, endpoints and routes subscribed by name, each response
ACKed by its nonce alone.

Each change (a VirtualService every proxy imports, a WorkloadEntry added and removed) is timed
from the snapshot being published to every stream having ACKed what it was sent, and the
timers a change arms (the history's write, the rollout's look at the fleet) having run: CPU
seconds of this process (`time.process_time`), best of `--runs`. The cache's generation is in
it too, so the VirtualService line moves with generation as well. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from envoy.config.core.v3.base_pb2 import Node  # noqa: E402
from envoy.service.discovery.v3.discovery_pb2 import (  # noqa: E402
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)

from bench.change_cost import _settle_mtime, _write  # noqa: E402
from bench.fleet import Fleet, FleetSpec, write_atomically  # noqa: E402
from meshctl.config.store import ConfigStore  # noqa: E402
from meshctl.config.watcher import DirectoryWatcher  # noqa: E402
from meshctl.registry.aggregate import AggregateRegistry  # noqa: E402
from meshctl.registry.files import FileRegistry  # noqa: E402
from meshctl.server.ads import AdsServicer  # noqa: E402
from meshctl.server.cache import ResourceCache  # noqa: E402
from meshctl.server.delivery import Delivery  # noqa: E402
from meshctl.server.discovery import Discovery  # noqa: E402
from meshctl.server.history import PushHistory  # noqa: E402
from meshctl.server.metrics import Metrics  # noqa: E402
from meshctl.server.rollout_plan import RolloutSettings  # noqa: E402
from meshctl.snapshot.model import Snapshot  # noqa: E402
from meshctl.xds import types  # noqa: E402


class Client:
    """One stream's Envoy, as far as the servicer can tell: its requests, and an ACK for each
    response (EDS and RDS naming what the node was offered, as Envoy names what it watches)."""

    def __init__(self, index: int, node_id: str, bench: Bench, *, delta: bool = False) -> None:
        self.address = f"ipv4:10.0.{index // 250}.{index % 250}:{40000 + index}"
        self.node_id = node_id
        self.bench = bench
        self.delta = delta
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.subscribed: set[str] = set()
        self.stream: Any = None

    # the parts of grpc.aio.ServicerContext the servicer uses
    def peer(self) -> str:
        return self.address

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"stream aborted: {code} {details}")

    async def write(self, data: bytes) -> None:
        started = time.thread_time()
        if self.delta:
            answer = DeltaDiscoveryResponse.FromString(data)
            self.queue.put_nowait(DeltaDiscoveryRequest(type_url=answer.type_url, response_nonce=answer.nonce))
            self.bench.outstanding += 1
            self.bench.client_cpu += time.thread_time() - started
            return
        response = DiscoveryResponse.FromString(data)
        names: list[str] = []
        if response.type_url in (types.ENDPOINT, types.ROUTE):
            names = self.names(response.type_url)
        self.queue.put_nowait(
            DiscoveryRequest(
                type_url=response.type_url,
                version_info=response.version_info,
                response_nonce=response.nonce,
                resource_names=names,
            )
        )
        self.bench.outstanding += 1
        self.bench.client_cpu += time.thread_time() - started

    def names(self, type_url: str) -> list[str]:
        resources = self.bench.servicer.streams[self.stream].connection.resources
        return sorted(resources.of(type_url)) if resources is not None else []

    async def requests(self) -> AsyncIterator[Any]:
        node = Node(id=self.node_id)
        request: Any = DeltaDiscoveryRequest if self.delta else DiscoveryRequest
        yield request(type_url=types.CLUSTER, node=node)
        yield request(type_url=types.LISTENER, node=node)
        while True:
            request = await self.queue.get()
            if request is None:
                return
            self.bench.outstanding -= 1
            yield request
            if request.type_url in (types.CLUSTER, types.LISTENER) and request.type_url not in self.subscribed:
                self.subscribed.add(request.type_url)
                follow = types.ENDPOINT if request.type_url == types.CLUSTER else types.ROUTE
                started = time.thread_time()
                if self.delta:
                    subscribe = DeltaDiscoveryRequest(type_url=follow, resource_names_subscribe=self.names(follow))
                else:
                    subscribe = DiscoveryRequest(type_url=follow, resource_names=self.names(follow))
                self.bench.client_cpu += time.thread_time() - started
                yield subscribe


class Bench:
    def __init__(self, root: Path, state: Path, node_ids: list[str], *, delta: bool = False) -> None:
        self.delta = delta
        self.store = ConfigStore()
        self.watcher = DirectoryWatcher([root], self.store)
        self.files = FileRegistry()
        self.files.follow(self.store)
        self.registry = AggregateRegistry([self.files])
        self.discovery = Discovery(self.store, self.registry, _no_publish)
        self.cache = ResourceCache()
        self.metrics = Metrics()
        self.snapshot: Snapshot | None = None
        self.delivery = Delivery(
            self.metrics,
            PushHistory(state),
            RolloutSettings(),
            [root],
            lambda: self.servicer.streams.values(),  # noqa: PLW0108 (self.servicer is made below)
            lambda: None,
        )
        self.servicer = AdsServicer(self.delivery.source(self._resolve), lambda: self.snapshot, self.delivery)
        self.clients = [Client(i, n, self, delta=delta) for i, n in enumerate(node_ids)]
        self.outstanding = 0
        self.client_cpu = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    def _resolve(self, node: Any, state: Any) -> Any:
        # As `meshctl serve` binds the fleet's proxies: no identity proven, so no keys.
        return self.cache.resolve(replace(node, mesh_certificates=False), state)

    def build(self) -> Snapshot:
        self.watcher.reload_now()
        snapshot = self.discovery.build_next()
        snapshot.index.endpoints_at("")
        return snapshot

    async def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        await self.delivery.published(snapshot)
        await self.servicer.publish(snapshot)

    async def connect(self) -> None:
        for client in self.clients:
            serve = self.servicer.stream_delta if self.delta else self.servicer.stream_sotw
            self.tasks.append(asyncio.ensure_future(serve(client.requests(), client)))
        await self.quiet()
        ids = {s.connection.node_id: conn_id for conn_id, s in self.servicer.streams.items()}
        for client in self.clients:
            client.stream = ids[client.node_id]
        await self.quiet()

    async def quiet(self) -> None:
        """Until every response is ACKed and no stream has anything left to do."""
        while True:
            await asyncio.sleep(0.01)
            streams = self.servicer.streams.values()
            if (
                self.outstanding == 0
                and all(not c.queue.qsize() for c in self.clients)
                and not any(s.wake.is_set() or getattr(s, "writing", False) for s in streams)
            ):
                return

    async def stop(self) -> None:
        for client in self.clients:
            client.queue.put_nowait(None)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.delivery.stop()


async def _no_publish(_snapshot: Snapshot, _seen: float) -> None:
    return None


async def measure(
    services: int,
    proxies: int,
    runs: int,
    profile: Path | None,
    only: frozenset[str] = frozenset(),
    *,
    delta: bool = False,
) -> dict[str, Any]:
    spec = FleetSpec(services=services, endpoints=10, proxies=proxies)
    with tempfile.TemporaryDirectory(prefix="meshctl-push-") as tmp:
        root, state = Path(tmp) / "mesh", Path(tmp) / "state"
        root.mkdir()
        fleet = Fleet(spec, root)
        fleet.write()
        bench = Bench(root, state, [p.node_id for p in fleet.proxies], delta=delta)
        await bench.publish(bench.build())
        await bench.connect()
        await asyncio.sleep(1.2)  # the history's first write, the rollout's first look
        gc.collect()
        gc.freeze()
        churn = fleet.churn_path()

        def add_churn(step: int) -> None:
            # A VM the server has not seen at each step (a snapshot of its own), as in the fleet
            # benchmark; the removal takes the mesh back to the snapshot before it, as there.
            write_atomically(churn, fleet.churn_entry(step))

        def remove_churn(_step: int) -> None:
            churn.unlink(missing_ok=True)

        changes: list[tuple[str, Callable[[int], None], Callable[[int], None]]] = [
            ("VirtualService", lambda s: _write(fleet.route_change(s)), lambda s: _write(fleet.route_change(s + 50))),
            ("endpoint added", add_churn, remove_churn),
            ("endpoint removed", remove_churn, add_churn),
        ]
        # Each thread's CPU clock, not the wall clock: the loop and the worker take turns with the
        # GIL, and a wall-clock profile charges one thread's wait for it to whatever the other
        # was running (a route configuration's virtual hosts looked three times their cost).
        profiler = cProfile.Profile(time.thread_time) if profile is not None else None
        # The worker thread's share (binding and generation) in a profile of its own.
        worker = cProfile.Profile(time.thread_time) if profile is not None else None
        if worker is not None:
            resolve_many = bench.servicer._resolve_many
            timed = [False]

            def profiled(*args: Any) -> Any:
                if not timed[0]:
                    return resolve_many(*args)
                worker.enable()
                try:
                    return resolve_many(*args)
                finally:
                    worker.disable()

            bench.servicer._resolve_many = profiled  # type: ignore[method-assign]
        results: dict[str, dict[str, float]] = {}
        for name, do, undo in changes:
            if only and name not in only:
                continue
            best: dict[str, float] | None = None
            for run in range(runs):
                undo(run + 1)
                _settle_mtime()
                await bench.publish(bench.build())
                await bench.quiet()
                await asyncio.sleep(1.2)
                do(run + 1)
                _settle_mtime()
                snapshot = bench.build()
                pushes = bench.metrics.pushes.render()
                bench.client_cpu = 0.0
                if profiler is not None:
                    profiler.enable()
                    timed[0] = True
                started = time.process_time()
                await bench.publish(snapshot)
                await bench.quiet()
                converged = time.process_time() - started - bench.client_cpu
                await asyncio.sleep(1.2)  # the timers the change armed run
                total = time.process_time() - started - bench.client_cpu
                if profiler is not None:
                    profiler.disable()
                    timed[0] = False
                sent = sum(_count(line) for line in bench.metrics.pushes.render()) - sum(_count(x) for x in pushes)
                timing = {"converged": round(converged, 4), "with timers": round(total, 4), "pushes": sent}
                if best is None or timing["with timers"] < best["with timers"]:
                    best = timing
            assert best is not None
            results[name] = best
        if profiler is not None and worker is not None and profile is not None:
            profiler.dump_stats(profile)
            worker.dump_stats(profile.with_name(profile.name + ".worker"))
        await bench.stop()
    gc.unfreeze()
    return {"services": services, "proxies": proxies, "delta": delta, "changes": results}


def _count(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--proxies", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--profile", type=Path, help="write a cProfile of the timed changes here (the worker thread's to FILE.worker)"
    )
    parser.add_argument("--only", action="append", default=[], help="time this change only (repeatable)")
    parser.add_argument("--delta", action="store_true", help="the clients speak incremental xDS")
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(args.services, args.proxies, args.runs, args.profile, frozenset(args.only), delta=args.delta)
    )
    print(f"\n{args.services:,} services, {args.proxies:,} proxies (CPU s, clients' share taken off)", file=sys.stderr)
    print("| change | converged | with timers | pushes |", file=sys.stderr)
    print("|---|---|---|---|", file=sys.stderr)
    for name, t in result["changes"].items():
        print(f"| {name} | {t['converged']:.3f} | {t['with timers']:.3f} | {t['pushes']:.0f} |", file=sys.stderr)
    print(json.dumps(result | {"load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
