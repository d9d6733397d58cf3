"""DestinationRule rules: the host, subsets, and the traffic policy at every level.

A traffic policy appears at the top, in each subset, and per port; each level is checked with the
same rules. Connection pool rules are shared with the Sidecar's inbound connection pools.
"""

from __future__ import annotations

import math
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    Report,
    check_export_to,
    check_labels,
    check_selector,
    crd_duration_problem,
    duration_problem,
    enum_name,
    fqdn_problem,
    ip_problem,
    is_dns_label,
    percent_problem,
    port_problem,
    wildcard_domain_problem,
)
from meshctl.config.validation.envoy_limits import ring_size_problem, seconds32_problem

_MAGLEV_TABLE_LIMIT: Final = 5_000_011
_TOPOLOGY_LABELS: Final = frozenset(
    ("topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone")
)
_CERTIFICATE_FIELDS: Final = (
    ("client_certificate", "clientCertificate"),
    ("private_key", "privateKey"),
    ("ca_certificates", "caCertificates"),
    ("credential_name", "credentialName"),
)


def validate(spec: Message) -> list[Issue]:
    rule: Any = spec
    report = Report()
    if not rule.host:
        report.error(("spec", "host"), "host is required")
    else:
        report.error(("spec", "host"), wildcard_domain_problem(rule.host))
    if rule.HasField("traffic_policy"):
        check_traffic_policy(report, ("spec", "trafficPolicy"), rule.traffic_policy)
    seen: set[str] = set()
    for i, subset in enumerate(rule.subsets):
        path: FieldPath = ("spec", "subsets", i)
        if not subset.name:
            report.error(path, "subset name is required")
        elif not is_dns_label(subset.name):
            report.error((*path, "name"), f'invalid subset name "{subset.name}": must be a DNS label')
        elif subset.name in seen:
            report.error((*path, "name"), f'duplicate subset name "{subset.name}"')
        seen.add(subset.name)
        check_labels(report, (*path, "labels"), subset.labels)
        if subset.HasField("traffic_policy"):
            check_traffic_policy(report, (*path, "trafficPolicy"), subset.traffic_policy)
    check_export_to(report, ("spec", "exportTo"), rule.export_to, service_entry=False)
    if rule.HasField("workload_selector"):
        selector = rule.workload_selector
        check_selector(report, ("spec", "workloadSelector", "matchLabels"), selector.match_labels, "the rule")
        # Its export beyond its own namespace is checked where the namespace is known (own_namespace.py).
    return report.issues


def check_traffic_policy(report: Report, path: FieldPath, policy: Any) -> None:
    """A policy that sets nothing is refused, as Istio does: it is usually a block indented under
    the wrong key, and would otherwise silently change nothing."""
    if not policy.ListFields():
        report.error(path, "trafficPolicy must set at least one field")
        return
    if policy.HasField("tunnel") and policy.HasField("proxy_protocol"):
        report.error(path, '"tunnel" and "proxyProtocol" cannot be set together')
    _policy_fields(report, path, policy)
    if policy.HasField("retry_budget"):
        _retry_budget(report, (*path, "retryBudget"), policy.retry_budget)
    for i, port_policy in enumerate(policy.port_level_settings):
        at = (*path, "portLevelSettings", i)
        if not port_policy.HasField("port"):
            report.error(at, "portLevelSettings entry needs a port")
        else:
            report.error((*at, "port", "number"), port_problem(port_policy.port.number))
        if not any(field.name != "port" for field, _ in port_policy.ListFields()):
            report.error(at, "portLevelSettings entry must set a policy besides its port")
        _policy_fields(report, at, port_policy)
    if policy.HasField("tunnel"):
        _tunnel(report, (*path, "tunnel"), policy.tunnel)


def _policy_fields(report: Report, path: FieldPath, policy: Any) -> None:
    """The fields a top-level and a per-port policy share."""
    outlier = policy.outlier_detection if policy.HasField("outlier_detection") else None
    if outlier is not None:
        _outlier_detection(report, (*path, "outlierDetection"), outlier)
    if policy.HasField("connection_pool"):
        check_connection_pool(report, (*path, "connectionPool"), policy.connection_pool)
    if policy.HasField("load_balancer"):
        _load_balancer(report, (*path, "loadBalancer"), policy.load_balancer, outlier)
    if policy.HasField("tls"):
        _client_tls(report, (*path, "tls"), policy.tls)


def _outlier_detection(report: Report, path: FieldPath, outlier: Any) -> None:
    for field, json_name in (("base_ejection_time", "baseEjectionTime"), ("interval", "interval")):
        if outlier.HasField(field):
            report.error((*path, json_name), duration_problem(getattr(outlier, field)))
    if outlier.consecutive_errors:
        report.warn(
            (*path, "consecutiveErrors"),
            'consecutiveErrors is deprecated: use "consecutive5xxErrors" or "consecutiveGatewayErrors"',
        )
    if not outlier.split_external_local_origin_errors and outlier.consecutive_local_origin_failures.value > 0:
        report.error(
            (*path, "consecutiveLocalOriginFailures"),
            "consecutiveLocalOriginFailures only counts when splitExternalLocalOriginErrors is true",
        )
    report.error((*path, "maxEjectionPercent"), percent_problem(outlier.max_ejection_percent))
    report.error((*path, "minHealthPercent"), percent_problem(outlier.min_health_percent))


def check_connection_pool(report: Report, path: FieldPath, pool: Any) -> None:
    """Limits are counts (never negative) and durations (at least 1ms, except a tcp idleTimeout of
    0s, which switches it off)."""
    if not pool.HasField("http") and not pool.HasField("tcp"):
        report.error(path, 'connectionPool must set "tcp", "http" or both')
        return
    if pool.HasField("http"):
        http, at = pool.http, (*path, "http")
        for field, json_name in (
            ("http1_max_pending_requests", "http1MaxPendingRequests"),
            ("http2_max_requests", "http2MaxRequests"),
            ("max_requests_per_connection", "maxRequestsPerConnection"),
            ("max_retries", "maxRetries"),
            ("max_concurrent_streams", "maxConcurrentStreams"),
        ):
            if getattr(http, field) < 0:
                report.error((*at, json_name), f"{json_name} must not be negative")
        if http.HasField("idle_timeout"):
            report.error((*at, "idleTimeout"), duration_problem(http.idle_timeout))
        if enum_name(http, "h2_upgrade_policy") == "UPGRADE" and http.use_client_protocol:
            report.error((*at, "useClientProtocol"), "useClientProtocol cannot be true when h2UpgradePolicy is UPGRADE")
        if http.HasField("http2_keep_alive"):
            keep_alive = http.http2_keep_alive
            if not keep_alive.HasField("interval"):
                # Envoy sends PINGs only every `interval`: without one the setting does nothing.
                report.error((*at, "http2KeepAlive"), "http2KeepAlive needs an interval")
            for field in ("interval", "timeout"):
                if keep_alive.HasField(field):
                    report.error((*at, "http2KeepAlive", field), crd_duration_problem(getattr(keep_alive, field)))
    if pool.HasField("tcp"):
        tcp, at = pool.tcp, (*path, "tcp")
        if tcp.max_connections < 0:
            report.error((*at, "maxConnections"), "maxConnections must not be negative")
        for field, json_name in (
            ("connect_timeout", "connectTimeout"),
            ("max_connection_duration", "maxConnectionDuration"),
            ("idle_timeout", "idleTimeout"),
        ):
            value = getattr(tcp, field)
            # An idle timeout of 0s switches the timeout off.
            if tcp.HasField(field) and not (field == "idle_timeout" and value.ToNanoseconds() == 0):
                report.error((*at, json_name), duration_problem(value))
        if tcp.HasField("tcp_keepalive"):
            for field in ("time", "interval"):
                if tcp.tcp_keepalive.HasField(field):
                    value = getattr(tcp.tcp_keepalive, field)
                    report.error((*at, "tcpKeepalive", field), duration_problem(value))
                    # Envoy holds keepalive times in 32-bit seconds.
                    report.error(
                        (*at, "tcpKeepalive", field), seconds32_problem(value.seconds, f"tcpKeepalive.{field}")
                    )


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % f for f in range(2, math.isqrt(n) + 1))


def _load_balancer(report: Report, path: FieldPath, lb: Any, outlier: Any | None) -> None:
    if lb.HasField("consistent_hash"):
        ch, at = lb.consistent_hash, (*path, "consistentHash")
        if ch.HasField("http_cookie"):
            _http_cookie(report, (*at, "httpCookie"), ch.http_cookie)
        if ch.minimum_ring_size:
            report.warn((*at, "minimumRingSize"), 'minimumRingSize is deprecated: use "ringHash.minimumRingSize"')
            report.error((*at, "minimumRingSize"), ring_size_problem(ch.minimum_ring_size))
        if ch.HasField("ring_hash"):
            report.error((*at, "ringHash", "minimumRingSize"), ring_size_problem(ch.ring_hash.minimum_ring_size))
        # The deprecated size and its replacements say one thing twice (Istio refuses both).
        if ch.minimum_ring_size and ch.WhichOneof("hash_algorithm"):
            report.error((*at, "minimumRingSize"), 'minimumRingSize cannot be set with "ringHash" or "maglev"')
        if ch.HasField("maglev"):
            size = ch.maglev.table_size
            if size == 0:
                report.error((*at, "maglev"), "maglev needs a tableSize")
            elif size >= _MAGLEV_TABLE_LIMIT or not _is_prime(size):
                report.error(
                    (*at, "maglev", "tableSize"), f"maglev tableSize {size} must be a prime below {_MAGLEV_TABLE_LIMIT}"
                )
    if lb.HasField("locality_lb_setting"):
        _locality(report, (*path, "localityLbSetting"), lb.locality_lb_setting, outlier)
    if lb.HasField("zone_aware_lb_setting"):
        _zone_aware(report, path, lb)
    if lb.HasField("warmup_duration_secs"):
        report.error((*path, "warmupDurationSecs"), duration_problem(lb.warmup_duration_secs))
    if lb.HasField("warmup"):
        warmup, at = lb.warmup, (*path, "warmup")
        if not warmup.HasField("duration"):
            report.error(at, "warmup needs a duration")
        else:
            report.error((*at, "duration"), duration_problem(warmup.duration))
        if warmup.minimum_percent.value > 100:
            report.error((*at, "minimumPercent"), "minimumPercent must be at most 100")
        if warmup.HasField("aggression") and warmup.aggression.value < 1:
            report.error((*at, "aggression"), "aggression must be at least 1")


def _http_cookie(report: Report, path: FieldPath, cookie: Any) -> None:
    if not cookie.name:
        report.error(path, "httpCookie needs a name")
    # Istio's API marks an attribute's name REQUIRED (its CRD schema refuses one without), and
    # Envoy refuses an empty attribute name.
    for i, attribute in enumerate(cookie.attributes):
        if not attribute.name:
            report.error((*path, "attributes", i), "a cookie attribute needs a name (e.g. SameSite)")


def _zone_aware(report: Report, path: FieldPath, lb: Any) -> None:
    """Zone-aware load balancing (Istio 1.31, istio/api#3733): it replaces locality load
    balancing, and always partitions by region and zone, so priorities cannot name them."""
    at = (*path, "zoneAwareLbSetting")
    if lb.HasField("locality_lb_setting"):
        report.error(at, '"zoneAwareLbSetting" and "localityLbSetting" cannot be set together')
    for i, label in enumerate(lb.zone_aware_lb_setting.failover_priority):
        if label in _TOPOLOGY_LABELS:
            report.error(
                (*at, "failoverPriority", i),
                f'"{label}" cannot be in a zone-aware failoverPriority: zone-aware load balancing '
                "already partitions by region and zone",
            )


def _retry_budget(report: Report, path: FieldPath, budget: Any) -> None:
    """The CRD schema bounds the percentage (Minimum=0, Maximum=100, istio/api#3512)."""
    if budget.HasField("percent") and not 0 <= budget.percent.value <= 100:
        report.error((*path, "percent"), f"retry budget percent {budget.percent.value:g} must be in the range 0..100")


def _locality(report: Report, path: FieldPath, setting: Any, outlier: Any | None) -> None:
    if setting.distribute and setting.failover:
        report.error(path, '"distribute" and "failover" cannot be set together')
        return
    if setting.failover:
        for i, label in enumerate(setting.failover_priority):
            if label in _TOPOLOGY_LABELS:
                report.error(
                    (*path, "failoverPriority", i), f'"{label}" cannot be in failoverPriority when "failover" is set'
                )
        if outlier is None:
            report.warn(path, "failover only happens with outlierDetection: set it in the same traffic policy")
    elif setting.failover_priority and outlier is None:
        report.warn(path, "failoverPriority only takes effect with outlierDetection in the same traffic policy")
    sources: list[str] = []
    for i, rule in enumerate(setting.distribute):
        at = (*path, "distribute", i)
        sources.append(getattr(rule, "from"))  # `from` is a Python keyword
        for locality, weight in sorted(rule.to.items()):
            if not 1 <= weight <= 100:
                report.error((*at, "to", locality), f"locality weight {weight} must be in the range 1..100")
        total = sum(rule.to.values())
        if total != 100:
            report.error((*at, "to"), f"locality weights add up to {total}, not 100")
        report.error((*at, "to"), _localities_problem(sorted(rule.to)))
    report.error((*path, "distribute"), _localities_problem(sources))
    for i, failover in enumerate(setting.failover):
        at = (*path, "failover", i)
        source = getattr(failover, "from")
        if source == failover.to:
            report.error(at, "failover must go from one region to a different one")
        if "/" in source or "/" in failover.to:
            report.error(at, "failover takes regions only, not zones")
        if "*" in source or "*" in failover.to:
            report.error(at, 'failover regions cannot contain "*"')


def _localities_problem(localities: list[str]) -> str | None:
    """Localities are `region[/zone[/subzone]]`, with at most one `*`, at the end; none may
    cover another."""
    seen: list[tuple[str, ...]] = []
    for locality in localities:
        if locality.count("*") > 1 or ("*" in locality and not locality.endswith("*")):
            return f'locality "{locality}": "*" may appear once, at the end'
        parts = tuple(locality.split("/", 2))
        if any(not p for p in parts):
            return f'locality "{locality}" has an empty region, zone or subzone'
        key = parts[:-1] if parts[-1] == "*" else parts
        for other in seen:
            if other[: len(key)] == key or key[: len(other)] == other:
                return f'locality "{locality}" overlaps an earlier one'
        seen.append(key)
    return None


def _client_tls(report: Report, path: FieldPath, tls: Any) -> None:
    mode = enum_name(tls, "mode")
    if tls.insecure_skip_verify.value:
        if mode == "SIMPLE" and (tls.ca_certificates or tls.credential_name or tls.subject_alt_names):
            report.error(
                path, "caCertificates, credentialName and subjectAltNames cannot be set with insecureSkipVerify"
            )
        if mode == "MUTUAL" and (tls.ca_certificates or tls.subject_alt_names):
            report.error(path, "caCertificates and subjectAltNames cannot be set with insecureSkipVerify")
    if mode in ("SIMPLE", "MUTUAL") and tls.credential_name:
        if tls.client_certificate or tls.ca_certificates or tls.private_key or tls.ca_crl:
            report.error(
                (*path, "credentialName"),
                "with credentialName, certificates, keys and CRLs come from the credential: remove the file paths",
            )
        return
    if mode == "MUTUAL":
        if not tls.client_certificate:
            report.error(path, "MUTUAL TLS needs a clientCertificate (or a credentialName)")
        if not tls.private_key:
            report.error(path, "MUTUAL TLS needs a privateKey (or a credentialName)")
    if mode == "ISTIO_MUTUAL":
        for field, json_name in _CERTIFICATE_FIELDS:
            if getattr(tls, field):
                report.warn((*path, json_name), f"{json_name} is ignored: ISTIO_MUTUAL uses the mesh's certificates")


def _tunnel(report: Report, path: FieldPath, tunnel: Any) -> None:
    if tunnel.protocol and tunnel.protocol not in ("CONNECT", "POST"):
        report.error((*path, "protocol"), 'tunnel protocol must be "CONNECT" or "POST"')
    if fqdn_problem(tunnel.target_host) and ip_problem(tunnel.target_host):
        report.error(
            (*path, "targetHost"), f'tunnel targetHost "{tunnel.target_host}" must be a DNS name or an IP address'
        )
    report.error((*path, "targetPort"), port_problem(tunnel.target_port))
