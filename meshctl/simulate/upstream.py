"""The clusters a route sends to: how Envoy connects to them (TLS mode) and to which endpoints.

Endpoints come from the proxy's ClusterLoadAssignment for an EDS cluster, and from the cluster's
inline `load_assignment` for STATIC and DNS clusters. The TLS mode is read off the cluster:
`transport_socket_matches` is Istio's auto mTLS (mutual TLS to endpoints labelled
`tlsMode: istio`, plaintext to the rest), an UpstreamTlsContext with the mesh's SDS certificate
is ISTIO_MUTUAL, any other is TLS originated by the proxy, and none is plaintext. A dynamic
forward proxy cluster (`DYNAMIC_FORWARD_PROXY`) has no endpoints to list: it connects to the
host each request names (HTTP Host, TLS SNI), resolved when the request comes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import json_format

from meshctl.simulate.result import Endpoint, Source, Upstream

_SOCKET_MATCH = "envoy.transport_socket_match"
_MESH_SECRET = "default"
_HEALTHY = ("UNKNOWN", "HEALTHY", "DEGRADED")
#: Envoy's dynamic forward proxy cluster type, and the type simulate reports for it.
_DFP_CLUSTER = "envoy.clusters.dynamic_forward_proxy"
DYNAMIC_FORWARD_PROXY = "DYNAMIC_FORWARD_PROXY"

#: (kind, namespace, name) of an Istio resource -> where it was read (file, line), if known.
SourceLookup = Callable[[str, str, str], "tuple[str, int] | None"]


def source_of(metadata: Any, lookup: SourceLookup | None) -> Source | None:
    """The Istio resource named by `filter_metadata.istio.config`
    (`/apis/networking.istio.io/v1/namespaces/NS/virtual-service/NAME`), with its file:line."""
    if "istio" not in metadata.filter_metadata:
        return None
    fields = metadata.filter_metadata["istio"].fields
    if "config" not in fields:
        return None
    parts = fields["config"].string_value.split("/")
    if len(parts) != 8 or parts[1] != "apis" or parts[4] != "namespaces":
        return None
    kind = "".join(word.capitalize() for word in parts[6].split("-"))
    namespace, name = parts[5], parts[7]
    where = lookup(kind, namespace, name) if lookup is not None else None
    return Source(kind, namespace, name, *(where or (None, None)))


def upstream(
    name: str,
    weight: int,
    clusters: Mapping[str, Any],
    assignments: Mapping[str, Any],
    lookup: SourceLookup | None = None,
) -> Upstream:
    """The cluster `name` as this proxy has it, or one marked not found (Envoy: 503 NC)."""
    cluster = clusters.get(name)
    if cluster is None:
        return Upstream(name, weight, found=False)
    kind = cluster_pb2.Cluster.DiscoveryType.Name(cluster.type) if cluster.HasField("type") else "CLUSTER_PROVIDED"
    if cluster.HasField("cluster_type") and cluster.cluster_type.name == _DFP_CLUSTER:
        kind = DYNAMIC_FORWARD_PROXY
    if kind == "EDS":
        service = cluster.eds_cluster_config.service_name or name
        assignment = assignments.get(service)
    else:
        assignment = cluster.load_assignment if cluster.HasField("load_assignment") else None
    endpoints = tuple(_endpoints(cluster, assignment)) if assignment is not None else ()
    return Upstream(name, weight, True, kind, cluster_tls(cluster), endpoints, source_of(cluster.metadata, lookup))


def _endpoints(cluster: Any, assignment: Any) -> list[Endpoint]:
    out = []
    for group in assignment.endpoints:
        locality = "/".join(p for p in (group.locality.region, group.locality.zone, group.locality.sub_zone) if p)
        for lb in group.lb_endpoints:
            status = health_check_pb2.HealthStatus.Name(lb.health_status)
            weight = lb.load_balancing_weight.value if lb.HasField("load_balancing_weight") else 1
            out.append(
                Endpoint(
                    address=_address(lb.endpoint.address),
                    locality=locality,
                    priority=group.priority,
                    weight=weight,
                    health="HEALTHY" if status == "UNKNOWN" else status,
                    tls=_endpoint_tls(cluster, lb),
                )
            )
    return out


def healthy(endpoints: tuple[Endpoint, ...]) -> list[Endpoint]:
    return [e for e in endpoints if e.health in _HEALTHY]


def _address(address: Any) -> str:
    if address.HasField("pipe"):
        return str(address.pipe.path)
    socket = address.socket_address
    host = f"[{socket.address}]" if ":" in socket.address else socket.address
    return f"{host}:{socket.port_value}"


def cluster_tls(cluster: Any) -> str:
    """The cluster's TLS mode in Istio's words."""
    if cluster.transport_socket_matches:
        return "auto mTLS (ISTIO_MUTUAL to endpoints with tlsMode: istio, else plaintext)"
    return _socket_tls(cluster.transport_socket) if cluster.HasField("transport_socket") else "plaintext"


def _socket_tls(socket: Any) -> str:
    if not socket.typed_config.type_url.endswith("/" + tls_pb2.UpstreamTlsContext.DESCRIPTOR.full_name):
        return "plaintext"
    context = tls_pb2.UpstreamTlsContext()
    socket.typed_config.Unpack(context)
    secrets = [s.name for s in context.common_tls_context.tls_certificate_sds_secret_configs]
    if _MESH_SECRET in secrets:
        return f"ISTIO_MUTUAL (SDS, SNI {context.sni})" if context.sni else "ISTIO_MUTUAL (SDS)"
    return f"TLS originated (SNI {context.sni})" if context.sni else "TLS originated"


def _endpoint_tls(cluster: Any, lb: Any) -> str:
    """For auto mTLS, the first transport socket match whose criteria the endpoint's
    `envoy.transport_socket_match` metadata holds; otherwise the cluster's mode."""
    if not cluster.transport_socket_matches:
        return cluster_tls(cluster)
    metadata: dict[str, Any] = {}
    if _SOCKET_MATCH in lb.metadata.filter_metadata:
        metadata = json_format.MessageToDict(lb.metadata.filter_metadata[_SOCKET_MATCH])
    for match in cluster.transport_socket_matches:
        wanted = json_format.MessageToDict(match.match)
        if all(metadata.get(k) == v for k, v in wanted.items()):
            return _socket_tls(match.transport_socket)
    return "plaintext"
