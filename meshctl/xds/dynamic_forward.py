"""Envoy's dynamic forward proxy (DFP): where a name is resolved per request, not per push.

A ServiceEntry with `resolution: DYNAMIC_DNS` (a wildcard host, `*.example.com`) has no
endpoints to send: the proxy resolves the name each client asks for, the HTTP `Host` or the TLS
SNI, and connects there. Istio serves it on sidecars with three Envoy pieces that must name one
DNS cache with the very same settings (Envoy refuses a second config under one cache name):

- the cluster `outbound|PORT||*.example.com`, of type `envoy.clusters.dynamic_forward_proxy`
  with lb policy CLUSTER_PROVIDED (it picks the host the request named from its cache);
- on HTTP ports, the HTTP filter `envoy.filters.http.dynamic_forward_proxy`, which pauses a
  request until its `Host` is in the cache (a Host without a port is port 80, 443 when the
  cluster originates TLS);
- on TLS ports, the network filter `envoy.filters.network.sni_dynamic_forward_proxy` before
  tcp_proxy, which resolves the SNI, on the service port, before the connection goes upstream.

The cache is Istio's `HOST_dfp_dns_cache`, IPv4 lookups for an IPv4 proxy (IPv6 for an IPv6
one), bounded by MeshConfig `dnsCacheMaxHosts` (meshctl's own, 1024 by default, Envoy's
default): a request for a name beyond the bound gets Envoy's 503 "DNS cache overflow" rather
than growing the proxy's memory without end. Names are resolved by Envoy's default resolver
(the VM's /etc/resolv.conf, or the bootstrap's `typed_dns_resolver_config`), never by the
proxy's own DNS listener, whose answers point back at the proxy; that listener leaves DYNAMIC_DNS
names out (`listeners_outbound`), so a VM's resolver routed to it cannot loop a request back. An
app on a VM without iptables reaches such hosts with the sidecar as its HTTP proxy
(`http_proxy=http://127.0.0.1:PORT`), whose absolute URLs carry the host.

Outbound policy `ALLOW_ANY_DYNAMIC_DNS` (Istio 1.31) uses the same pieces for the catch-all:
plaintext HTTP for a host no service declares goes to `AllowAnyDynamicDNSCluster`, resolved by
its `Host` (over TLS the cluster originates with MeshConfig `outboundTrafficPolicy.tls`); other
traffic passes through as under ALLOW_ANY. On a VM without iptables this is
the only way such requests leave at all (there is no original destination to pass through to).

One HTTP connection manager may serve several caches (two DYNAMIC_DNS hosts on one port, and
the catch-all), and the HTTP filter resolves every request whose cluster is a DFP cluster into
its own cache whatever cache that cluster reads: so each cache's filter is in the chain disabled
(`dfp|CACHE` by name) and enabled by the virtual hosts whose routes go to its cluster. Where
Istio has a single `envoy.filters.http.dynamic_forward_proxy`, meshctl has one per cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.clusters.dynamic_forward_proxy.v3 import cluster_pb2 as dfp_cluster_pb2
from envoy.extensions.common.dynamic_forward_proxy.v3 import dns_cache_pb2
from envoy.extensions.filters.http.dynamic_forward_proxy.v3 import dynamic_forward_proxy_pb2 as dfp_http_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.sni_dynamic_forward_proxy.v3 import (
    sni_dynamic_forward_proxy_pb2 as dfp_sni_pb2,
)

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.registry.model import Protocol, Resolution, Service, ServicePort
from meshctl.snapshot.scope import ProxyScope
from meshctl.xds.cluster_policy import (
    ClusterDraft,
    Policy,
    apply_connection_pool,
    apply_outlier_detection,
    apply_upstream_protocol,
    default_thresholds,
    duration,
)
from meshctl.xds.cluster_tls import apply_tls, originates_tls
from meshctl.xds.listener_filters import network_filter, typed

CLUSTER_TYPE: Final = "envoy.clusters.dynamic_forward_proxy"
HTTP_FILTER: Final = "envoy.filters.http.dynamic_forward_proxy"
SNI_FILTER: Final = "envoy.filters.network.sni_dynamic_forward_proxy"
#: Istio's cluster for HTTP to unknown hosts under ALLOW_ANY_DYNAMIC_DNS.
ALLOW_ANY_DYNAMIC_DNS_CLUSTER: Final = "AllowAnyDynamicDNSCluster"
ALLOW_ANY_DYNAMIC_DNS: Final = "ALLOW_ANY_DYNAMIC_DNS"
#: Istio's suffix of a DNS cache's name (`model.BuildDNSCacheName`).
_CACHE_SUFFIX: Final = "_dfp_dns_cache"
#: Istio's idle timeout of its catch-all clusters' connections.
_CATCH_ALL_IDLE_SECONDS: Final = 300


def cache_name(host: str) -> str:
    """Istio's DNS cache name of a DYNAMIC_DNS host (`*.example.com_dfp_dns_cache`)."""
    return host + _CACHE_SUFFIX


def filter_name(cache: str) -> str:
    """The name of the HTTP filter that fills `cache`, which virtual hosts enable."""
    return f"dfp|{cache}"


def is_dynamic(service: Service) -> bool:
    return service.resolution is _DYNAMIC_DNS


#: Asked of every service a sidecar sees, on every generation (an enum member's attribute lookup
#: costs as much as the rest of the test on Python 3.11).
_DYNAMIC_DNS: Final = Resolution.DYNAMIC_DNS


def serves(port: ServicePort) -> bool:
    """The ports Istio gives a DFP cluster: HTTP ones (the Host names the destination) and TLS
    ones (the SNI does). HTTPS, TCP and the rest get nothing, as in Istio."""
    return port.protocol.is_http or port.protocol is Protocol.TLS


def dns_cache(name: str, *, max_hosts: int, family: str) -> dns_cache_pb2.DnsCacheConfig:
    """The one config of cache `name`, for every cluster and filter that names it."""
    config = dns_cache_pb2.DnsCacheConfig(
        name=name,
        dns_lookup_family=cluster_pb2.Cluster.V6_ONLY if family == "v6" else cluster_pb2.Cluster.V4_ONLY,
    )
    config.max_hosts.value = max_hosts
    return config


def cluster(name: str, cache: dns_cache_pb2.DnsCacheConfig, *, insecure: bool = False) -> cluster_pb2.Cluster:
    """A DFP cluster reading `cache`. `insecure` lets it originate TLS without checking the
    server's name (a DestinationRule's `insecureSkipVerify`), which Envoy otherwise refuses."""
    config = dfp_cluster_pb2.ClusterConfig(dns_cache_config=cache, allow_insecure_cluster_options=insecure)
    out = cluster_pb2.Cluster(name=name, lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED)
    out.cluster_type.name = CLUSTER_TYPE
    out.cluster_type.typed_config.CopyFrom(typed(config))
    return out


def port_cluster(
    name: str, cache: dns_cache_pb2.DnsCacheConfig, *, protocol: Protocol, policy: Policy, connect_timeout: float
) -> ClusterDraft:
    """A DYNAMIC_DNS service port's cluster with its DestinationRule's policy: connection pool,
    outlier detection and, on an HTTP port, SIMPLE or MUTUAL `tls`, with the SNI and the
    certificate's name checked against the host each request names (`insecureSkipVerify` drops
    the check). The caller adds Istio's metadata and finishes it."""
    tls = policy.tls if protocol.is_http and originates_tls(policy.tls) else None
    insecure = bool(tls is not None and tls.insecure_skip_verify.value)
    draft = ClusterDraft(cluster(name, cache, insecure=insecure))
    apply_upstream_protocol(draft, protocol, sniffed=True)
    apply_connection_pool(draft, policy.connection_pool, connect_timeout, policy.retry_budget)
    apply_outlier_detection(draft.cluster, policy.outlier_detection)
    apply_tls(draft, tls)
    _name_the_requested_host(draft, insecure)
    return draft


def allow_any_cluster(scope: ProxyScope, connect_timeout: float) -> cluster_pb2.Cluster:
    """Istio's AllowAnyDynamicDNSCluster: HTTP for hosts no service declares, in the client's
    HTTP version, resolved by the request's Host; with MeshConfig `outboundTrafficPolicy.tls`,
    over TLS it originates (a Host without a port then means 443)."""
    serialized = scope.snapshot.mesh.outbound_tls
    tls = dr_pb2.ClientTLSSettings.FromString(serialized) if serialized else None
    insecure = bool(tls is not None and tls.insecure_skip_verify.value)
    out = cluster(ALLOW_ANY_DYNAMIC_DNS_CLUSTER, allow_any_cache(scope), insecure=insecure)
    out.connect_timeout.CopyFrom(duration(connect_timeout))
    out.circuit_breakers.thresholds.append(default_thresholds())
    draft = ClusterDraft(out)
    draft.use_downstream_protocol()
    draft.http_options().common_http_protocol_options.idle_timeout.CopyFrom(duration(_CATCH_ALL_IDLE_SECONDS))
    apply_tls(draft, tls)
    _name_the_requested_host(draft, insecure)
    return draft.finish()


def _name_the_requested_host(draft: ClusterDraft, insecure: bool) -> None:
    """Envoy refuses a DFP cluster with HTTP protocol options unless they set auto_sni and
    auto_san_validation (TLS, when originated, names and checks the host each request names),
    or the cluster allows insecure options (`insecureSkipVerify`)."""
    if draft.options is None and draft.cluster.HasField("transport_socket"):
        draft.http_options()
    if draft.options is None:
        return
    upstream = draft.options.upstream_http_protocol_options
    upstream.auto_sni = True
    upstream.auto_san_validation = not insecure


def http_filter(cache: dns_cache_pb2.DnsCacheConfig) -> hcm_pb2.HttpFilter:
    """The HTTP filter filling `cache`, disabled unless a virtual host enables it (`enable`)."""
    config = dfp_http_pb2.FilterConfig(dns_cache_config=cache)
    return hcm_pb2.HttpFilter(name=filter_name(cache.name), typed_config=typed(config), disabled=True)


def enable(virtual_host: rc.VirtualHost, cache: str) -> None:
    """Turn on, for `virtual_host`, the HTTP filter that fills `cache` (Envoy wants a per-route
    config inside the enabling FilterConfig: the DFP's empty one)."""
    config = rc.FilterConfig(config=typed(dfp_http_pb2.PerRouteConfig()))
    virtual_host.typed_per_filter_config[filter_name(cache)].CopyFrom(typed(config))


def sni_filter(cache: dns_cache_pb2.DnsCacheConfig, port: int) -> listener_components_pb2.Filter:
    """The network filter resolving a TLS connection's SNI into `cache`, on `port`."""
    return network_filter(SNI_FILTER, dfp_sni_pb2.FilterConfig(dns_cache_config=cache, port_value=port))


def max_hosts(scope: ProxyScope) -> int:
    return scope.snapshot.mesh.dns_cache_max_hosts


def allow_any_dynamic_dns(scope: ProxyScope) -> bool:
    """Whether HTTP for unknown hosts goes through the DFP (sidecars only, as in Istio)."""
    return scope.outbound_traffic_policy == ALLOW_ANY_DYNAMIC_DNS


def host_cache(scope: ProxyScope, host: str) -> dns_cache_pb2.DnsCacheConfig:
    return dns_cache(cache_name(host), max_hosts=max_hosts(scope), family=scope.proxy.family)


def allow_any_cache(scope: ProxyScope) -> dns_cache_pb2.DnsCacheConfig:
    return dns_cache(cache_name(ALLOW_ANY_DYNAMIC_DNS_CLUSTER), max_hosts=max_hosts(scope), family=scope.proxy.family)


def http_filters(scope: ProxyScope, services: Iterable[Service] | None = None) -> list[hcm_pb2.HttpFilter]:
    """The DFP HTTP filters of a sidecar's outbound connection managers: one per DYNAMIC_DNS
    host with an HTTP port the proxy sees, and the catch-all's under ALLOW_ANY_DYNAMIC_DNS. All
    disabled; each virtual host enables the one its cluster reads."""
    hosts = sorted(
        {s.hostname for s in (scope.services if services is None else services) if is_dynamic(s) and _http(s)}
    )
    out = [http_filter(host_cache(scope, host)) for host in hosts]
    if allow_any_dynamic_dns(scope):
        out.append(http_filter(allow_any_cache(scope)))
    return out


def _http(service: Service) -> bool:
    return any(p.protocol.is_http for p in service.ports)
