"""An in-process ADS client that subscribes the way Envoy does, for tests and benchmarks.

It opens one ADS stream (state of the world, or delta), asks for clusters as a wildcard, then
for the endpoints of every EDS cluster, then (once the clusters are warm, as Envoy's start-up
does) for listeners as a wildcard, then for the route configs every HTTP connection manager
names, and ACKs each response (or NACKs it when told to). It keeps what it was
sent, decoded, and a log of every response with the time it arrived.

What it holds follows a response as Envoy's does. In state of the world, a CDS or LDS response
is the complete set (what it leaves out is removed), while an EDS or RDS response updates only
the names it carries: the others keep what they had, and what the client stops watching is
dropped (Envoy drops an assignment with its cluster, a route config with its listeners). In
delta, a response carries changes and names removals.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.protobuf.message import Message
from google.rpc import status_pb2  # type: ignore[import-untyped]

from meshctl.xds import types
from meshctl.xds.mesh_tls import secret_names

_METHOD_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
_METHOD_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
_CLASSES: Mapping[str, type[Message]] = {
    types.CLUSTER: cluster_pb2.Cluster,
    types.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    types.LISTENER: listener_pb2.Listener,
    types.ROUTE: route_pb2.RouteConfiguration,
    types.SECRET: secret_pb2.Secret,
}

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"

#: Decides whether to reject a response: (type_url, what the client would hold of that type if it
#: took the response, by name) -> an error message or None.
NackRule = Callable[[str, Mapping[str, Message]], str | None]

#: Types whose state-of-the-world responses update only the names they carry (the xDS protocol's
#: "grouping resources into responses": all but Listener and Cluster).
PARTIAL_SOTW_TYPES = frozenset((types.ENDPOINT, types.ROUTE, types.SECRET))


@dataclass(frozen=True, slots=True)
class Received:
    at: float
    type_url: str
    version: str
    nonce: str
    names: tuple[str, ...]
    removed: tuple[str, ...] = ()


@dataclass
class _TypeState:
    names: set[str] = field(default_factory=set)
    version: str = ""
    nonce: str = ""
    started: bool = False


def _name(message: Message) -> str:
    return str(getattr(message, "cluster_name", "") or getattr(message, "name", ""))


def eds_names(clusters: Mapping[str, Message]) -> set[str]:
    return {n for n, c in clusters.items() if c.type == cluster_pb2.Cluster.EDS}  # type: ignore[attr-defined]


def rds_names(listeners: Mapping[str, Message]) -> set[str]:
    out: set[str] = set()
    for listener in listeners.values():
        chains = [*listener.filter_chains]  # type: ignore[attr-defined]
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)  # type: ignore[attr-defined]
        for chain in chains:
            for f in chain.filters:
                if f.typed_config.type_url == _HCM:
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    if hcm.HasField("rds"):
                        out.add(hcm.rds.route_config_name)
    return out


class AdsClient:
    """One simulated Envoy on one ADS stream; use as an async context manager."""

    def __init__(
        self,
        address: str,
        node_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        delta: bool = False,
        nack: NackRule | None = None,
        channel: grpc.aio.Channel | None = None,
        shared: dict[tuple[str, bytes], Message] | None = None,
    ) -> None:
        """`shared`, when given, holds decoded resources by their bytes for every client that
        is given the same dict: a thousand clients in one process that are sent the same
        cluster keep one decoded copy of it (treat what `resources` holds as read-only then)."""
        self.address, self.node_id, self.delta = address, node_id, delta
        self._shared = shared
        self._metadata = dict(metadata or {})
        self._nack = nack
        self._own_channel = channel is None
        self._channel = channel
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self._state = {t: _TypeState() for t in types.PUSH_ORDER}
        self.resources: dict[str, dict[str, Message]] = {t: {} for t in types.PUSH_ORDER}
        self.log: list[Received] = []
        self.errors: list[str] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._first = True
        self.closed: BaseException | None = None

    async def __aenter__(self) -> AdsClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address)
        method = _METHOD_DELTA if self.delta else _METHOD_SOTW
        response_class = discovery_pb2.DeltaDiscoveryResponse if self.delta else discovery_pb2.DiscoveryResponse
        call = self._channel.stream_stream(
            method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_class.FromString
        )(self._requests())
        self._task = asyncio.create_task(self._receive(call))
        # As Envoy starts: clusters first; listeners once the clusters have their endpoints.
        self._subscribe(types.CLUSTER, set())

    async def close(self) -> None:
        await self._queue.put(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task
        if self._own_channel and self._channel is not None:
            await self._channel.close(None)

    # -- requests ----------------------------------------------------------------------------

    async def _requests(self) -> AsyncIterator[Message]:
        while True:
            request = await self._queue.get()
            if request is None:
                return
            yield request

    def _node(self, request: Any) -> None:
        if self._first:
            request.node.id = self.node_id
            request.node.cluster = "meshctl-test"
            if self._metadata:
                meta = struct_pb2.Struct()
                meta.update(self._metadata)
                request.node.metadata.CopyFrom(meta)
            self._first = False

    def _subscribe(self, type_url: str, names: set[str]) -> None:
        state = self._state[type_url]
        if self.delta:
            request = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url)
            if not state.started:
                request.resource_names_subscribe.extend(sorted(names))
            else:
                request.resource_names_subscribe.extend(sorted(names - state.names))
                request.resource_names_unsubscribe.extend(sorted(state.names - names))
        else:
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url, version_info=state.version, response_nonce=state.nonce, resource_names=sorted(names)
            )
        state.started = True
        state.names = set(names)
        if not self.delta and type_url in PARTIAL_SOTW_TYPES:
            held = self.resources[type_url]
            self.resources[type_url] = {n: m for n, m in held.items() if n in names}
        self._node(request)
        self._queue.put_nowait(request)

    def _answer(self, type_url: str, nonce: str, error: str | None) -> None:
        state = self._state[type_url]
        if self.delta:
            request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce)
        else:
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url, version_info=state.version, response_nonce=nonce, resource_names=sorted(state.names)
            )
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self._queue.put_nowait(request)

    # -- responses ---------------------------------------------------------------------------

    async def _receive(self, call: Any) -> None:
        try:
            async for response in call:
                self._apply(response)
                async with self._changed:
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            self.closed = exc
        finally:
            async with self._changed:
                self._changed.notify_all()

    def _decode(self, type_url: str, cls: type[Message], packed: Any) -> Message:
        shared = self._shared
        if shared is not None:
            found = shared.get((type_url, packed.value))
            if found is not None:
                return found
        m = cls()
        packed.Unpack(m)
        if shared is not None:
            shared[(type_url, packed.value)] = m
        return m

    def _apply(self, response: Any) -> None:
        type_url = response.type_url
        cls = _CLASSES[type_url]
        decoded: dict[str, Message] = {}
        removed: tuple[str, ...] = ()
        if self.delta:
            for r in response.resources:
                decoded[r.name] = self._decode(type_url, cls, r.resource)
            removed = tuple(response.removed_resources)
            candidate = {**self.resources[type_url], **decoded}
            for name in removed:
                candidate.pop(name, None)
        else:
            for any_msg in response.resources:
                m = self._decode(type_url, cls, any_msg)
                decoded[_name(m)] = m
            if type_url in PARTIAL_SOTW_TYPES:
                # Envoy applies the names it watches, and ignores the others.
                watched = self._state[type_url].names
                fresh = {n: m for n, m in decoded.items() if n in watched}
                candidate = {**self.resources[type_url], **fresh}
            else:
                candidate = decoded
        version = response.system_version_info if self.delta else response.version_info
        self.log.append(Received(time.monotonic(), type_url, version, response.nonce, tuple(decoded), removed))
        error = self._nack(type_url, candidate) if self._nack is not None else None
        state = self._state[type_url]
        if error is not None:
            self.errors.append(error)
            self._answer(type_url, response.nonce, error)
            return
        self.resources[type_url] = candidate
        state.version, state.nonce = version, response.nonce
        self._answer(type_url, response.nonce, None)
        self._follow_up(type_url)

    def _follow_up(self, type_url: str) -> None:
        """The subscriptions a response of `type_url` leads to, as Envoy makes them."""
        candidate = self.resources[type_url]
        if type_url == types.CLUSTER:
            wanted = eds_names(candidate)
            if wanted != self._state[types.ENDPOINT].names or not self._state[types.ENDPOINT].started:
                self._subscribe(types.ENDPOINT, wanted)
        if not self._state[types.LISTENER].started and eds_names(self.resources[types.CLUSTER]) <= set(
            self.resources[types.ENDPOINT]
        ):
            self._subscribe(types.LISTENER, set())
        if type_url == types.LISTENER:
            wanted = rds_names(candidate)
            if wanted != self._state[types.ROUTE].names or not self._state[types.ROUTE].started:
                self._subscribe(types.ROUTE, wanted)
        if type_url in (types.CLUSTER, types.LISTENER):
            named = secret_names(self.resources[types.CLUSTER].values(), self.resources[types.LISTENER].values())
            if named and named != self._state[types.SECRET].names:
                self._subscribe(types.SECRET, named)

    # -- waiting -----------------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[AdsClient], bool], timeout: float = 10.0) -> None:
        """Wait until `predicate(self)` holds; raises TimeoutError saying what was received."""

        async def waiting() -> None:
            async with self._changed:
                while not predicate(self):
                    if self.closed is not None:
                        raise ConnectionError(f"stream closed: {self.closed}")
                    await self._changed.wait()

        try:
            await asyncio.wait_for(waiting(), timeout)
        except TimeoutError:
            have = {types.SHORT_NAMES[t]: sorted(v) for t, v in self.resources.items()}
            raise TimeoutError(f"condition not met in {timeout}s; client holds {have}") from None

    def names(self, type_url: str) -> set[str]:
        return set(self.resources[type_url])

    def complete(self) -> bool:
        """Holds clusters, listeners, and every endpoint and route config they name."""
        received = {r.type_url for r in self.log}
        return (
            {types.CLUSTER, types.LISTENER} <= received
            and eds_names(self.resources[types.CLUSTER]) <= self.names(types.ENDPOINT)
            and rds_names(self.resources[types.LISTENER]) <= self.names(types.ROUTE)
        )


def api_listener_routes(listeners: Mapping[str, Message]) -> set[str]:
    """The route configs the API listeners (a gRPC client's) name over RDS."""
    out: set[str] = set()
    for listener in listeners.values():
        typed = listener.api_listener.api_listener  # type: ignore[attr-defined]
        if typed.type_url == _HCM:
            hcm = hcm_pb2.HttpConnectionManager()
            typed.Unpack(hcm)
            if hcm.HasField("rds"):
                out.add(hcm.rds.route_config_name)
    return out


def route_clusters(routes: Mapping[str, Message]) -> set[str]:
    """The clusters the routes send to (one or a weighted set each)."""
    out: set[str] = set()
    for config in routes.values():
        for vh in config.virtual_hosts:  # type: ignore[attr-defined]
            for route in vh.routes:
                if route.route.cluster:
                    out.add(route.route.cluster)
                out.update(c.name for c in route.route.weighted_clusters.clusters)
    return out


class GrpcAdsClient(AdsClient):
    """A proxyless gRPC node (`GENERATOR: grpc`) subscribing as grpcio's xDS client does, for
    the names it dials: listeners by name (`host:port`, one per channel), then the route
    configs they name, the clusters those routes send to and their endpoints, each by name (never
    the wildcard) and ACKed. `dialed` are the listener names; server listener names
    (`xds.istio.io/grpc/lds/inbound/...`) may be among them."""

    def __init__(self, address: str, node_id: str, *, dialed: Iterable[str], **kwargs: Any) -> None:
        metadata = {**(kwargs.pop("metadata", None) or {}), "GENERATOR": "grpc"}
        super().__init__(address, node_id, metadata=metadata, **kwargs)
        self.dialed = frozenset(dialed)

    def _subscribe(self, type_url: str, names: set[str]) -> None:
        if type_url == types.CLUSTER and not self._state[types.LISTENER].started:
            # The base class starts as Envoy, with clusters: gRPC starts with its listeners.
            type_url, names = types.LISTENER, set(self.dialed)
        super()._subscribe(type_url, names)

    def _follow_up(self, type_url: str) -> None:
        held = self.resources
        if type_url == types.LISTENER:
            next_type, names = types.ROUTE, api_listener_routes(held[types.LISTENER])
        elif type_url == types.ROUTE:
            next_type, names = types.CLUSTER, route_clusters(held[types.ROUTE])
        elif type_url == types.CLUSTER:
            next_type, names = types.ENDPOINT, eds_names(held[types.CLUSTER])
        else:
            return
        state = self._state[next_type]
        if names != state.names or not state.started:
            self._subscribe(next_type, names)

    def complete(self) -> bool:
        """Holds every dialed listener, and every route config, cluster and assignment they
        lead to."""
        held = self.resources
        return (
            self.dialed <= self.names(types.LISTENER)
            and api_listener_routes(held[types.LISTENER]) <= self.names(types.ROUTE)
            and route_clusters(held[types.ROUTE]) <= self.names(types.CLUSTER)
            and eds_names(held[types.CLUSTER]) <= self.names(types.ENDPOINT)
        )
