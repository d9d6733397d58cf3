"""Envoy's Health Discovery Service: each VM's Envoy probes its own app and reports here.

`meshctl bootstrap` gives every proxy an `hds_config` naming the same xDS servers, and this
servicer runs beside ADS on the same gRPC server. A stream's first message names its node; the
node is admitted, attested and bound to its workload by exactly the rules ADS uses
(`Server.admission`, `server/auth.py`, `bind_proxy`), so a node only ever hears of, and reports
on, its own workload: its stream is sent that workload's check (`xds/health_checks.py`, none
when it is not checked) and reports on any other cluster are ignored.

Reports become registry state (`meshctl.registry.health.HealthReports`): the registry lays them
over the files' endpoints, the snapshot carries them, and every proxy's EDS follows. A stream's
ending is noted too; once a workload's Envoy has had no stream for `grace` seconds, the workload
is unhealthy until its Envoy is back and reports (`HealthReports.expire`).

A stream is sent a new specification only when its workload's check changes (a probe edited);
Envoy rebuilds its health-check clusters on every specification it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import grpc
from envoy.config.core.v3 import health_check_pb2
from envoy.service.health.v3 import hds_pb2

from meshctl.errors import BindingError, NodeIdError
from meshctl.logs import untrusted
from meshctl.registry.health import HealthReports, WorkloadHealth, WorkloadKey
from meshctl.registry.health_checks import WorkloadCheck, workload_checks
from meshctl.registry.health_share import HEALTH_PREFIX, REGISTRATIONS_PREFIX, ConsulShare, ShareOptions, Views
from meshctl.server.ads import Authorizer, _metadata
from meshctl.server.auth import PeerIdentity
from meshctl.server.autoregister import AutoRegistrar
from meshctl.server.node_address import group_of, with_peer_address
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyNode, parse_node_id
from meshctl.xds.health_checks import STATUS_WORDS, health_check_specifier, health_cluster_name

logger = logging.getLogger("meshctl.server.health")

SERVICE: Final = "envoy.service.health.v3.HealthDiscoveryService"

_HEALTHY: Final = frozenset({health_check_pb2.HEALTHY, health_check_pb2.DEGRADED})


class _Stream:
    __slots__ = ("check", "key", "label", "node_id", "wake")

    def __init__(self, key: WorkloadKey | None, node_id: str) -> None:
        self.key = key
        self.node_id = node_id
        self.label = untrusted(node_id)
        self.check: WorkloadCheck | None = None
        self.wake = asyncio.Event()


class HealthDiscovery:
    """The HDS servicer: assignments out, reports in (see the module docstring)."""

    def __init__(
        self,
        reports: HealthReports,
        snapshot: Callable[[], Snapshot | None],
        *,
        grace: float = 10.0,
        authorize: Authorizer | None = None,
        admit: Callable[[], str | None] | None = None,
        observe: Callable[[int], None] | None = None,
        registrar: AutoRegistrar | None = None,
        checks: Callable[[], Mapping[WorkloadKey, WorkloadCheck]] | None = None,
    ) -> None:
        self.reports = reports
        self._snapshot = snapshot
        self.grace = grace
        self._authorize = authorize
        self._admit = admit
        #: Registers the VMs of `meshctl bootstrap --group` (`meshctl.server.autoregister`).
        self._registrar = registrar
        #: Told the number of streams open after each change (a metric).
        self._observe = observe or (lambda _count: None)
        self._ids = itertools.count(1)
        #: stream id -> stream, for pushes and `proxy-status`
        self.streams: dict[int, _Stream] = {}
        self._checks: tuple[str, Mapping[WorkloadKey, WorkloadCheck]] = ("", {})
        #: The checks the registry lays health over (`HealthCheckedRegistry.checks`), which know of
        #: registered VMs' entries too; without it, those of each snapshot's configs.
        self._current_checks = checks
        self._expiry: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    def handlers(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "StreamHealthCheck": grpc.stream_stream_rpc_method_handler(
                    self.stream,
                    request_deserializer=hds_pb2.HealthCheckRequestOrEndpointHealthResponse.FromString,
                    response_serializer=hds_pb2.HealthCheckSpecifier.SerializeToString,
                ),
            },
        )

    def checks(self, snapshot: Snapshot) -> Mapping[WorkloadKey, WorkloadCheck]:
        """The checked workloads of `snapshot`, computed once per version."""
        if self._current_checks is not None:
            return self._current_checks()
        version, found = self._checks
        if version != snapshot.version:
            found = workload_checks(snapshot.configs.values(), snapshot.services)
            self._checks = (snapshot.version, found)
        return found

    def publish(self, snapshot: Snapshot) -> None:
        """A new snapshot: wake the streams whose workload's check may have changed."""
        checks = self.checks(snapshot)
        for stream in self.streams.values():
            if stream.key is not None and checks.get(stream.key) != stream.check:
                stream.wake.set()

    def stop(self) -> None:
        """No more expiry timers: streams closing as the server stops are not a VM going away."""
        self._stopped = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    # -- one stream --------------------------------------------------------------------------

    async def stream(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        refusal = self._admit() if self._admit is not None else None
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        first = await anext(aiter(requests), None)
        if first is None:
            return
        node = self._node(first, context)
        if isinstance(node, tuple):
            await context.abort(*node)
        snapshot = self._snapshot()
        if snapshot is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server has not loaded its config yet")
        registered: WorkloadKey | None = None
        if self._registrar is not None and group_of(node):
            peer = PeerIdentity.from_auth_context(context.auth_context()) if self._authorize is not None else None
            found = self._registrar.entry_for(node, snapshot, peer)
            if isinstance(found, str):
                logger.warning("refused the registration of node %s: %s", untrusted(node.id), found)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, found)
            node, entry = found
            registered = (entry.namespace, entry.name)
            if self._registrar.opened(entry):
                try:
                    await self._registrar.apply()
                except BaseException:  # the client left meanwhile: its stream is gone as well
                    self._registrar.closed(registered)
                    self._expire_later()
                    raise
            workload = node.workload
        else:
            try:
                workload = bind_proxy(node, snapshot).workload
            except BindingError as exc:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        namespace, _, name = workload.partition("/")
        stream_id = next(self._ids)
        stream = _Stream((namespace, name) if name else None, node.id)
        self.streams[stream_id] = stream
        self._observe(len(self.streams))
        if stream.key is not None:
            self.reports.opened(stream.key)
        logger.info("proxy %s opened a health stream (workload %s)", stream.label, workload or "none")
        reader = asyncio.create_task(self._read(stream, requests))
        reader.add_done_callback(lambda _: stream.wake.set())
        try:
            # The snapshot now, not the one the stream was bound in: a registration may have been
            # published meanwhile, before this stream was there to be woken.
            await self._send(stream, context, self._snapshot() or snapshot, first=True)
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                if reader.done():
                    reader.result()
                    return
                current = self._snapshot()
                if current is not None:
                    await self._send(stream, context, current)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            del self.streams[stream_id]
            self._observe(len(self.streams))
            if stream.key is not None:
                self.reports.closed(stream.key)
            if registered is not None and self._registrar is not None:
                self._registrar.closed(registered)
            self._expire_later()
            logger.info("proxy %s closed its health stream", stream.label)

    def _node(self, first: Any, context: grpc.aio.ServicerContext[Any, Any]) -> ProxyNode | tuple[Any, str]:
        request = first.health_check_request
        if not first.HasField("health_check_request") or not request.node.id:
            return grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a health_check_request with node.id"
        try:
            node = parse_node_id(request.node.id, _metadata(request.node.metadata))
        except NodeIdError as exc:
            return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        addressed = with_peer_address(node, context.peer())
        if isinstance(addressed, str):
            logger.warning("refused the health stream of node %s: %s", untrusted(node.id), addressed)
            return grpc.StatusCode.INVALID_ARGUMENT, addressed
        node = addressed
        if self._authorize is not None and not (self._registrar is not None and group_of(node)):
            attested = self._authorize(node, context)
            if isinstance(attested, str):
                logger.warning("refused the health stream of node %s: %s", untrusted(node.id), attested)
                return grpc.StatusCode.PERMISSION_DENIED, attested
            node = attested
        return node

    async def _send(
        self, stream: _Stream, context: grpc.aio.ServicerContext[Any, Any], snapshot: Snapshot, *, first: bool = False
    ) -> None:
        check = self.checks(snapshot).get(stream.key) if stream.key is not None else None
        if not first and check == stream.check:
            return
        stream.check = check
        await context.write(health_check_specifier([check] if check is not None else []))

    async def _read(self, stream: _Stream, requests: AsyncIterator[Any]) -> None:
        async for message in requests:
            if message.HasField("endpoint_health_response") and stream.key is not None:
                self._report(stream, message.endpoint_health_response)

    def _report(self, stream: _Stream, response: Any) -> None:
        """Take the report on this stream's own workload's cluster; anything else is ignored."""
        check, key = stream.check, stream.key
        if check is None or key is None:
            return
        wanted = health_cluster_name(*key)
        statuses: dict[int, int] = {}
        for cluster in response.cluster_endpoints_health:
            if cluster.cluster_name != wanted:
                continue
            for locality in cluster.locality_endpoints_health:
                for endpoint in locality.endpoints_health:
                    statuses[endpoint.endpoint.address.socket_address.port_value] = endpoint.health_status
        ports = check.probe.ports
        if not ports or any(p not in statuses for p in ports):
            return  # a report of an earlier assignment, or none on this cluster
        failing = [(p, statuses[p]) for p in ports if statuses[p] not in _HEALTHY]
        if not failing:
            self.reports.report(key, True, f"{check.probe.kind.value} probe passing")
            return
        words = ", ".join(f"port {p} {STATUS_WORDS.get(s, 'failing')}" for p, s in failing)
        self.reports.report(key, False, f"{check.probe.kind.value} probe: {words} (reported by its Envoy)")

    # -- stream presence ---------------------------------------------------------------------

    def _expire_later(self) -> None:
        """Arrange for `HealthReports.expire` to run when the next stream gone passes the grace."""
        times = [self.reports.next_expiry(self.grace)]
        if self._registrar is not None:
            times.append(self._registrar.next_expiry())
        due = min((t for t in times if t is not None), default=None)
        if due is None or self._stopped:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        delay = max(0.0, due - time.time()) + 0.05
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the streams run on, for `expiry_changed` from other threads."""
        self._loop = loop

    def expiry_changed(self) -> None:
        """Something another thread changed (the other replicas' views) may be due sooner than
        the timer set: look again, on the loop. Safe on any thread."""
        loop = self._loop
        if loop is not None and not self._stopped and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._expire_later)

    def _expire(self) -> None:
        self._expiry = None
        self.reports.expire(self.grace)
        if self._registrar is not None and self._registrar.expire():
            self._registrar.apply_soon()
        self._expire_later()

    def state_of(self, node_id: str) -> str:
        """What `proxy-status` shows in its HDS column: no stream, a stream with nothing to check,
        or its workload's health as its reports made it."""
        for stream in self.streams.values():
            if stream.node_id == node_id:
                if stream.check is None or stream.key is None:
                    return "CONNECTED"
                return self.reports.get(stream.key).verdict()[0].value
        return "NOT CONNECTED"


def share_between_replicas(
    options: ShareOptions,
    reports: HealthReports,
    registrar: AutoRegistrar,
    hds: HealthDiscovery,
    checked: Callable[[], Mapping[WorkloadKey, WorkloadCheck]],
) -> ConsulShare:
    """Health and registrations kept in Consul KV for every replica (`meshctl.registry.health_share`):
    this server's own views of checked workloads are written as they change (`checked`: the
    workloads checked now; one that becomes checked is written then, by `HealthReports.republish`),
    the others' merged as they come."""

    def on_health(views: Views) -> None:
        reports.set_remote(views)
        hds.expiry_changed()

    share = ConsulShare(options, on_health, registrar.set_remote)

    def health_view(key: WorkloadKey, state: WorkloadHealth | None) -> None:
        if state is None or key in checked():
            share.put(HEALTH_PREFIX, key, None if state is None else state.to_json())

    def registration_view(key: WorkloadKey, value: dict[str, Any] | None) -> None:
        share.put(REGISTRATIONS_PREFIX, key, value)

    reports.on_local = health_view
    registrar.on_local = registration_view
    registrar.on_expiry_changed = hds.expiry_changed
    return share
