"""Simulated proxies for the fleet benchmark, in worker processes of their own.

Each worker runs a share of the fleet on one asyncio loop: one `AdsClient` per proxy, each on its
own channel and TCP connection (as each Envoy has its own), subscribing as Envoy does (or, for
`bench/run.py --grpc`, as grpcio's xDS client does: `GrpcSimulatedProxy`) and ACKing everything.
The load must not share the server's interpreter, nor the parent's: the parent only writes files
and reads the results.

The parent drives the workers over a pipe, one phase at a time:

- `("connect", address, check)` opens every stream, with `check` armed on all of them;
- `("arm", check, affected)` arms `check` on the affected proxies (and counts what the others
  receive, which should be nothing);
- `("collect", timeout)` waits until every armed proxy holds what `check` says, or the timeout;
  the answer gives, per proxy, when the response that made `check` hold arrived
  (`time.monotonic()`, the same clock in every process on Linux), and the bytes and responses
  of each type the proxies received since they were connected or last armed;
- `("drop", node_ids)` closes those proxies' streams, as Envoys that leave (their VMs stopped);
- `("streams",)` answers, per proxy, where its stream is and how it got there (failover only);
- `("close",)` closes every stream.

Failover (`bench/failover.py`): `connect` given several addresses (replicas) starts each proxy on
one of them in turn, and a proxy whose stream ends opens a new one after Envoy's jittered backoff,
to the next address (as Envoy's round robin over its `xds-grpc` endpoints does), presenting what it
holds: SotW the `version_info` it last accepted, delta `initial_resource_versions`. It never gives
up, as Envoy does not. Given one address, a proxy keeps one stream as before.

A check is plain data, evaluated on what the proxy holds after each response (`holds`): exact,
and cheap enough to run on every response.

The clients share the machine with the server they measure, so what they spend per response is
kept small: decoded resources and what is read of them are shared (`SharedDecoding`), and what
the fleet holds after the connect is frozen out of the cyclic collector. With the environment
variable `MESHCTL_BENCH_CLIENT_PROFILE=PREFIX`, each worker writes a cProfile per phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import functools
import gc
import multiprocessing.connection
import os
import random
import resource
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from meshctl.server.ads import TOO_MANY_NEW_STREAMS
from meshctl.testing.ads_client import AdsClient, GrpcAdsClient, SharedDecoding
from meshctl.xds import types

#: Every proxy has its own TCP connection (a shared subchannel would multiplex them all on one),
#: reconnects fast, and takes the large responses an unscoped mesh produces.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)

Check = tuple[Any, ...]

#: Envoy's ADS retry (`GrpcStream`: a `JitteredExponentialBackOffStrategy` of 500 ms base and 30 s
#: most): each wait is uniform below an interval that doubles per failed attempt; a response resets it.
RETRY_BASE_S = 0.5
RETRY_MAX_S = 30.0
#: What Envoy asks for again on a new stream, in the order it first subscribed.
RESUBSCRIBE_ORDER = (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE, types.SECRET)
_METHODS = {
    False: "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
    True: "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
}


class EnvoyBackoff:
    """Envoy's `JitteredExponentialBackOffStrategy::nextBackOffMs`: random below the interval, which
    then doubles (up to the most); proxies that lost one replica together so do not all come back
    in the same instant."""

    def __init__(self, rng: random.Random, base: float = RETRY_BASE_S, most: float = RETRY_MAX_S) -> None:
        self._rng, self._base, self._most = rng, base, most
        self._interval = base

    def next(self) -> float:
        interval = self._interval
        self._interval = self._most if interval > self._most / 2 else interval * 2
        return min(self._rng.random() * interval, self._most)

    def reset(self) -> None:
        self._interval = self._base


#: id of a route configuration -> (it, its virtual hosts by domain). The proxies of a worker
#: share decoded resources (`AdsClient(shared=...)`), so a namespace's route configuration is
#: indexed once, not scanned once per proxy: at 10,000 services a scan of its thousand virtual
#: hosts costs about a millisecond, and 2,000 proxies checking a change took seconds of the
#: two cores the server shares with the load clients.
_DOMAINS: dict[int, tuple[Any, dict[str, Any]]] = {}
_DOMAINS_KEPT = 256


def virtual_host(config: Any, domain: str) -> Any:
    """The first virtual host of `config` with `domain`, or None."""
    entry = _DOMAINS.get(id(config))
    if entry is None or entry[0] is not config:
        if len(_DOMAINS) >= _DOMAINS_KEPT:
            _DOMAINS.clear()
        index: dict[str, Any] = {}
        for vhost in config.virtual_hosts:
            for name in vhost.domains:
                index.setdefault(name, vhost)
        entry = _DOMAINS[id(config)] = (config, index)
    return entry[1].get(domain)


def holds(client: AdsClient, check: Check) -> bool:
    """Whether the proxy holds what `check` describes:

    - `("complete",)`: clusters, listeners and every endpoint, route config and SDS secret they
      name (a cluster or listener whose secret has not arrived is still warming in Envoy);
    - `("renewed", secret)`: the proxy holds `secret`, and not the one it held when armed;
    - `("route_timeout", host, seconds)`: a route of `host`'s virtual host has that timeout;
    - `("stream_duration", domain, seconds)`: a route of the virtual host with that domain has
      that `max_stream_duration` (a gRPC node's route timeout);
    - `("max_requests", cluster, n)`: the cluster's circuit breaker allows `n` requests;
    - `("max_connections", cluster, n)`: the cluster's circuit breaker allows `n` connections;
    - `("connect_timeout", cluster, seconds)`: the cluster has that connect timeout;
    - `("endpoint", cluster, ip, present)`: the cluster's assignment has (or lacks) `ip`.
    """
    kind = check[0]
    if kind == "complete":
        secrets = getattr(client, "secrets_named", ())
        return client.complete() and all(n in client.resources[types.SECRET] for n in secrets)
    if kind == "renewed":
        held = client.resources[types.SECRET].get(check[1])
        return held is not None and held != getattr(client, "baseline", None)
    if kind == "route_timeout":
        _, host, seconds = check
        for config in client.resources[types.ROUTE].values():
            vhost = virtual_host(config, host)
            if vhost is not None:
                return any(r.route.timeout.seconds == seconds for r in vhost.routes)
        return False
    if kind == "stream_duration":
        _, domain, seconds = check
        for config in client.resources[types.ROUTE].values():
            vhost = virtual_host(config, domain)
            if vhost is not None:
                return any(r.route.max_stream_duration.max_stream_duration.seconds == seconds for r in vhost.routes)
        return False
    if kind == "max_requests":
        _, name, limit = check
        cluster = client.resources[types.CLUSTER].get(name)
        if cluster is None:
            return False
        thresholds = cluster.circuit_breakers.thresholds  # type: ignore[attr-defined]
        return bool(thresholds) and thresholds[0].max_requests.value == limit
    if kind == "max_connections":
        _, name, limit = check
        cluster = client.resources[types.CLUSTER].get(name)
        if cluster is None:
            return False
        thresholds = cluster.circuit_breakers.thresholds  # type: ignore[attr-defined]
        return bool(thresholds) and thresholds[0].max_connections.value == limit
    if kind == "connect_timeout":
        _, name, seconds = check
        cluster = client.resources[types.CLUSTER].get(name)
        return cluster is not None and cluster.connect_timeout.seconds == seconds  # type: ignore[attr-defined]
    if kind == "endpoint":
        _, name, ip, present = check
        cla = client.resources[types.ENDPOINT].get(name)
        if cla is None:
            return False
        found = any(
            lb.endpoint.address.socket_address.address == ip
            for locality in cla.endpoints  # type: ignore[attr-defined]
            for lb in locality.lb_endpoints
        )
        return bool(found == present)
    raise ValueError(f"unknown check {check!r}")


class SimulatedProxy(AdsClient):
    """An AdsClient that notes when an armed check first holds, as the response that made it
    hold is applied (so the time is the response's arrival, not when a waiter woke up), and
    counts what it receives by type.

    Given `addresses` (more than one, with a channel each in `channels`), it fails over as Envoy
    does (see the module docstring) and keeps count of its streams for `stream_state`."""

    def __init__(
        self,
        *args: Any,
        on_hit: Any,
        addresses: Sequence[str] = (),
        channels: Mapping[str, grpc.aio.Channel] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.addresses = tuple(addresses)
        self._channels = dict(channels or {})
        self._backoff = EnvoyBackoff(random.Random(self.node_id))
        self._attempt = 0
        #: delta: type URL -> name -> the version it was sent (for `initial_resource_versions`)
        self.versions: dict[str, dict[str, str]] = {t: {} for t in types.PUSH_ORDER}
        #: the stream's state, and its counts since connected or last armed (failover)
        self.alive = False
        self.opened_at = time.monotonic()
        self.last_response_at: float | None = None
        self.attempts = self.refused = self.failed = 0
        #: why streams ended other than refused: "ADDRESS CODE: details" -> how many
        self.ends: dict[str, int] = {}
        self.check: Check | None = None
        self.hit: float | None = None
        self.responses = 0
        #: the secrets its clusters and listeners name (what it subscribed to over SDS)
        self.secrets_named: frozenset[str] = frozenset()
        #: what a `renewed` check compares with: the secret held when armed
        self.baseline: Any = None
        #: type URL -> [responses, bytes] since connected or last armed
        self.received: dict[str, list[int]] = {}
        self._on_hit = on_hit

    def arm(self, check: Check | None) -> None:
        self.check, self.hit, self.responses = check, None, 0
        self.received = {}
        self.attempts = self.refused = self.failed = 0
        self.ends = {}
        self.last_response_at = None
        self.baseline = self.resources[types.SECRET].get(check[1]) if check and check[0] == "renewed" else None

    def _subscribe(self, type_url: str, names: set[str]) -> None:
        if type_url == types.SECRET:
            self.secrets_named = frozenset(names)
        super()._subscribe(type_url, names)

    def _apply(self, response: Any) -> None:
        counts = self.received.setdefault(response.type_url, [0, 0])
        counts[0] += 1
        counts[1] += self.response_bytes
        super()._apply(response)
        self.responses += 1
        self.last_response_at = time.monotonic()
        self._backoff.reset()  # as Envoy's GrpcStream::onReceiveMessage
        if self.delta:  # every response is ACKed here, so what it carried is held
            held = self.versions[response.type_url]
            held.update((r.name, r.version) for r in response.resources)
            for name in response.removed_resources:
                held.pop(name, None)
        if self.check is not None and self.hit is None and holds(self, self.check):
            self.hit = self.log[-1].at
            self._on_hit()

    # -- failover ------------------------------------------------------------------------------

    async def _requests(self) -> AsyncIterator[Any]:
        """The base class's, bound to the queue of this stream: a new stream gets a new queue,
        and the generator of a lost one must not take requests meant for its successor."""
        queue = self._queue
        while (request := await queue.get()) is not None:
            yield request

    async def _receive(self, call: Any) -> None:
        """Receive on the stream; with several addresses, when it ends, wait Envoy's backoff and
        open the next one, for as long as the proxy runs (`close` cancels this task)."""
        while True:
            self.alive = True
            await super()._receive(call)
            self.alive = False
            if len(self.addresses) < 2:
                return
            # Not closed for good: it retries, so `collect` must keep waiting for it.
            error, self.closed = self.closed, None
            refused = isinstance(error, grpc.aio.AioRpcError) and error.details() == TOO_MANY_NEW_STREAMS
            if refused:
                self.refused += 1
            else:
                self.failed += 1  # the replica died or was dead already (connection refused), or else: `ends`
                why = f"{error.code().name}: {error.details()}" if isinstance(error, grpc.aio.AioRpcError) else "ended"
                why = f"{self.address} {why}"[:200]
                self.ends[why] = self.ends.get(why, 0) + 1
            await asyncio.sleep(self._backoff.next())
            call = self._redial()

    def _redial(self) -> Any:
        """A new stream to the next address, asking again for everything watched, as Envoy does
        (`GrpcMuxImpl::onStreamEstablished`): per type, in the order first subscribed, the names
        and what is held; the nonces of the lost stream mean nothing on the new one."""
        self._attempt += 1
        self.address = self.addresses[self._attempt % len(self.addresses)]
        lost, self._queue = self._queue, asyncio.Queue()
        lost.put_nowait(None)
        self._first = True
        call = self._channels[self.address].stream_stream(
            _METHODS[self.delta],
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self._deserializer(),
        )(self._requests())
        self.attempts += 1
        self.opened_at = time.monotonic()
        for type_url in RESUBSCRIBE_ORDER:
            state = self._state[type_url]
            if not state.started:
                continue
            state.nonce = ""
            request: Any
            if self.delta:
                request = discovery_pb2.DeltaDiscoveryRequest(
                    type_url=type_url, resource_names_subscribe=sorted(state.names)
                )
                held = self.versions[type_url]
                request.initial_resource_versions.update({n: held[n] for n in self.resources[type_url] if n in held})
            else:
                request = discovery_pb2.DiscoveryRequest(
                    type_url=type_url, version_info=state.version, resource_names=sorted(state.names)
                )
            self._node(request)
            self._queue.put_nowait(request)
        return call

    def stream_state(self) -> dict[str, Any]:
        """Where the proxy's stream is, and how it got there since connected or last armed."""
        received = {types.SHORT_NAMES[t]: list(c) for t, c in self.received.items()}
        return {
            "address": self.address,
            "first": self.addresses[0] if self.addresses else self.address,
            "alive": self.alive,
            "opened_at": self.opened_at,
            "last_response_at": self.last_response_at,
            "attempts": self.attempts,
            "refused": self.refused,
            "failed": self.failed,
            "ends": dict(self.ends),
            "received": received,
            "complete": holds(self, ("complete",)),
        }


class GrpcSimulatedProxy(SimulatedProxy, GrpcAdsClient):
    """A proxyless gRPC application's xDS client (`GrpcAdsClient`: listeners by the names it
    dials, then routes, clusters and endpoints by name), timed and counted as `SimulatedProxy`."""


class _WaitForReady:
    """A channel whose streams wait for the connection instead of failing while it comes up,
    as Envoy keeps retrying its xDS server."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    def stream_stream(self, method: str, **kwargs: Any) -> Any:
        return functools.partial(self.channel.stream_stream(method, **kwargs), wait_for_ready=True)


@dataclass
class _Worker:
    conn: multiprocessing.connection.Connection
    node_ids: Sequence[str]
    delta: bool
    #: node id -> the names it dials, for proxyless gRPC clients (None: Envoys)
    dialed: Mapping[str, Sequence[str]] | None = None
    proxies: dict[str, SimulatedProxy] = field(default_factory=dict)
    #: node id -> its channels: one per address it may connect to
    channels: dict[str, list[grpc.aio.Channel]] = field(default_factory=dict)
    waiting: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def hit(self) -> None:
        self.waiting -= 1
        if self.waiting <= 0:
            self.done.set()

    def arm(self, check: Check, affected: Iterable[str] | None) -> None:
        chosen = set(self.node_ids if affected is None else affected)
        self.waiting = 0
        self.done.clear()
        for node_id, proxy in self.proxies.items():
            armed = node_id in chosen
            proxy.arm(check if armed else None)
            if armed:
                if holds(proxy, check):  # already there: a change that changes nothing for it
                    proxy.hit = time.monotonic()
                else:
                    self.waiting += 1
        if self.waiting == 0:
            self.done.set()

    async def connect(self, address: str | Sequence[str], check: Check) -> None:
        """Open every proxy's stream; given several addresses, proxy j starts on address j mod n
        and fails over to the others."""
        # Proxies of one scope are sent the same resources: one decoded copy for all of them
        # (at 10,000 services each proxy holds thousands, and a copy each took 12 GB).
        shared = SharedDecoding()
        everyone = (address,) if isinstance(address, str) else tuple(address)
        for j, node_id in enumerate(self.node_ids):
            mine = everyone[j % len(everyone) :] + everyone[: j % len(everyone)]
            channels = {a: grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS) for a in mine}
            self.channels[node_id] = list(channels.values())
            extra: dict[str, Any] = {}
            kind: type[SimulatedProxy] = SimulatedProxy
            if self.dialed is not None:
                kind, extra = GrpcSimulatedProxy, {"dialed": self.dialed[node_id]}
            proxy = kind(
                mine[0],
                node_id,
                delta=self.delta,
                **extra,
                channel=_WaitForReady(channels[mine[0]]),  # type: ignore[arg-type]
                on_hit=self.hit,
                shared=shared,
                addresses=mine if len(mine) > 1 else (),
                channels=channels,
            )
            self.proxies[node_id] = proxy
        self.arm(check, None)
        for proxy in self.proxies.values():
            await proxy.start()

    async def collect(self, timeout: float) -> dict[str, Any]:
        """Wait until every armed proxy has what it waits for, or lost its stream (a server that
        drops streams must show up as proxies that never converged, not as a hang), or `timeout`."""
        deadline = time.monotonic() + timeout
        while not self.done.is_set() and time.monotonic() < deadline:
            waiting = [p for p in self.proxies.values() if p.check is not None and p.hit is None]
            if all(p.closed is not None for p in waiting):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), min(0.5, max(0.0, deadline - time.monotonic())))
        hits = {n: p.hit for n, p in self.proxies.items() if p.check is not None}
        others = {n: p.responses for n, p in self.proxies.items() if p.check is None}
        errors = {n: str(p.closed) for n, p in self.proxies.items() if p.closed is not None}
        nacks = sum(len(p.errors) for p in self.proxies.values())
        received: dict[str, list[int]] = {}
        for p in self.proxies.values():
            for type_url, (count, size) in p.received.items():
                total = received.setdefault(types.SHORT_NAMES[type_url], [0, 0])
                total[0] += count
                total[1] += size
        return {"hits": hits, "others": others, "errors": errors, "nacks": nacks, "received": received}

    async def drop(self, node_ids: Iterable[str]) -> None:
        """Close these proxies' streams and forget them: they count in no later phase."""
        gone = [(self.proxies.pop(n), self.channels.pop(n)) for n in node_ids if n in self.proxies]
        await asyncio.gather(*(p.close() for p, _ in gone), return_exceptions=True)
        await asyncio.gather(*(c.close(None) for _, cs in gone for c in cs), return_exceptions=True)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.proxies.values()), return_exceptions=True)
        everything = [c for cs in self.channels.values() for c in cs]
        await asyncio.gather(*(c.close(None) for c in everything), return_exceptions=True)


def worker_main(
    conn: multiprocessing.connection.Connection,
    node_ids: Sequence[str],
    delta: bool,
    dialed: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """A worker process: serve the parent's commands until told to close. With `dialed` (node
    id -> listener names) the proxies are proxyless gRPC clients dialing those names."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(_Worker(conn, node_ids, delta, dialed)))


class _PhaseProfile:
    """With `PROFILE_ENV` set to a path prefix, each worker writes a cProfile of its loop's CPU
    (the thread's clock: not the waits, not gRPC's own threads) per phase, from one `arm` to
    the next, to `PREFIX.PID.N`: where the load clients' CPU goes, which the server's share of
    the two cores depends on."""

    def __init__(self) -> None:
        self.prefix = os.environ.get(PROFILE_ENV)
        self.profile: cProfile.Profile | None = None
        self.phase = 0

    def next_phase(self) -> None:
        if not self.prefix:
            return
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(f"{self.prefix}.{os.getpid()}.{self.phase}")
        self.phase += 1
        self.profile = cProfile.Profile(time.thread_time)
        self.profile.enable()


PROFILE_ENV = "MESHCTL_BENCH_CLIENT_PROFILE"


async def _serve(worker: _Worker) -> None:
    profile = _PhaseProfile()
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def readable() -> None:
        try:
            inbox.put_nowait(worker.conn.recv())
        except EOFError:
            loop.remove_reader(worker.conn.fileno())
            inbox.put_nowait(("close",))

    loop.add_reader(worker.conn.fileno(), readable)
    worker.conn.send(("ready", os.getpid()))
    while True:
        command = await inbox.get()
        match command[0]:
            case "connect":
                _, address, check = command
                await worker.connect(address, check)
                # What the fleet holds lives as long as the run: out of the cyclic collector,
                # whose full collections over it were a visible share of the clients' CPU.
                gc.collect()
                gc.freeze()
                worker.conn.send(("connected",))
            case "arm":
                _, check, affected = command
                profile.next_phase()
                worker.arm(check, affected)
                worker.conn.send(("armed",))
            case "collect":
                result = await worker.collect(command[1])
                result["cpu_s"] = _cpu_seconds()
                worker.conn.send(("result", result))
            case "drop":
                await worker.drop(command[1])
                worker.conn.send(("dropped",))
            case "streams":
                streams = {n: p.stream_state() for n, p in worker.proxies.items()}
                worker.conn.send(("streams", streams))
            case "close":
                await worker.close()
                with contextlib.suppress(BrokenPipeError, OSError):
                    worker.conn.send(("closed",))
                return
            case other:
                raise ValueError(f"unknown command {other!r}")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
