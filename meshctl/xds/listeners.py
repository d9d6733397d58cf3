"""LDS: every listener of one proxy, as Istio's pilot would generate it.

A sidecar gets outbound listeners for the services it may call (`listeners_outbound`), a DNS
listener for their names when its node asks for one (`dns_table`), and inbound
listeners for its own workload (`listeners_inbound`); a router gets one listener per port of the
Gateway servers selecting it (`listeners_gateway`). The shared Envoy pieces (HCM, tcp_proxy,
inspectors, filter chain merging) live in `listener_filters`, downstream TLS in `listener_tls`,
and VirtualService `tcp`/`tls` routes as tcp_proxy filters in `listener_l4`.

Listeners name route configs (`9080`, `http.8080`, `https.443.https.gw.ns`) and clusters
(`outbound|9080||reviews.bookinfo.mesh`, `inbound|9080||`, `BlackHoleCluster`,
`PassthroughCluster`, `InboundPassthroughCluster`) by Istio's names, which the route and cluster
generators produce for the same scope.

A port whose protocol is not declared (and not implied by its name) is sniffed on a sidecar's
outbound listeners (`listeners_outbound`), as in Istio; inbound and on gateways such a port is
TCP (Istio sniffs inbound too). Mongo, MySQL and Redis ports get a plain tcp_proxy, as Istio does
with their protocol filters turned off.
"""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2

from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.dns_table import build_dns_listener
from meshctl.xds.inbound_view import InboundView, inbound_view
from meshctl.xds.listener_memo import ListenerMemo
from meshctl.xds.listeners_gateway import build_gateway
from meshctl.xds.listeners_inbound import build_inbound
from meshctl.xds.listeners_outbound import build_outbound_with_answers


def build_listeners(scope: ProxyScope) -> list[listener_pb2.Listener]:
    """Every listener for the scope's proxy, sorted by name."""
    return sort_listeners([*build_outbound_listeners(scope), *build_inbound_listeners(inbound_view(scope))])


def build_outbound_listeners(scope: ProxyScope, memo: ListenerMemo | None = None) -> list[listener_pb2.Listener]:
    """A sidecar's outbound listeners, or a router's Gateway listeners; with `memo`, a sidecar's
    kept across snapshots where they read the same (`listener_memo`)."""
    if scope.proxy.type is ProxyType.ROUTER:
        return sort_listeners(build_gateway(scope))
    listeners, answers = build_outbound_with_answers(scope, memo)
    if scope.proxy.dns_port:
        listeners.append(build_dns_listener(scope, answers))
    return sort_listeners(listeners)


def build_inbound_listeners(view: InboundView) -> list[listener_pb2.Listener]:
    """A sidecar's listeners for its own workload."""
    if view.proxy.value.type is ProxyType.ROUTER:
        return []  # a gateway's listeners enforce its policies (`listeners_gateway.gateway_authz`)
    return sort_listeners(build_inbound(view))


def sort_listeners(listeners: list[listener_pb2.Listener]) -> list[listener_pb2.Listener]:
    return sorted(listeners, key=lambda listener: str(listener.name))
