"""HDS health-check specifications: what a workload's own Envoy is told to probe.

A pure function of a `WorkloadCheck` (`meshctl.registry.health_checks`): one HDS cluster per
workload, named `health|NAME.NAMESPACE`, with one endpoint per probed port at the probe's host
(loopback unless the probe names one), and Envoy's active health check set from Istio's probe
fields: `periodSeconds` is the interval, `timeoutSeconds` the timeout, `failureThreshold` and
`successThreshold` the unhealthy and healthy thresholds.

HDS clusters carry no traffic, and Envoy probes a cluster without traffic at its
`no_traffic_interval` (60 s by default) instead of its interval; both no-traffic intervals are set
to the period, or the probe would run six times slower than asked. Envoy reports at the
specifier's `interval`: half the shortest period (at least 0.5 s, at most 5 s), so a transition is
reported within half a period of Envoy seeing it; a proxy with nothing to check reports once a
minute.
"""

from __future__ import annotations

from typing import Final

from envoy.config.core.v3 import address_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.service.health.v3 import hds_pb2
from google.protobuf import duration_pb2

from meshctl.registry.health_checks import ProbeKind, WorkloadCheck

#: The transport socket match an HTTPS probe asks for (TLS without verifying the app's certificate,
#: as Kubernetes' HTTPS probes do).
_TLS_MATCH: Final = "meshctl-probe-tls"


def health_cluster_name(namespace: str, name: str) -> str:
    return f"health|{name}.{namespace}"


def report_interval(checks: list[WorkloadCheck]) -> float:
    """Seconds between Envoy's reports for these checks (see the module docstring)."""
    if not checks:
        return 60.0  # nothing to check: an empty report a minute keeps the stream alive, no more
    return min(5.0, max(0.5, min(c.probe.period for c in checks) / 2))


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def health_check(check: WorkloadCheck) -> health_check_pb2.HealthCheck:
    """Envoy's active health check for `check`'s probe."""
    probe = check.probe
    period = _duration(probe.period)
    hc = health_check_pb2.HealthCheck(
        timeout=_duration(probe.timeout),
        interval=period,
        no_traffic_interval=period,
        no_traffic_healthy_interval=period,
    )
    hc.unhealthy_threshold.value = probe.failure_threshold
    hc.healthy_threshold.value = probe.success_threshold
    if probe.kind is ProbeKind.HTTP:
        http = hc.http_health_check
        http.path = probe.path
        for name, value in probe.headers:
            if name.lower() == "host":
                http.host = value
                continue
            added = http.request_headers_to_add.add()
            added.header.key, added.header.value = name, value
        if probe.scheme.upper() == "HTTPS":
            hc.transport_socket_match_criteria.update({_TLS_MATCH: True})
    elif probe.kind is ProbeKind.GRPC:
        hc.grpc_health_check.service_name = probe.service
    else:
        hc.tcp_health_check.SetInParent()
    return hc


def cluster_health_check(check: WorkloadCheck) -> hds_pb2.ClusterHealthCheck:
    probe = check.probe
    cluster = hds_pb2.ClusterHealthCheck(
        cluster_name=health_cluster_name(check.namespace, check.name),
        health_checks=[health_check(check)],
    )
    locality = cluster.locality_endpoints.add()
    for port in probe.ports:
        endpoint = endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address=probe.host, port_value=port))
        )
        locality.endpoints.append(endpoint)
    if probe.kind is ProbeKind.HTTP and probe.scheme.upper() == "HTTPS":
        match = cluster.transport_socket_matches.add()
        match.name = _TLS_MATCH
        match.match.update({_TLS_MATCH: True})
        match.transport_socket.name = "envoy.transport_sockets.tls"
        match.transport_socket.typed_config.Pack(tls_pb2.UpstreamTlsContext())
    return cluster


def health_check_specifier(checks: list[WorkloadCheck]) -> hds_pb2.HealthCheckSpecifier:
    """What one Envoy is told to check: its workload's probe (none for a workload not checked)."""
    spec = hds_pb2.HealthCheckSpecifier(cluster_health_checks=[cluster_health_check(c) for c in checks])
    spec.interval.CopyFrom(_duration(report_interval(checks)))
    return spec


#: Envoy's words for a failing host, by the status it reports over HDS.
STATUS_WORDS: Final = {
    health_check_pb2.UNHEALTHY: "failing",
    health_check_pb2.TIMEOUT: "timing out",
    health_check_pb2.DRAINING: "draining",
    health_check_pb2.UNKNOWN: "not probed yet",
    health_check_pb2.DEGRADED: "degraded",
}
