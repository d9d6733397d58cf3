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
from types import MappingProxyType
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
from meshctl.xds.resources import varint

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
    return {n for n, c in clusters.items() if _is_eds(c)}


def _is_eds(cluster: Message) -> bool:
    return bool(cluster.type == cluster_pb2.Cluster.EDS)  # type: ignore[attr-defined]


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


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the client's follow-ups read of one decoded resource."""

    message: Message  # held, so the id it is found by stays its own
    name: str
    is_eds: bool
    #: the SDS secrets a cluster or listener names
    secrets: frozenset[str]
    #: the route configurations a listener names over RDS
    rds: frozenset[str]


def _facts_of(type_url: str, message: Message) -> _Facts:
    is_cluster, is_listener = type_url == types.CLUSTER, type_url == types.LISTENER
    secrets: frozenset[str] = frozenset()
    if is_cluster or is_listener:
        secrets = frozenset(secret_names([message] if is_cluster else [], [message] if is_listener else []))
    rds = frozenset(rds_names({"": message})) if is_listener else frozenset()
    return _Facts(message, _name(message), is_cluster and _is_eds(message), secrets, rds)


@dataclass(frozen=True, slots=True)
class _Sent:
    """A state-of-the-world response's resources, decoded, by name; and what they name."""

    by_name: Mapping[str, Message]
    eds: frozenset[str]
    secrets: frozenset[str]
    rds: frozenset[str]


def _sent(facts: Iterable[_Facts]) -> _Sent:
    """What a set of resources holds and names (resources of one name: the last wins)."""
    last = {f.name: f for f in facts}
    eds = frozenset(n for n, f in last.items() if f.is_eds)
    secrets = frozenset(s for f in last.values() for s in f.secrets)
    rds = frozenset(r for f in last.values() for r in f.rds)
    return _Sent(MappingProxyType({n: f.message for n, f in last.items()}), eds, secrets, rds)


_NONCE_TAG = bytes([5 << 3 | 2])  # DiscoveryResponse.nonce: field 5, length-delimited
_RESPONSES_KEPT = 4096


def _without_nonce(data: bytes, nonce: str) -> tuple[int, bytes]:
    """A response's encoding without its nonce field, and where that field was: what is the
    same for every stream sent the same resources (the nonce is each stream's own)."""
    if not nonce:
        return -1, data
    encoded = nonce.encode()
    field_bytes = _NONCE_TAG + varint(len(encoded)) + encoded
    at = data.rfind(field_bytes)
    if at < 0:
        return -1, data
    return at, data[:at] + data[at + len(field_bytes) :]


@dataclass
class SharedDecoding:
    """Decoded resources shared by the clients given the same one (`AdsClient(shared=...)`):
    each resource by its type and bytes, what the clients read of each by its identity, and
    each state-of-the-world response by its bytes without the nonce.

    The clients of a simulated fleet share the machine with the server they measure, and the
    proxies of one namespace are sent the same responses: a CDS response of a thousand clusters
    is then decoded and read once, not once per proxy. Bytes are found by their type, length and
    a few of them, then compared whole: a route configuration at 10,000 services is 400 KB, and
    hashing it for every client cost more than the comparison (each `Any.value` read is a new
    bytes object, whose hash is not kept)."""

    messages: dict[tuple[str, int, bytes, bytes], list[tuple[bytes, Message]]] = field(default_factory=dict)
    facts: dict[int, _Facts] = field(default_factory=dict)
    responses: dict[tuple[str, int, int, bytes, bytes], list[tuple[bytes, _Sent]]] = field(default_factory=dict)

    @staticmethod
    def _key(type_url: str, value: bytes) -> tuple[str, int, bytes, bytes]:
        return (type_url, len(value), value[:64], value[-64:])

    def find(self, type_url: str, value: bytes) -> Message | None:
        for held, message in self.messages.get(self._key(type_url, value), ()):
            if held == value:
                return message
        return None

    def keep(self, type_url: str, value: bytes, message: Message) -> None:
        self.messages.setdefault(self._key(type_url, value), []).append((value, message))

    def sent(self, type_url: str, data: bytes, nonce: str, make: Callable[[], _Sent]) -> _Sent:
        """The response `data` (with `nonce`) decoded: by `make` the first time its resources
        come, after that as they were."""
        at, rest = _without_nonce(data, nonce)
        key = (type_url, at, len(rest), rest[:64], rest[-64:])
        for held, found in self.responses.get(key, ()):
            if held == rest:
                return found
        made = make()
        if len(self.responses) >= _RESPONSES_KEPT:
            self.responses.clear()
        self.responses.setdefault(key, []).append((rest, made))
        return made


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
        shared: SharedDecoding | None = None,
    ) -> None:
        """`shared`, when given, holds decoded resources by their bytes for every client that
        is given the same one: a thousand clients in one process that are sent the same
        cluster keep one decoded copy of it (treat what `resources` holds as read-only then),
        and what the client reads of each (its name, whether it is an EDS cluster, the
        secrets it names) is then worked out once per decoded copy, not once per client and
        response: a simulated fleet's clients share the machine with the server they measure."""
        self.address, self.node_id, self.delta = address, node_id, delta
        self._shared = shared
        self._facts = shared.facts if shared is not None else None
        #: the encoded size of the response being applied (read by subclasses that count bytes)
        self.response_bytes = 0
        self._response_data = b""
        #: what the clusters and listeners held name (EDS clusters, SDS secrets, route configs)
        self._named: dict[str, _Sent] = {t: _sent(()) for t in (types.CLUSTER, types.LISTENER)}
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
        call = self._channel.stream_stream(
            method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=self._deserializer()
        )(self._requests())
        self._task = asyncio.create_task(self._receive(call))
        # As Envoy starts: clusters first; listeners once the clusters have their endpoints.
        self._subscribe(types.CLUSTER, set())

    def _deserializer(self) -> Callable[[bytes], Any]:
        """The stream's response decoder; it notes each response's size, which is then applied
        before the next is read."""
        response_class = discovery_pb2.DeltaDiscoveryResponse if self.delta else discovery_pb2.DiscoveryResponse

        def decode(data: bytes) -> Any:
            self.response_bytes = len(data)
            self._response_data = data
            return response_class.FromString(data)

        return decode

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
        if shared is None:
            m = cls()
            packed.Unpack(m)
            return m
        value = packed.value
        found = shared.find(type_url, value)
        if found is not None:
            return found
        m = cls.FromString(value)
        shared.keep(type_url, value, m)
        return m

    def _fact(self, type_url: str, message: Message) -> _Facts:
        """`message`'s facts: kept by its identity among clients that share decoded copies."""
        facts = self._facts
        if facts is None:
            return _facts_of(type_url, message)
        found = facts.get(id(message))
        if found is None or found.message is not message:
            found = facts[id(message)] = _facts_of(type_url, message)
        return found

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
            sent = self._sotw_sent(type_url, cls, response)
            decoded = sent.by_name  # type: ignore[assignment]  # read-only: shared between clients
            if type_url in PARTIAL_SOTW_TYPES:
                # Envoy applies the names it watches, and ignores the others.
                watched = self._state[type_url].names
                fresh = {n: m for n, m in decoded.items() if n in watched}
                candidate = {**self.resources[type_url], **fresh}
            else:
                candidate = dict(decoded)
        version = response.system_version_info if self.delta else response.version_info
        self.log.append(Received(time.monotonic(), type_url, version, response.nonce, tuple(decoded), removed))
        error = self._nack(type_url, candidate) if self._nack is not None else None
        state = self._state[type_url]
        if error is not None:
            self.errors.append(error)
            self._answer(type_url, response.nonce, error)
            return
        self.resources[type_url] = candidate
        if type_url in self._named:
            self._named[type_url] = (
                sent if not self.delta else _sent(self._fact(type_url, m) for m in candidate.values())
            )
        state.version, state.nonce = version, response.nonce
        self._answer(type_url, response.nonce, None)
        self._follow_up(type_url)

    def _sotw_sent(self, type_url: str, cls: type[Message], response: Any) -> _Sent:
        """A state-of-the-world response's resources, decoded; shared with the clients sent the
        same (`SharedDecoding.sent`)."""

        def make() -> _Sent:
            return _sent(self._fact(type_url, self._decode(type_url, cls, r)) for r in response.resources)

        if self._shared is None:
            return make()
        return self._shared.sent(type_url, self._response_data, response.nonce, make)

    def _follow_up(self, type_url: str) -> None:
        """The subscriptions a response of `type_url` leads to, as Envoy makes them."""
        clusters, listeners = self._named[types.CLUSTER], self._named[types.LISTENER]
        endpoints = self._state[types.ENDPOINT]
        if type_url == types.CLUSTER and (clusters.eds != endpoints.names or not endpoints.started):
            self._subscribe(types.ENDPOINT, set(clusters.eds))
        if not self._state[types.LISTENER].started and clusters.eds <= self.resources[types.ENDPOINT].keys():
            self._subscribe(types.LISTENER, set())
        routes = self._state[types.ROUTE]
        if type_url == types.LISTENER and (listeners.rds != routes.names or not routes.started):
            self._subscribe(types.ROUTE, set(listeners.rds))
        if type_url in (types.CLUSTER, types.LISTENER):
            named = clusters.secrets | listeners.secrets
            if named and named != self._state[types.SECRET].names:
                self._subscribe(types.SECRET, set(named))

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
            and self._named[types.CLUSTER].eds <= self.resources[types.ENDPOINT].keys()
            and self._named[types.LISTENER].rds <= self.resources[types.ROUTE].keys()
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
