"""Sidecar outbound listeners: where the app's calls to mesh services enter the proxy.

Istio's `buildSidecarOutboundListeners`, for the two ways traffic reaches a sidecar:

- INTERCEPTION_MODE NONE (the VM default, no iptables): every listener binds a real port on
  127.0.0.1 (`127.0.0.1_9080`), where the app connects. A Sidecar egress listener's `bind` moves
  it elsewhere.
- REDIRECT/TPROXY: iptables sends outbound connections to `virtualOutbound` (0.0.0.0:15001), which
  hands each one to the listener for its original destination: per-port listeners that do not
  bind (`bind_to_port: false`), on 0.0.0.0 for HTTP and on the service's address for TCP.

Per listener: HTTP ports get an HCM with RDS route config `PORT` (all HTTP services of the port
share it); TCP and TLS ports get tcp_proxy chains from VirtualService `tcp`/`tls` routes or to the
service's cluster. A port whose protocol is neither declared nor implied by its name is sniffed
(Istio's `ListenerProtocolAuto`): it is bound like a TCP port and gets both, the TCP chains plus an
HCM chain matching what the HTTP inspector reports for plaintext HTTP/1.1 and h2c, so
VirtualService `http` rules apply to HTTP clients and everything else still reaches the TCP
chains. Istio names a sniffed port's route config `HOST:PORT` on a non-wildcard bind (one virtual
host, domains `*`); meshctl keeps `PORT`, shared with the port's HTTP services, so HTTP whose
`Host` names no service (`127.0.0.1:7000`) meets the catch-all virtual host. The listener filter
timeout stays at Istio's default `protocolDetectionTimeout` of 0s (none): a server-first protocol
on a sniffed port waits for the client forever, so declare such ports (`protocol: TCP`).

Services meeting on one listener are merged as in Istio: a later chain whose
match equals an earlier one's is dropped. Without iptables, a host with a TCP-level port (TCP,
TLS, Mongo, MySQL, Redis, sniffed) listens on its own loopback address, allocated per snapshot
(`SnapshotIndex.loopback`, `snapshot/loopback.py`): `127.240.3.7_5432`, so two databases on 5432
are both reachable by name (its DNS answer is that address, `dns_table`). Its HTTP ports listen
there too, besides the shared `127.0.0.1_PORT`. Where a range is full and TCP services still meet
on a loopback listener, nothing tells them apart (Istio needs a VIP for that), so the first
service in hostname order wins; TLS services sharing a port are told apart by SNI (meshctl's
addition: Istio matches SNI only on wildcard listeners).

Rules that keep a NONE-mode proxy working:

- No outbound listener binds a port the app itself listens on (its inbound endpoint ports and
  Sidecar ingress `defaultEndpoint` ports), since the app is already on 127.0.0.1 there. Reach
  such a service through a Sidecar egress listener with another `port` or `bind`.
- Envoy's and Istio's own ports (15000, 15001, 15006, 15090, ...) are never bound.
- When a listener has no catch-all chain, unmatched connections go to BlackHoleCluster even with
  ALLOW_ANY: PassthroughCluster connects to the original destination, which for a bound listener
  is the listener itself, so it would loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import wrappers_pb2

from meshctl.api.networking.v1alpha3 import sidecar_pb2
from meshctl.config.hosts import is_ip
from meshctl.config.model import Config
from meshctl.registry.model import Endpoint, Protocol, Resolution, Service, ServicePort
from meshctl.snapshot.interception import InterceptionMode
from meshctl.snapshot.model import spec
from meshctl.snapshot.scope import MESH_GATEWAY, ProxyScope, parse_egress_hosts
from meshctl.xds import dynamic_forward as dfp
from meshctl.xds import listener_filters as lf
from meshctl.xds.listener_l4 import configs_for_host, route_filters, single_destination_filters, static_match
from meshctl.xds.listener_memo import Answers, Built, ListenerMemo, Walk
from meshctl.xds.listeners_inbound import port_protocol
from meshctl.xds.names import (
    BLACKHOLE_CLUSTER,
    LOCALHOST,
    PASSTHROUGH_CLUSTER,
    VIRTUAL_OUTBOUND,
    VIRTUAL_OUTBOUND_PORT,
    WILDCARD,
    listener_name,
    outbound_cluster,
)

logger = logging.getLogger("meshctl.xds.listeners")

#: Ports Envoy or an Istio agent already listen on (admin, capture, agent, health, stats, DNS).
RESERVED_PORTS: Final = frozenset({15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090})
_MESH = frozenset({MESH_GATEWAY})
#: Protocols whose filters cannot share a port with another protocol (Istio's well-known ports).
_EXCLUSIVE: Final = frozenset({Protocol.MONGO, Protocol.MYSQL})


@dataclass(frozen=True, slots=True)
class _Egress:
    """A Sidecar egress listener (or the implicit catch-all): what it imports and where it binds."""

    port: ServicePort | None
    bind: str
    bind_to_port: bool
    services: tuple[Service, ...]
    virtual_services: tuple[Config, ...]


@dataclass(slots=True)
class _Entry:
    bind: str
    port: int
    bind_to_port: bool
    protocol: Protocol
    chains: list[lf.ChainOpts] = field(default_factory=list)
    locked: bool = False

    @property
    def has_http(self) -> bool:
        return any(c.kind == "http" for c in self.chains)


def _kind(protocol: Protocol) -> str:
    if protocol.is_http:
        return "http"
    if protocol.is_sniffed:
        return "auto"
    if protocol in (Protocol.TLS, Protocol.HTTPS):
        return "tls"
    return "tcp"


class _OutboundBuilder:
    def __init__(self, scope: ProxyScope) -> None:
        self.scope = scope
        self.proxy = scope.proxy
        self.none_mode = scope.proxy.interception is InterceptionMode.NONE
        self.app_ports = scope.proxy.app_ports
        self.entries: dict[tuple[str, int], _Entry] = {}
        #: host -> its own loopback address (this snapshot's allocation)
        self.loopback = scope.snapshot.index.loopback
        #: host -> the addresses where this proxy takes the app's connections for it: its DNS
        #: answers (`dns_table`), so the table is scoped exactly as the listeners are
        self.answers: dict[str, list[str]] = {}
        #: host -> the endpoints `_binds` read of it: a `ListenerMemo` trace
        self.endpoints_read: dict[str, tuple[Endpoint, ...]] = {}
        #: (bind, port) -> how many service ports it took (each noted in `answers`), and the
        #: listeners that took any but HTTP ones: what a `ListenerMemo` patch needs
        self.taken: Counter[tuple[str, int]] = Counter()
        self.not_http: set[tuple[str, int]] = set()
        self.egresses: list[_Egress] = []

    @cached_property
    def dfp_filters(self) -> list[hcm_pb2.HttpFilter]:
        """The dynamic forward proxy's HTTP filters every outbound HCM carries (disabled until
        a virtual host enables one); found when the first HCM is made (a walk over the scope's
        services, which a patch for a few of them does not need)."""
        return dfp.http_filters(self.scope)

    # -- egress listeners --------------------------------------------------------------------

    def egress_listeners(self) -> list[_Egress]:
        """The Sidecar's egress listeners in order, or one catch-all importing the whole scope."""
        sidecar = self.scope.sidecar
        all_vs = self.scope.virtual_services()
        if sidecar is None or not spec(sidecar).egress:
            return [_Egress(None, "", self.none_mode, self.scope.services, all_vs)]
        out = []
        for listener in spec(sidecar).egress:
            if listener.bind.startswith("unix://"):
                logger.warning(
                    "%s: Sidecar %s/%s egress bind %s: unix sockets are not supported; skipped",
                    self.proxy.describe(),
                    sidecar.namespace,
                    sidecar.name,
                    listener.bind,
                )
                continue
            hosts = parse_egress_hosts(listener.hosts, self.proxy.namespace)
            services = tuple(s for s in self.scope.services if any(h.covers(s.namespace, s.hostname) for h in hosts))
            vss = tuple(
                vs
                for vs in all_vs
                if any(h.covers(vs.namespace, rh) for rh in self.scope.resolved_hosts(vs) for h in hosts)
            )
            port = None
            if listener.HasField("port") and listener.port.number:
                port = ServicePort(listener.port.name, listener.port.number, port_protocol(listener.port))
            bind_to_port = self.none_mode or listener.capture_mode == sidecar_pb2.NONE
            out.append(_Egress(port, listener.bind, bind_to_port, services, vss))
        return out

    def build(self) -> list[listener_pb2.Listener]:
        self.egresses = self.egress_listeners()
        for egress in self.egresses:
            self._walk(egress)
        return [self._listener(entry) for entry in self.entries.values()]

    def _walk(self, egress: _Egress) -> None:
        """Add every service port `egress` imports to the listeners where it listens."""
        if egress.port is not None:
            pairs = [(svc, egress.port) for svc in egress.services]
        else:
            # A catch-all never adds to what a port-specific egress listener defined.
            for entry in self.entries.values():
                entry.locked = True
            pairs = [(svc, port) for svc in egress.services for port in svc.ports]
        binds = [(svc, port, self._binds(svc, port, egress)) for svc, port in pairs]
        shared = Counter(key for _, _, found in binds for key, _ in found)
        for svc, port, found in binds:
            for (bind, number), cidr in found:
                self._add(svc, port, egress, bind=bind, cidr=cidr, shared=shared[(bind, number)] > 1)

    def _binds(self, svc: Service, port: ServicePort, egress: _Egress) -> list[tuple[tuple[str, int], str]]:
        """Where a service port listens: ((bind, port), destination CIDR to match or "")."""
        if port.protocol is Protocol.UDP:
            return []
        if egress.bind:
            return [((egress.bind, port.number), "")]
        if egress.bind_to_port:
            own = self.loopback.get(svc.hostname)
            if own is None:
                return [((LOCALHOST, port.number), "")]
            if port.protocol.is_http:
                return [((LOCALHOST, port.number), ""), ((own, port.number), "")]
            return [((own, port.number), "")]
        if port.protocol.is_http:
            return [((WILDCARD, port.number), "")]
        address = svc.addresses[0] if svc.addresses else WILDCARD
        if "/" in address:
            return [((WILDCARD, port.number), address)]
        if address == WILDCARD and svc.resolution is Resolution.NONE:
            # Istio's listeners per endpoint for TCP services without a VIP: with no address to
            # bind, the endpoint addresses are the only way to tell such services apart.
            endpoints = self.endpoints_read[svc.hostname] = self.scope.snapshot.services.endpoints_of(svc.hostname)
            eps = [e for e in endpoints if port.number in e.ports]
            addrs = sorted({e.address for e in eps if is_ip(e.address) and e.address != self.proxy.ip})
            if eps:
                return [((a, port.number), "") for a in addrs]
        return [((address, port.number), "")]

    # -- adding a service port to a listener -------------------------------------------------

    def _add(self, svc: Service, port: ServicePort, egress: _Egress, *, bind: str, cidr: str, shared: bool) -> None:
        key = (bind, port.number)
        name = listener_name(bind, port.number)
        if egress.bind_to_port and not self._may_bind(svc, bind, port.number, name):
            return
        if not egress.bind_to_port and bind == WILDCARD and port.number in RESERVED_PORTS:
            # 0.0.0.0:15001 is virtualOutbound itself (15006 virtualInbound): Envoy refuses two
            # listeners on one address, as Istio's conflictWithReservedListener avoids.
            logger.warning(
                "%s: %s port %d is a proxy port; no outbound listener %s",
                self.proxy.describe(),
                svc.hostname,
                port.number,
                name,
            )
            return
        entry = self.entries.get(key)
        if entry is not None and entry.locked:
            return
        if dfp.is_dynamic(svc) and not dfp.serves(port):
            return  # as in Istio: a DYNAMIC_DNS port that is neither HTTP nor TLS gets nothing
        self._answer(svc, bind, egress)
        self.taken[key] += 1
        kind = _kind(port.protocol)
        if kind != "http":
            self.not_http.add(key)
        if kind == "http":
            if entry is not None and entry.has_http:
                return  # the port's RDS route config already serves every HTTP service on it
            chains = [self._http_chain(bind, port.number)]
        elif kind == "tls":
            chains = self._tls_chains(svc, port, egress, bind=bind, cidr=cidr, by_sni=shared and egress.bind_to_port)
        else:
            chains = self._tcp_chains(svc, port, cidr, egress)
            if kind == "auto" and (entry is None or not entry.has_http):
                # Istio's sniffing: TCP chains first, then HTTP for what the inspector recognises.
                chains.append(self._http_chain(bind, port.number, sniffed=True))
        if entry is None:
            self.entries[key] = _Entry(bind, port.number, egress.bind_to_port, port.protocol, chains)
            return
        if (port.protocol in _EXCLUSIVE or entry.protocol in _EXCLUSIVE) and port.protocol is not entry.protocol:
            logger.warning(
                "%s: %s port %d (%s) conflicts with %s on listener %s; skipped",
                self.proxy.describe(),
                svc.hostname,
                port.number,
                port.protocol,
                entry.protocol,
                name,
            )
            return
        for chain in lf.merge_chains(entry.chains, chains):
            logger.info(
                "%s: listener %s already routes this traffic; %s port %d is not reachable there",
                self.proxy.describe(),
                name,
                chain.origin or svc.hostname,
                port.number,
            )

    def _answer(self, svc: Service, bind: str, egress: _Egress) -> None:
        """Note where the app reaches `svc`: the bound address without iptables (its own
        loopback address over 127.0.0.1), else the service's address, which iptables sends here
        (one of the proxy's family first: A for an IPv4 proxy, AAAA for an IPv6 one). Never for a
        DYNAMIC_DNS host: the proxy resolves those names itself, through the VM's resolvers,
        which may ask this very table; answered with the proxy's address, a request would come
        back to the proxy forever."""
        if dfp.is_dynamic(svc):
            return
        found = self.answers.setdefault(svc.hostname, [])
        if egress.bind_to_port:
            address = bind
        else:
            ips = [a for a in svc.addresses if is_ip(a)]
            address = next((a for a in ips if (":" in a) == (self.proxy.family == "v6")), ips[0] if ips else "")
        if address and address != WILDCARD and address not in found:
            found.append(address)

    def _may_bind(self, svc: Service, bind: str, port: int, name: str) -> bool:
        if port in RESERVED_PORTS:
            logger.warning(
                "%s: %s port %d is a proxy port; no outbound listener %s",
                self.proxy.describe(),
                svc.hostname,
                port,
                name,
            )
            return False
        if port in self.app_ports and (bind in (LOCALHOST, WILDCARD) or bind == self.loopback.get(svc.hostname)):
            logger.info(
                "%s: no outbound listener %s for %s: the workload's app listens on port %d; "
                "use a Sidecar egress listener with another port or bind to reach it",
                self.proxy.describe(),
                name,
                svc.hostname,
                port,
            )
            return False
        return True

    def _http_chain(self, bind: str, port: int, *, sniffed: bool = False) -> lf.ChainOpts:
        name = listener_name(bind, port)
        hcm = lf.http_connection_manager(
            stat_prefix=f"outbound_{name}", rds=str(port), routing_filters=self.dfp_filters
        )
        # On a wildcard listener HTTP shares the port with everything else iptables sends there,
        # and on a sniffed port with the port's TCP chains: only what the HTTP inspector
        # recognises goes to the HCM.
        inspected = sniffed or bind == WILDCARD
        return lf.ChainOpts(
            filters=[lf.hcm_filter(hcm)],
            application_protocols=lf.PLAINTEXT_HTTP_ALPNS if inspected else (),
            transport_protocol=lf.RAW_BUFFER if inspected else "",
            kind="http",
            origin=f"{'sniffed' if sniffed else 'HTTP'} port {port}",
        )

    def _default_cluster(self, svc: Service, port: ServicePort) -> str:
        """A Sidecar egress port that is not the service's: the service's only port, else the
        listener port (Istio: traffic then most likely finds no cluster)."""
        number = svc.ports[0].number if len(svc.ports) == 1 else port.number
        return outbound_cluster(number, svc.hostname)

    def _tls_chains(
        self, svc: Service, port: ServicePort, egress: _Egress, *, bind: str, cidr: str, by_sni: bool
    ) -> list[lf.ChainOpts]:
        """Istio's `buildSidecarOutboundTLSFilterChainOpts`."""
        out: list[lf.ChainOpts] = []
        seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        for vs in configs_for_host(self.scope, svc.hostname, egress.virtual_services):
            for tls in spec(vs).tls:
                for m in tls.match:
                    if not tls.route or not static_match(
                        m, scope=self.scope, gateways=set(_MESH), port=port.number, vs_namespace=vs.namespace
                    ):
                        continue
                    runtime = (tuple(m.sni_hosts), tuple(m.destination_subnets))
                    if runtime in seen:
                        continue  # an earlier match with the same runtime predicates wins
                    seen.add(runtime)
                    out.append(
                        lf.ChainOpts(
                            filters=route_filters(self.scope, tls.route, port.number, vs),
                            sni_hosts=tuple(m.sni_hosts),
                            cidrs=tuple(m.destination_subnets) or ((cidr,) if cidr else ()),
                            origin=f"VirtualService {vs.namespace}/{vs.name}",
                        )
                    )
        if out:
            return out
        address = svc.addresses[0] if svc.addresses else WILDCARD
        sni = bool(cidr) or (address == WILDCARD and bind == WILDCARD) or by_sni
        cluster = self._default_cluster(svc, port)
        if dfp.is_dynamic(svc):
            # Istio's SNI dynamic forward proxy: the SNI, under the wildcard, is resolved on the
            # service port before tcp_proxy sends the connection to the DFP cluster.
            cache = dfp.host_cache(self.scope, svc.hostname)
            filters = single_destination_filters(self.scope, cluster, svc.hostname)
            return [
                lf.ChainOpts(
                    filters=[dfp.sni_filter(cache, port.number), *filters],
                    sni_hosts=(svc.hostname,),
                    cidrs=(cidr,) if cidr else (),
                    origin=svc.hostname,
                )
            ]
        return [
            lf.ChainOpts(
                filters=single_destination_filters(self.scope, cluster, svc.hostname),
                sni_hosts=(svc.hostname,) if sni else (),
                cidrs=(cidr,) if cidr else (),
                origin=svc.hostname,
            )
        ]

    def _tcp_chains(self, svc: Service, port: ServicePort, cidr: str, egress: _Egress) -> list[lf.ChainOpts]:
        """Istio's `buildSidecarOutboundTCPFilterChainOpts`: the first match without destination
        subnets ends the list; subnet matches become chains of their own."""
        out: list[lf.ChainOpts] = []
        cidrs = (cidr,) if cidr else ()
        for vs in configs_for_host(self.scope, svc.hostname, egress.virtual_services):
            origin = f"VirtualService {vs.namespace}/{vs.name}"
            for tcp in spec(vs).tcp:
                if not tcp.route:
                    continue
                if not tcp.match:
                    out.append(
                        lf.ChainOpts(route_filters(self.scope, tcp.route, port.number, vs), cidrs=cidrs, origin=origin)
                    )
                    return out
                subnets: list[str] = []
                for m in tcp.match:
                    if not static_match(
                        m, scope=self.scope, gateways=set(_MESH), port=port.number, vs_namespace=vs.namespace
                    ):
                        continue
                    if not m.destination_subnets:
                        out.append(
                            lf.ChainOpts(
                                route_filters(self.scope, tcp.route, port.number, vs), cidrs=cidrs, origin=origin
                            )
                        )
                        return out
                    subnets.extend(m.destination_subnets)
                if subnets:
                    out.append(
                        lf.ChainOpts(
                            route_filters(self.scope, tcp.route, port.number, vs), cidrs=tuple(subnets), origin=origin
                        )
                    )
                    if sorted(subnets) == sorted(cidrs):
                        return out  # same match as the service's own chain would have
        cluster = self._default_cluster(svc, port)
        out.append(
            lf.ChainOpts(
                single_destination_filters(self.scope, cluster, svc.hostname), cidrs=cidrs, origin=svc.hostname
            )
        )
        return out

    # -- listeners ---------------------------------------------------------------------------

    def _listener(self, entry: _Entry) -> listener_pb2.Listener:
        listener = listener_pb2.Listener(
            name=listener_name(entry.bind, entry.port),
            address=lf.socket_address(entry.bind, entry.port),
            traffic_direction=base_pb2.TrafficDirection.OUTBOUND,
            # Istio's buildListenerFromEntry: with the HTTP inspector the timeout is MeshConfig's
            # protocolDetectionTimeout, whose default is 0s as well (none; older Istio had 100ms).
            continue_on_listener_filters_timeout=True,
            listener_filters_timeout=lf.zero_duration(),
        )
        if not entry.bind_to_port:
            listener.bind_to_port.value = False
        listener.listener_filters.extend(lf.inspectors(entry.chains, tls_with_http=True))
        fallback = BLACKHOLE_CLUSTER if entry.bind_to_port else catch_all_cluster(self.scope)
        lf.assemble_chains(listener, entry.chains, lf.cluster_filters(fallback))
        return listener


def catch_all_cluster(scope: ProxyScope) -> str:
    """Where traffic to unknown destinations goes: PassthroughCluster with ALLOW_ANY,
    BlackHoleCluster with REGISTRY_ONLY."""
    return BLACKHOLE_CLUSTER if scope.outbound_traffic_policy == "REGISTRY_ONLY" else PASSTHROUGH_CLUSTER


def build_virtual_outbound(scope: ProxyScope) -> listener_pb2.Listener:
    """Istio's `virtualOutbound`: where iptables sends outbound connections. It hands each to the
    listener of its original destination; what none takes goes to the catch-all cluster, except
    connections aimed at 15001 itself, which would loop."""
    listener = listener_pb2.Listener(
        name=VIRTUAL_OUTBOUND,
        address=lf.socket_address(WILDCARD, VIRTUAL_OUTBOUND_PORT),
        use_original_dst=wrappers_pb2.BoolValue(value=True),
        traffic_direction=base_pb2.TrafficDirection.OUTBOUND,
    )
    if scope.proxy.interception is InterceptionMode.TPROXY:
        listener.transparent.value = True
    blackhole = listener_components_pb2.FilterChain(
        name=f"{VIRTUAL_OUTBOUND}-blackhole",
        filters=lf.cluster_filters(BLACKHOLE_CLUSTER),
    )
    blackhole.filter_chain_match.destination_port.value = VIRTUAL_OUTBOUND_PORT
    catch_all = listener_components_pb2.FilterChain(
        name=f"{VIRTUAL_OUTBOUND}-catchall-tcp",
        filters=lf.cluster_filters(catch_all_cluster(scope)),
    )
    listener.filter_chains.extend([blackhole, catch_all])
    return listener


def build_outbound(scope: ProxyScope) -> list[listener_pb2.Listener]:
    """Outbound listeners, plus `virtualOutbound` when traffic is redirected to the proxy."""
    return build_outbound_with_answers(scope)[0]


def build_outbound_with_answers(
    scope: ProxyScope, memo: ListenerMemo | None = None
) -> tuple[list[listener_pb2.Listener], Answers]:
    """`build_outbound`, and for each host the listeners serve the addresses where the app
    reaches it (the DNS answers, `dns_table`); with `memo`, the build of the scope's key before
    is reused, or patched for the services that changed, where it read the same
    (`listener_memo`)."""
    if memo is not None:
        return memo.outbound(scope, _build, _patch)
    listeners, answers, _, _ = _build(scope)
    return listeners, answers


def _build(scope: ProxyScope) -> Built:
    builder = _OutboundBuilder(scope)
    out = builder.build()
    if scope.proxy.interception is not InterceptionMode.NONE:
        out.append(build_virtual_outbound(scope))
    answers = {host: found for host, found in builder.answers.items() if found}
    egresses = builder.egresses
    # The one catch-all, bound as the proxy binds (a patch walks services through such a one).
    whole = len(egresses) == 1 and egresses[0] == _Egress(
        None, "", builder.none_mode, egresses[0].services, egresses[0].virtual_services
    )
    walk = Walk(MappingProxyType(dict(builder.taken)), frozenset(builder.taken.keys() - builder.not_http), whole)
    return out, answers, builder.endpoints_read, walk


def _patch(
    scope: ProxyScope, walk: Walk, before: Sequence[Service], now: Sequence[Service]
) -> tuple[Answers, Walk] | None:
    """A build's walk brought up to date for services that changed (`before` as they were,
    `now` as they are), where the listeners stay as they were: every one of those services
    plain HTTP, without a loopback address of its own or a dynamic forward proxy, imported by
    the one catch-all egress listener, and only adding to or taking from listeners that serve
    HTTP alone and still take some other service port (such a listener's one HTTP chain is
    the same whichever services share it). Returns the changed services' DNS answers and the
    walk after; None where the listeners may change (a whole build decides)."""
    if not walk.whole_scope or not all(_plain_http(s) for s in (*before, *now)):
        return None
    gone, came = _OutboundBuilder(scope), _OutboundBuilder(scope)
    egress = _Egress(None, "", gone.none_mode, tuple(before), ())
    gone._walk(egress)
    came._walk(replace(egress, services=tuple(now)))
    taken = Counter(walk.taken)
    taken.subtract(gone.taken)
    taken.update(came.taken)
    for key in gone.taken.keys() | came.taken.keys():
        if key not in walk.http_only or taken[key] <= 0:
            return None
    answers = {host: found for host, found in came.answers.items() if found}
    return answers, replace(walk, taken=MappingProxyType({k: n for k, n in taken.items() if n > 0}))


def _plain_http(svc: Service) -> bool:
    return not dfp.is_dynamic(svc) and all(port.protocol.is_http for port in svc.ports)


def outbound_answers(scope: ProxyScope) -> Answers:
    """host -> where the app reaches it through this proxy (see `build_outbound_with_answers`)."""
    return build_outbound_with_answers(scope)[1]
