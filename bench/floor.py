"""The floor: the least any control plane could do for the same fleet, to measure meshctl against.

The floor is a bare grpc.aio ADS server. It sends each proxy exactly the resources meshctl
would send it (the same `Resource` bytes, made once by meshctl's own `ResourceCache` over a
snapshot of the same mesh, and dumped), with no loading, no generation, no debounce and no
per-stream bookkeeping beyond what the protocol needs: a request whose version and names match
what was sent is an ACK and gets nothing; anything else gets the current set. As meshctl does,
a state-of-the-world EDS or RDS response carries only the resources the stream was not sent yet
at their current version (the protocol lets every type but CDS and LDS leave out what the node
holds), so an endpoint change costs the floor the bytes it costs meshctl.

The dump holds one state per step of the run: the mesh as written, then after each change. When
the benchmark makes a change it tells the floor at the same moment, and the floor pushes the
next state at once to every stream whose resources differ. So the floor's convergence is the
cost of sending the bytes and of the clients taking them, and meshctl's ratio to it is the cost
of everything else.

Making the dump costs what meshctl's cold start does (it is the same generation), so it runs in
a process of its own before anything is measured; states after a change regenerate only the
proxies the change affects, and an endpoint change only swaps the affected assignments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import resource
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from bench.fleet import Fleet, FleetSpec
from meshctl.server.ads import ads_handlers
from meshctl.server.connection import PARTIAL_SOTW_TYPES
from meshctl.server.encode import encode_delta, encode_sotw
from meshctl.server.subscription import Push
from meshctl.xds import types
from meshctl.xds.resources import Resource, set_version, to_resource


@dataclass(frozen=True, slots=True)
class TypeSet:
    """One proxy's resources of one type: the set's version (as meshctl computes it), the names
    and the resources, sorted by name."""

    version: str
    names: frozenset[str]
    resources: tuple[Resource, ...]

    @classmethod
    def of(cls, resources: Mapping[str, Resource]) -> TypeSet:
        chosen = tuple(resources[n] for n in sorted(resources))
        return cls(set_version(chosen), frozenset(resources), chosen)


#: node id -> type URL -> resources
View = Mapping[str, Mapping[str, TypeSet]]


# -- the dump ----------------------------------------------------------------------------------


def build_dump(spec: FleetSpec, root: Path, out: Path) -> None:
    """Write the floor's states for `spec` (mesh written under `root`) to `out`, as pickle."""
    from meshctl.cli.offline import load_tree
    from meshctl.server.cache import ResourceCache
    from meshctl.snapshot.binding import bind_proxy
    from meshctl.snapshot.node import parse_node_id
    from meshctl.testing.fake_consul import FakeConsul
    from meshctl.xds.generate import load_assignment
    from meshctl.xds.names import parse_cluster_name

    # Generators log, per proxy, each port they skip: thousands of lines nobody reads here.
    logging.disable(logging.WARNING)
    fleet = Fleet(spec, root)
    fleet.write()
    consul = FakeConsul() if spec.consul else None
    with consul or contextlib.nullcontext():
        address = None
        if consul is not None:
            for body in fleet.consul_instances():
                consul.register(body)
            address = consul.address
        cache = ResourceCache()

        def views(snapshot: Any, node_ids: Sequence[str]) -> dict[str, dict[str, TypeSet]]:
            out: dict[str, dict[str, TypeSet]] = {}
            for node_id in node_ids:
                # As `meshctl serve` binds these proxies: their connections prove no identity, so
                # they get no keys, and config without mutual TLS (`WorkloadSecrets`).
                proxy = bind_proxy(replace(parse_node_id(node_id), mesh_certificates=False), snapshot)
                resources = cache.resources(snapshot, proxy)
                out[node_id] = {t: TypeSet.of(resources.of(t)) for t in types.PUSH_ORDER}
            return out

        snapshot = load_tree(root, consul=address).snapshot
        current = views(snapshot, [p.node_id for p in fleet.proxies])
        states: list[View] = [current]
        for step in fleet.steps():
            fleet.apply(step, consul)
            snapshot = load_tree(root, consul=address).snapshot
            current = dict(current)
            if step.change.kind == "config":
                current.update(views(snapshot, sorted(step.change.affected)))
            else:
                assignments: dict[str, Resource] = {}
                for node_id in step.change.affected:
                    eds = current[node_id][types.ENDPOINT]
                    by_name = {r.name: r for r in eds.resources}
                    for name in by_name:
                        parsed = parse_cluster_name(name)
                        if parsed is not None and parsed.host == step.change.host:
                            if name not in assignments:
                                assignments[name] = to_resource(load_assignment(snapshot, name), types.ENDPOINT)
                            by_name[name] = assignments[name]
                    current[node_id] = {**current[node_id], types.ENDPOINT: TypeSet.of(by_name)}
            states.append(current)
    with out.open("wb") as f:
        pickle.dump(states, f, protocol=pickle.HIGHEST_PROTOCOL)


def dump_main(spec: FleetSpec, root: str, out: str) -> None:
    """Process entry point for `build_dump`."""
    build_dump(spec, Path(root), Path(out))


# -- the server --------------------------------------------------------------------------------


@dataclass(eq=False)
class _Stream:
    delta: bool
    node_id: str = ""
    outbox: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    #: SotW: type -> (names asked for, or None for wildcard); delta: type -> names or None
    wanted: dict[str, frozenset[str] | None] = field(default_factory=dict)
    #: SotW: type -> version sent; delta: type -> {name: version} the node holds
    sent: dict[str, str] = field(default_factory=dict)
    known: dict[str, dict[str, str]] = field(default_factory=dict)
    #: SotW EDS and RDS: type -> {name: version} the stream was sent
    held: dict[str, dict[str, str]] = field(default_factory=dict)
    nonce: int = 0


class Floor:
    """Serves the states of a dump; `switch(k)` makes state `k` current and pushes it."""

    def __init__(self, states: Sequence[View]) -> None:
        self.states = states
        self.current = 0
        self.streams: set[_Stream] = set()

    def handlers(self) -> grpc.GenericRpcHandler[Any, Any]:
        return ads_handlers(self._sotw, self._delta)

    async def _sotw(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        async for data in self._serve(_Stream(delta=False), requests):
            yield data

    async def _delta(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        async for data in self._serve(_Stream(delta=True), requests):
            yield data

    async def _serve(self, stream: _Stream, requests: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        reader = asyncio.create_task(self._read(stream, requests))
        self.streams.add(stream)
        try:
            while True:
                data = await stream.outbox.get()
                if data is None:
                    return
                yield data
        finally:
            self.streams.discard(stream)
            reader.cancel()

    async def _read(self, stream: _Stream, requests: AsyncIterator[Any]) -> None:
        try:
            async for request in requests:
                if not stream.node_id:
                    stream.node_id = request.node.id
                if stream.node_id not in self.states[self.current]:
                    break
                if stream.delta:
                    self._delta_request(stream, request)
                else:
                    self._sotw_request(stream, request)
        finally:
            stream.outbox.put_nowait(None)

    def _sotw_request(self, stream: _Stream, request: Any) -> None:
        type_url = request.type_url
        names = frozenset(request.resource_names) - {"*"}
        wildcard = type_url in types.WILDCARD_TYPES and not names
        stream.wanted[type_url] = None if wildcard else names
        held = stream.held.get(type_url)
        if held is not None:
            if request.HasField("error_detail"):
                held.clear()  # what the node holds is not known: the next response is complete
            else:
                stream.held[type_url] = {n: v for n, v in held.items() if n in names}
        if request.HasField("error_detail"):
            return
        self._send(stream, type_url)

    def _delta_request(self, stream: _Stream, request: Any) -> None:
        type_url = request.type_url
        known = stream.known.setdefault(type_url, {})
        if type_url not in stream.wanted:
            known.update(request.initial_resource_versions)
            wildcard = type_url in types.WILDCARD_TYPES and not request.resource_names_subscribe
            stream.wanted[type_url] = None if wildcard else frozenset()
        wanted = stream.wanted[type_url]
        if wanted is not None:
            wanted = (wanted | set(request.resource_names_subscribe)) - set(request.resource_names_unsubscribe)
            stream.wanted[type_url] = wanted
        for name in request.resource_names_unsubscribe:
            known.pop(name, None)
        if request.resource_names_subscribe or not request.response_nonce:
            self._send(stream, type_url)

    def _send(self, stream: _Stream, type_url: str) -> None:
        """Send the current set of `type_url` if the stream does not hold it already."""
        have = self.states[self.current][stream.node_id][type_url]
        wanted = stream.wanted[type_url]
        stream.nonce += 1
        if stream.delta:
            known = stream.known[type_url]
            chosen = have.resources if wanted is None else tuple(r for r in have.resources if r.name in wanted)
            fresh = tuple(r for r in chosen if known.get(r.name) != r.version)
            present = {r.name for r in chosen}
            removed = tuple(n for n in sorted(known) if n not in present)
            if not fresh and not removed:
                return
            for n in removed:
                del known[n]
            known.update((r.name, r.version) for r in fresh)
            push = Push(type_url, have.version, str(stream.nonce), fresh, removed)
            stream.outbox.put_nowait(encode_delta(push))
            return
        if wanted is None or wanted == have.names:
            version, chosen = have.version, have.resources
        else:
            chosen = tuple(r for r in have.resources if r.name in wanted)
            version = set_version(chosen)
        if stream.sent.get(type_url) == version:
            return
        stream.sent[type_url] = version
        if type_url in PARTIAL_SOTW_TYPES:
            held = stream.held.setdefault(type_url, {})
            fresh = tuple(r for r in chosen if held.get(r.name) != r.version)
            held.update((r.name, r.version) for r in fresh)
            chosen = fresh
        stream.outbox.put_nowait(encode_sotw(Push(type_url, version, str(stream.nonce), chosen)))

    def switch(self, state: int) -> None:
        """Make `state` current and push it, in push order, to every stream it changes."""
        self.current = state
        for stream in list(self.streams):
            for type_url in types.PUSH_ORDER:
                if type_url in stream.wanted and stream.node_id in self.states[state]:
                    self._send(stream, type_url)


def floor_main(conn: Any, dump: str, port: int = 0, shared: bool = False) -> None:
    """The floor's process: load the dump, listen on 127.0.0.1 (on `port`, shared with the
    other floor processes when `shared`), then follow the parent's `("switch", k)` commands until
    `("stop",)`."""
    asyncio.run(_run(conn, Path(dump), port, shared))


async def _run(conn: Any, dump: Path, port: int, shared: bool) -> None:
    with dump.open("rb") as f:
        states: Sequence[View] = pickle.load(f)
    floor = Floor(states)
    server = grpc.aio.server(
        options=[("grpc.max_send_message_length", 256 * 1024 * 1024), ("grpc.so_reuseport", int(shared))]
    )
    server.add_generic_rpc_handlers((floor.handlers(),))
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def readable() -> None:
        try:
            inbox.put_nowait(conn.recv())
        except EOFError:
            loop.remove_reader(conn.fileno())
            inbox.put_nowait(("stop",))

    loop.add_reader(conn.fileno(), readable)
    conn.send(("ready", port, os.getpid()))
    while True:
        command = await inbox.get()
        if command[0] == "switch":
            floor.switch(command[1])
            conn.send(("switched",))
        elif command[0] == "stop":
            await server.stop(0.5)
            usage = resource.getrusage(resource.RUSAGE_SELF)
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("stopped", usage.ru_utime + usage.ru_stime))
            return
