"""A DestinationRule's traffic policy, translated onto one Envoy cluster the way istiod does it.

Istio's `cluster_traffic_policy.go` is the reference, rule for rule, so a proxy moved from istiod
to meshctl sees the same clusters:

- Which policy applies to a cluster: the rule's top-level policy, replaced *as a whole* by a
  `portLevelSettings` entry for the cluster's port (port-level settings do not inherit from the
  top level); for a subset cluster, the subset's policy (again port-level first) overrides the
  rule's component by component (connection pool, outlier detection, load balancer, TLS), and a
  subset port-level entry replaces all four.
- Circuit breakers are always set, at the maximum unless the connection pool lowers them
  (Envoy's own defaults, 1024 connections and 3 retries, break busy services); the connect
  timeout is the mesh's unless the pool sets one. A `retryBudget` caps concurrent retries at a
  share of the active requests instead (Envoy then ignores `maxRetries`); it belongs to the
  rule or subset as a whole, so a port-level entry, which has none, drops it.
- The connection pool reaches Envoy whole: TCP keepalive on the upstream socket, idle timeout,
  connection duration and requests per connection in the HTTP protocol options, and, on clusters
  that speak HTTP/2, the concurrent-stream limit and the HTTP/2 PING keepalive. `h2UpgradePolicy`
  is applied first, so that an upgraded cluster gets its HTTP/2 settings too (istio/istio#57583).
- Outlier detection sets only the kinds of ejection that were written, enforcing them at 100%,
  and always turns success-rate ejection off. Its `minHealthPercent` becomes Envoy's healthy panic
  threshold (0 when unset, as in Istio). Clusters without outlier detection get a panic threshold
  of 0 too: meshctl sends unhealthy endpoints to Envoy with their status instead of dropping them
  (Istio's `SendUnhealthyEndpoints`), and in panic mode Envoy would route to them.
- The default load balancer is LEAST_REQUEST; PASSTHROUGH turns the cluster into ORIGINAL_DST.
  Consistent hashing picks RING_HASH or MAGLEV here; the hash key itself is a route setting.
- Locality load balancing: `localityWeightedLbConfig` is set when `distribute` is given, or when
  `failover`/`failoverPriority` is given together with outlier detection (without outlier
  detection Envoy never fails over), or the service's traffic distribution (`PreferClose`...)
  stands for a failoverPriority, which needs none. Priorities and weights relative to the
  calling proxy are applied here only to load assignments carried in the cluster itself (DNS
  clusters); EDS assignments get them in their per-proxy variants (`eds_locality`). See
  `apply_locality`.
- `proxyProtocol` sends a PROXY protocol header first on every upstream connection, around TLS
  if the cluster originates it; like the retry budget it belongs to the rule or subset.

Not generated yet, though validation accepts them: `zoneAwareLbSetting` (Istio 1.31), which only
works with a bootstrap that declares the proxy's own `local_cluster` (Istio's
ISTIO_META_ENABLE_SELF_DISCOVERY), so the default locality load balancing stays in force; and
`tunnel`, a tcp_proxy setting rather than a cluster one. TLS origination lives in `cluster_tls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import proxy_protocol_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import duration_pb2

from meshctl.api.networking.v1alpha3 import destination_rule_pb2 as dr_pb2
from meshctl.config.labels import NETWORK_LABEL
from meshctl.registry.model import Protocol, TrafficDistribution
from meshctl.xds.locality import (
    HOSTNAME_LABEL,
    REGION_LABEL,
    SUBZONE_LABEL,
    ZONE_LABEL,
    apply_locality,
)

HTTP_PROTOCOL_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
UPSTREAM_PROXY_PROTOCOL: Final = "envoy.transport_sockets.upstream_proxy_protocol"
RAW_BUFFER: Final = "envoy.transport_sockets.raw_buffer"
MAX_UINT32: Final = 4294967295
#: Istio's applyRetryBudget defaults: 20% of active requests (istio/istio#59505 fixed a 0.2%),
#: and 3 retries whatever the share gives (Envoy's own defaults too).
RETRY_BUDGET_PERCENT: Final = 20.0
RETRY_BUDGET_MIN_CONCURRENCY: Final = 3
#: Envoy requires a PING timeout; an `http2KeepAlive` with an interval alone waits this long for
#: the answer (gRPC's default keepalive timeout).
H2_KEEPALIVE_TIMEOUT_SECONDS: Final = 20

_Cluster = cluster_pb2.Cluster
_LB = dr_pb2.LoadBalancerSettings
_H2 = dr_pb2.ConnectionPoolSettings.HTTPSettings


@dataclass(slots=True)
class Policy:
    """The four parts of a traffic policy that apply to one cluster; None where unset."""

    connection_pool: dr_pb2.ConnectionPoolSettings | None = None
    outlier_detection: dr_pb2.OutlierDetection | None = None
    load_balancer: dr_pb2.LoadBalancerSettings | None = None
    tls: dr_pb2.ClientTLSSettings | None = None
    #: Only a TrafficPolicy has these two; a port-level entry (and so the policy it replaces) has none.
    retry_budget: dr_pb2.TrafficPolicy.RetryBudget | None = None
    proxy_protocol: dr_pb2.TrafficPolicy.ProxyProtocol | None = None


def _part(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _top_level_part(message: Any, field: str) -> Any:
    return _part(message, field) if field in message.DESCRIPTOR.fields_by_name else None


def _parts(message: Any) -> Policy:
    """Istio's ShallowCopyTrafficPolicy of a TrafficPolicy, or shadowCopyPortTrafficPolicy of a
    port-level entry (which has no retry budget or PROXY protocol)."""
    return Policy(
        connection_pool=_part(message, "connection_pool"),
        outlier_detection=_part(message, "outlier_detection"),
        load_balancer=_part(message, "load_balancer"),
        tls=_part(message, "tls"),
        retry_budget=_top_level_part(message, "retry_budget"),
        proxy_protocol=_top_level_part(message, "proxy_protocol"),
    )


def _port_level(policy: dr_pb2.TrafficPolicy | None, port: int) -> tuple[Policy | None, bool]:
    """Istio's GetPortLevelTrafficPolicy: the port's entry replaces the whole policy."""
    if policy is None:
        return None, False
    for entry in policy.port_level_settings:
        if entry.HasField("port") and entry.port.number == port:
            return _parts(entry), True
    return _parts(policy), False


def policy_for_port(policy: dr_pb2.TrafficPolicy | None, port: int) -> Policy | None:
    """The policy of a rule's default cluster for `port`."""
    return _port_level(policy, port)[0]


def policy_for_subset(
    policy: dr_pb2.TrafficPolicy | None, subset_policy: dr_pb2.TrafficPolicy | None, port: int
) -> Policy | None:
    """Istio's MergeSubsetTrafficPolicy: subset parts override the rule's; a subset port-level
    entry replaces every part, unset ones included, but the retry budget and PROXY protocol,
    which a subset's replace only when it has them (mergeTrafficPolicy)."""
    original = policy_for_port(policy, port)
    if subset_policy is None:
        return original
    subset, port_level = _port_level(subset_policy, port)
    assert subset is not None  # subset_policy is not None
    if original is None:
        return subset
    return Policy(
        connection_pool=_pick(subset.connection_pool, original.connection_pool, port_level),
        outlier_detection=_pick(subset.outlier_detection, original.outlier_detection, port_level),
        load_balancer=_pick(subset.load_balancer, original.load_balancer, port_level),
        tls=_pick(subset.tls, original.tls, port_level),
        retry_budget=_pick(subset.retry_budget, original.retry_budget, False),
        proxy_protocol=_pick(subset.proxy_protocol, original.proxy_protocol, False),
    )


def _pick(subset: Any, original: Any, port_level: bool) -> Any:
    return subset if subset is not None or port_level else original


def traffic_policy(message: Any) -> dr_pb2.TrafficPolicy | None:
    """A DestinationRule's or Subset's `traffic_policy`, None when unset."""
    if message is None or not message.HasField("traffic_policy"):
        return None
    policy: dr_pb2.TrafficPolicy = message.traffic_policy
    return policy


class ClusterDraft:
    """A cluster being built, with the upstream HTTP protocol options kept apart until `finish`
    packs them (Istio's clusterWrapper): several steps edit them, and Envoy wants them as one
    typed extension."""

    def __init__(self, cluster: cluster_pb2.Cluster) -> None:
        self.cluster = cluster
        self.options: http_protocol_options_pb2.HttpProtocolOptions | None = None

    def http_options(self) -> http_protocol_options_pb2.HttpProtocolOptions:
        if self.options is None:
            self.options = http_protocol_options_pb2.HttpProtocolOptions()
        return self.options

    @property
    def is_http2(self) -> bool:
        o = self.options
        return bool(
            o is not None
            and o.HasField("explicit_http_config")
            and o.explicit_http_config.HasField("http2_protocol_options")
        )

    def http2_options(self) -> list[Any]:
        """The HTTP/2 protocol options the cluster's connections may use: the explicit ones, or
        those for clients that speak HTTP/2 when the cluster follows the downstream protocol."""
        o = self.options
        if o is None:
            return []
        if o.HasField("explicit_http_config") and o.explicit_http_config.HasField("http2_protocol_options"):
            return [o.explicit_http_config.http2_protocol_options]
        if o.HasField("use_downstream_protocol_config"):
            return [o.use_downstream_protocol_config.http2_protocol_options]
        return []

    def use_http2(self) -> None:
        self.http_options().explicit_http_config.http2_protocol_options.SetInParent()

    def use_downstream_protocol(self) -> None:
        config = self.http_options().use_downstream_protocol_config
        config.http_protocol_options.SetInParent()
        config.http2_protocol_options.SetInParent()

    def finish(self) -> cluster_pb2.Cluster:
        if self.options is not None:
            if self.options.WhichOneof("upstream_protocol_options") is None:
                self.options.explicit_http_config.http_protocol_options.SetInParent()
            self.cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].Pack(self.options)
        return self.cluster


def duration(seconds: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromNanoseconds(round(seconds * 1e9))
    return out


def default_thresholds() -> circuit_breaker_pb2.CircuitBreakers.Thresholds:
    """Istio's defaults: everything at the maximum, with remaining capacity tracked."""
    t = circuit_breaker_pb2.CircuitBreakers.Thresholds()
    t.max_connections.value = MAX_UINT32
    t.max_pending_requests.value = MAX_UINT32
    t.max_requests.value = MAX_UINT32
    t.max_retries.value = MAX_UINT32
    t.track_remaining = True
    return t


def apply_retry_budget(
    threshold: circuit_breaker_pb2.CircuitBreakers.Thresholds, budget: dr_pb2.TrafficPolicy.RetryBudget | None
) -> None:
    """Istio's applyRetryBudget: the share of active requests that may be retries, at least
    `minRetryConcurrency` of them. `budgetInterval` (Istio 1.31) has no field in the Envoy API
    meshctl builds with (xds-protos 1.85), so it is not sent: Envoy counts the active requests
    only, which is Istio's behaviour for the default 0ms too."""
    if budget is None:
        return
    out = threshold.retry_budget
    out.budget_percent.value = budget.percent.value if budget.HasField("percent") else RETRY_BUDGET_PERCENT
    out.min_retry_concurrency.value = budget.min_retry_concurrency or RETRY_BUDGET_MIN_CONCURRENCY


def apply_connection_pool(
    draft: ClusterDraft,
    pool: dr_pb2.ConnectionPoolSettings | None,
    connect_timeout: float,
    retry_budget: dr_pb2.TrafficPolicy.RetryBudget | None = None,
) -> None:
    """Circuit breakers, timeouts, keepalive and per-connection HTTP limits (Istio's
    applyConnectionPool; zero means unset, as it does there)."""
    settings = pool if pool is not None else dr_pb2.ConnectionPoolSettings()
    cluster = draft.cluster
    threshold = default_thresholds()
    apply_retry_budget(threshold, retry_budget)
    idle_timeout: duration_pb2.Duration | None = None
    max_connection_duration: duration_pb2.Duration | None = None
    max_requests_per_connection = 0
    max_concurrent_streams = 0
    keepalive: Any = None
    http = _part(settings, "http")
    if http is not None:
        if http.http2_max_requests > 0:
            threshold.max_requests.value = http.http2_max_requests
        if http.http1_max_pending_requests > 0:
            threshold.max_pending_requests.value = http.http1_max_pending_requests
        if http.max_retries > 0:
            threshold.max_retries.value = http.max_retries
        idle_timeout = _part(http, "idle_timeout")
        max_requests_per_connection = http.max_requests_per_connection
        max_concurrent_streams = http.max_concurrent_streams
        keepalive = _part(http, "http2_keep_alive")

    cluster.connect_timeout.CopyFrom(duration(connect_timeout))
    tcp = _part(settings, "tcp")
    if tcp is not None:
        if tcp.HasField("connect_timeout"):
            cluster.connect_timeout.CopyFrom(tcp.connect_timeout)
        if tcp.max_connections > 0:
            threshold.max_connections.value = tcp.max_connections
        max_connection_duration = _part(tcp, "max_connection_duration")
        if idle_timeout is None:
            idle_timeout = _part(tcp, "idle_timeout")
        if tcp.HasField("tcp_keepalive"):
            _apply_keepalive(cluster, tcp.tcp_keepalive)

    cluster.circuit_breakers.ClearField("thresholds")
    cluster.circuit_breakers.thresholds.append(threshold)

    if (
        max_connection_duration is not None
        or idle_timeout is not None
        or max_requests_per_connection > 0
        or max_concurrent_streams > 0
    ):
        common = draft.http_options().common_http_protocol_options
        if idle_timeout is not None:
            common.idle_timeout.CopyFrom(idle_timeout)
        if max_requests_per_connection > 0:
            common.max_requests_per_connection.value = max_requests_per_connection
        if max_connection_duration is not None:
            common.max_connection_duration.CopyFrom(max_connection_duration)
        if draft.is_http2 and max_concurrent_streams > 0:
            assert draft.options is not None
            h2 = draft.options.explicit_http_config.http2_protocol_options
            h2.max_concurrent_streams.value = max_concurrent_streams
    if http is not None and http.use_client_protocol:
        draft.use_downstream_protocol()
    if keepalive is not None:
        # Last, once the cluster's HTTP/2 options are final (useClientProtocol replaces them).
        for h2 in draft.http2_options():
            _apply_h2_keepalive(h2, keepalive)


def _apply_h2_keepalive(h2: Any, keepalive: Any) -> None:
    """`http2KeepAlive` (Istio 1.31, istio/istio#60436) as Envoy's HTTP/2 `connection_keepalive`:
    a PING every `interval`, the connection closed when one is not answered within `timeout`."""
    out = h2.connection_keepalive
    if keepalive.HasField("interval"):
        out.interval.CopyFrom(keepalive.interval)
    if keepalive.HasField("timeout"):
        out.timeout.CopyFrom(keepalive.timeout)
    else:
        out.timeout.CopyFrom(duration(H2_KEEPALIVE_TIMEOUT_SECONDS))


def _apply_keepalive(cluster: cluster_pb2.Cluster, keepalive: Any) -> None:
    """Istio's applyTCPKeepalive (setKeepAliveSettings): SO_KEEPALIVE on upstream sockets, with
    the probes, idle time and interval that are set (whole seconds, as Envoy takes them)."""
    out = cluster.upstream_connection_options.tcp_keepalive
    out.SetInParent()
    if keepalive.probes > 0:
        out.keepalive_probes.value = keepalive.probes
    if keepalive.HasField("time"):
        out.keepalive_time.value = keepalive.time.seconds
    if keepalive.HasField("interval"):
        out.keepalive_interval.value = keepalive.interval.seconds


def apply_h2_upgrade(draft: ClusterDraft, pool: dr_pb2.ConnectionPoolSettings | None) -> None:
    """Istio's applyH2Upgrade (shouldH2Upgrade): `h2UpgradePolicy: UPGRADE` makes the cluster
    HTTP/2 whatever the port's protocol, unless it keeps the client's protocol; the mesh default
    (Istio's DO_NOT_UPGRADE) leaves it alone. Call it before apply_connection_pool, whose HTTP/2
    settings need the HTTP/2 options in place."""
    if pool is None or not pool.HasField("http") or pool.http.use_client_protocol:
        return
    if pool.http.h2_upgrade_policy == _H2.UPGRADE:
        draft.use_http2()


def apply_upstream_protocol(draft: ClusterDraft, protocol: Protocol, *, sniffed: bool = False) -> None:
    """Istio's setUpstreamProtocol: HTTP/2 to the upstream for HTTP2 and gRPC ports; with
    `sniffed` (a sidecar's outbound cluster of a sniffed port) the client's protocol, HTTP/1.1 or
    HTTP/2, as the outbound listener detected it (USE_DOWNSTREAM_PROTOCOL; tcp_proxy ignores it)."""
    if protocol.is_http2:
        draft.use_http2()
    elif sniffed and protocol.is_sniffed:
        draft.use_downstream_protocol()


def apply_proxy_protocol(
    cluster: cluster_pb2.Cluster, proxy_protocol: dr_pb2.TrafficPolicy.ProxyProtocol | None
) -> None:
    """Istio's applyUpstreamProxyProtocol: a PROXY protocol header (v1 or v2) before anything
    else on each upstream connection, wrapping the TLS transport socket if the cluster has one,
    else plain bytes. Call after apply_tls."""
    if proxy_protocol is None:
        return
    wrapper = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport()
    wrapper.config.version = (
        proxy_protocol_pb2.ProxyProtocolConfig.V2
        if proxy_protocol.version == dr_pb2.TrafficPolicy.ProxyProtocol.V2
        else proxy_protocol_pb2.ProxyProtocolConfig.V1
    )
    if cluster.HasField("transport_socket"):
        wrapper.transport_socket.CopyFrom(cluster.transport_socket)
    else:
        wrapper.transport_socket.name = RAW_BUFFER
        wrapper.transport_socket.typed_config.Pack(raw_buffer_pb2.RawBuffer())
    cluster.transport_socket.Clear()
    cluster.transport_socket.name = UPSTREAM_PROXY_PROTOCOL
    cluster.transport_socket.typed_config.Pack(wrapper)


def apply_outlier_detection(cluster: cluster_pb2.Cluster, outlier: dr_pb2.OutlierDetection | None) -> None:
    if outlier is None:
        return
    out = outlier_detection_pb2.OutlierDetection()
    out.enforcing_success_rate.value = 0
    if outlier.HasField("consecutive_5xx_errors"):
        v = outlier.consecutive_5xx_errors.value
        out.consecutive_5xx.value = v
        out.enforcing_consecutive_5xx.value = 100 if v > 0 else 0
    if outlier.HasField("consecutive_gateway_errors"):
        v = outlier.consecutive_gateway_errors.value
        out.consecutive_gateway_failure.value = v
        out.enforcing_consecutive_gateway_failure.value = 100 if v > 0 else 0
    if outlier.HasField("interval"):
        out.interval.CopyFrom(outlier.interval)
    if outlier.HasField("base_ejection_time"):
        out.base_ejection_time.CopyFrom(outlier.base_ejection_time)
    if outlier.max_ejection_percent > 0:
        out.max_ejection_percent.value = outlier.max_ejection_percent
    if outlier.split_external_local_origin_errors:
        out.split_external_local_origin_errors = True
        if outlier.consecutive_local_origin_failures.value > 0:
            out.consecutive_local_origin_failure.value = outlier.consecutive_local_origin_failures.value
            out.enforcing_consecutive_local_origin_failure.value = 100
        out.enforcing_local_origin_success_rate.value = 0
    cluster.outlier_detection.CopyFrom(out)
    cluster.common_lb_config.healthy_panic_threshold.value = max(outlier.min_health_percent, 0)


def locality_setting(
    lb: dr_pb2.LoadBalancerSettings | None,
    mesh_default: dr_pb2.LocalityLoadBalancerSetting | None = None,
    distribution: TrafficDistribution = TrafficDistribution.ANY,
) -> dr_pb2.LocalityLoadBalancerSetting | None:
    """The locality setting in force (Istio's loadbalancer.GetLocalityLbSetting): the rule's,
    else the one the service's traffic distribution implies, else the mesh's `localityLbSetting`
    (Istio's default: enabled, nothing configured); None when the one in force disables it."""
    setting: dr_pb2.LocalityLoadBalancerSetting
    if lb is not None and lb.HasField("locality_lb_setting"):
        setting = lb.locality_lb_setting
    elif distribution is not TrafficDistribution.ANY:
        return distribution_setting(distribution)
    else:
        setting = mesh_default if mesh_default is not None else dr_pb2.LocalityLoadBalancerSetting()
    if setting.HasField("enabled") and not setting.enabled.value:
        return None
    return setting


#: The failoverPriority each traffic distribution stands for, as Istio writes it.
_DISTRIBUTION_KEYS: Final = {
    TrafficDistribution.PREFER_SAME_ZONE: (NETWORK_LABEL, REGION_LABEL, ZONE_LABEL),
    TrafficDistribution.PREFER_SAME_NODE: (NETWORK_LABEL, REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL, HOSTNAME_LABEL),
}


def distribution_setting(distribution: TrafficDistribution) -> dr_pb2.LocalityLoadBalancerSetting:
    """The locality setting a traffic distribution other than ANY implies: failover by
    closeness, in force without outlier detection (see `forces_failover`)."""
    setting = dr_pb2.LocalityLoadBalancerSetting(failover_priority=_DISTRIBUTION_KEYS[distribution])
    setting.enabled.value = True
    return setting


def forces_failover(lb: dr_pb2.LoadBalancerSettings | None, distribution: TrafficDistribution) -> bool:
    """Whether failover applies without outlier detection: when the setting in force is the
    traffic distribution's (Istio's second answer of GetLocalityLbSetting)."""
    own = lb is not None and lb.HasField("locality_lb_setting")
    return not own and distribution is not TrafficDistribution.ANY


def apply_load_balancer(
    cluster: cluster_pb2.Cluster,
    lb: dr_pb2.LoadBalancerSettings | None,
    proxy_locality: str,
    mesh_locality: dr_pb2.LocalityLoadBalancerSetting | None = None,
    distribution: TrafficDistribution = TrafficDistribution.ANY,
) -> None:
    """LB policy, slow start, consistent hashing and locality settings (Istio's
    applyLoadBalancer). Call after outlier detection: failover depends on it, unless the
    service's traffic distribution forces it."""
    if not cluster.common_lb_config.HasField("healthy_panic_threshold"):
        cluster.common_lb_config.healthy_panic_threshold.value = 0
    setting = locality_setting(lb, mesh_locality, distribution)
    if setting is not None:
        failover = cluster.HasField("outlier_detection") or forces_failover(lb, distribution)
        if (failover and (setting.failover or setting.failover_priority)) or setting.distribute:
            cluster.common_lb_config.locality_weighted_lb_config.SetInParent()
        # A LOGICAL_DNS cluster has exactly one endpoint, which Envoy requires: nothing to spread.
        if cluster.HasField("load_assignment") and proxy_locality and cluster.type != _Cluster.LOGICAL_DNS:
            apply_locality(cluster.load_assignment, proxy_locality, setting, failover)

    if cluster.type == _Cluster.ORIGINAL_DST:
        cluster.lb_policy = _Cluster.CLUSTER_PROVIDED
        return
    simple = lb.simple if lb is not None and lb.HasField("simple") else _LB.UNSPECIFIED
    if simple == _LB.RANDOM:
        cluster.lb_policy = _Cluster.RANDOM
    elif simple == _LB.ROUND_ROBIN:
        cluster.lb_policy = _Cluster.ROUND_ROBIN
        _apply_slow_start(cluster, cluster.round_robin_lb_config, lb)
    elif simple == _LB.PASSTHROUGH:
        cluster.lb_policy = _Cluster.CLUSTER_PROVIDED
        cluster.type = _Cluster.ORIGINAL_DST
        cluster.ClearField("load_assignment")
    else:  # LEAST_REQUEST, the deprecated LEAST_CONN, and unset: Istio's default is LEAST_REQUEST
        cluster.lb_policy = _Cluster.LEAST_REQUEST
        _apply_slow_start(cluster, cluster.least_request_lb_config, lb)
    _apply_consistent_hash(cluster, lb)


def _apply_slow_start(cluster: cluster_pb2.Cluster, config: Any, lb: dr_pb2.LoadBalancerSettings | None) -> None:
    """`warmup` (or the older `warmupDurationSecs`) -> Envoy's slow start window."""
    if lb is None:
        return
    if lb.HasField("warmup"):
        warmup = lb.warmup
        slow = config.slow_start_config
        slow.SetInParent()
        if warmup.HasField("duration"):
            slow.slow_start_window.CopyFrom(warmup.duration)
        if warmup.HasField("aggression"):
            slow.aggression.default_value = warmup.aggression.value
            slow.aggression.runtime_key = f"upstream.{cluster.name}.slowStart.aggression"
        if warmup.HasField("minimum_percent"):
            slow.min_weight_percent.value = warmup.minimum_percent.value
    elif lb.HasField("warmup_duration_secs"):
        config.slow_start_config.slow_start_window.CopyFrom(lb.warmup_duration_secs)


def _apply_consistent_hash(cluster: cluster_pb2.Cluster, lb: dr_pb2.LoadBalancerSettings | None) -> None:
    if lb is None or not lb.HasField("consistent_hash"):
        return
    ch = lb.consistent_hash
    cluster.ClearField("lb_config")
    if ch.HasField("maglev"):
        cluster.lb_policy = _Cluster.MAGLEV
        if ch.maglev.table_size:
            cluster.maglev_lb_config.table_size.value = ch.maglev.table_size
    elif ch.HasField("ring_hash"):
        cluster.lb_policy = _Cluster.RING_HASH
        if ch.ring_hash.minimum_ring_size:
            cluster.ring_hash_lb_config.minimum_ring_size.value = ch.ring_hash.minimum_ring_size
    else:
        # The deprecated top-level minimumRingSize; 1024 is Envoy's own default.
        cluster.lb_policy = _Cluster.RING_HASH
        cluster.ring_hash_lb_config.minimum_ring_size.value = ch.minimum_ring_size or 1024
