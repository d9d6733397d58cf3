"""Simulated proxies for the fleet benchmark, in worker processes of their own.

Each worker runs a share of the fleet on one asyncio loop: one `AdsClient` per proxy, each on its
own channel and TCP connection (as each Envoy has its own), subscribing as Envoy does and ACKing
everything. The load must not share the server's interpreter, nor the parent's: the parent only
writes files and reads the results.

The parent drives the workers over a pipe, one phase at a time:

- `("connect", address, check)` opens every stream, with `check` armed on all of them;
- `("arm", check, affected)` arms `check` on the affected proxies (and counts what the others
  receive, which should be nothing);
- `("collect", timeout)` waits until every armed proxy holds what `check` says, or the timeout;
  the answer gives, per proxy, when the response that made `check` hold arrived
  (`time.monotonic()`, the same clock in every process on Linux);
- `("close",)` closes every stream.

A check is plain data, evaluated on what the proxy holds after each response (`holds`): exact,
and cheap enough to run on every response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing.connection
import os
import resource
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from meshctl.testing.ads_client import AdsClient
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


def holds(client: AdsClient, check: Check) -> bool:
    """Whether the proxy holds what `check` describes:

    - `("complete",)`: clusters, listeners and every endpoint and route config they name;
    - `("route_timeout", host, seconds)`: a route of `host`'s virtual host has that timeout;
    - `("max_connections", cluster, n)`: the cluster's circuit breaker allows `n` connections;
    - `("endpoint", cluster, ip, present)`: the cluster's assignment has (or lacks) `ip`.
    """
    kind = check[0]
    if kind == "complete":
        return client.complete()
    if kind == "route_timeout":
        _, host, seconds = check
        for config in client.resources[types.ROUTE].values():
            for vhost in config.virtual_hosts:  # type: ignore[attr-defined]
                if host in vhost.domains:
                    return any(r.route.timeout.seconds == seconds for r in vhost.routes)
        return False
    if kind == "max_connections":
        _, name, limit = check
        cluster = client.resources[types.CLUSTER].get(name)
        if cluster is None:
            return False
        thresholds = cluster.circuit_breakers.thresholds  # type: ignore[attr-defined]
        return bool(thresholds) and thresholds[0].max_connections.value == limit
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
    hold is applied (so the time is the response's arrival, not when a waiter woke up)."""

    def __init__(self, *args: Any, on_hit: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.check: Check | None = None
        self.hit: float | None = None
        self.responses = 0
        self._on_hit = on_hit

    def arm(self, check: Check | None) -> None:
        self.check, self.hit, self.responses = check, None, 0

    def _apply(self, response: Any) -> None:
        super()._apply(response)
        self.responses += 1
        if self.check is not None and self.hit is None and holds(self, self.check):
            self.hit = self.log[-1].at
            self._on_hit()


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
    proxies: dict[str, SimulatedProxy] = field(default_factory=dict)
    channels: list[grpc.aio.Channel] = field(default_factory=list)
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

    async def connect(self, address: str, check: Check) -> None:
        # Proxies of one scope are sent the same resources: one decoded copy for all of them
        # (at 10,000 services each proxy holds thousands, and a copy each took 12 GB).
        shared: dict[tuple[str, bytes], Any] = {}
        for node_id in self.node_ids:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self.channels.append(channel)
            proxy = SimulatedProxy(
                address,
                node_id,
                delta=self.delta,
                channel=_WaitForReady(channel),  # type: ignore[arg-type]
                on_hit=self.hit,
                shared=shared,
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
        return {"hits": hits, "others": others, "errors": errors, "nacks": nacks}

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.proxies.values()), return_exceptions=True)
        await asyncio.gather(*(c.close(None) for c in self.channels), return_exceptions=True)


def worker_main(conn: multiprocessing.connection.Connection, node_ids: Sequence[str], delta: bool) -> None:
    """A worker process: serve the parent's commands until told to close."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(_Worker(conn, node_ids, delta)))


async def _serve(worker: _Worker) -> None:
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
                worker.conn.send(("connected",))
            case "arm":
                _, check, affected = command
                worker.arm(check, affected)
                worker.conn.send(("armed",))
            case "collect":
                result = await worker.collect(command[1])
                result["cpu_s"] = _cpu_seconds()
                worker.conn.send(("result", result))
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
