"""DNS clusters on Envoy's DNS cluster extension, the form Envoy has not deprecated.

istiod builds the clusters of a DNS service as `type: STRICT_DNS` (resolution DNS: every address
a DNS name resolves to is an endpoint) or `type: LOGICAL_DNS` (DNS_ROUND_ROBIN: one endpoint,
the first address, per connection), with `dns_lookup_family`, `dns_refresh_rate` (the mesh's,
60 s by default) and `respect_dns_ttl` on the cluster (cluster_builder.go, buildCluster). Envoy
deprecates those `dns_*` cluster fields in favour of the `envoy.cluster.dns` cluster type
(`envoy.extensions.clusters.dns.v3.DnsCluster`) and warns on every config that uses them. Istio
has not moved yet (it silences the deprecation); Envoy Gateway has, and meshctl does the same:

- `cluster_type: {name: envoy.cluster.dns, typed_config: DnsCluster}` replaces `type`;
  STRICT_DNS is `all_addresses_in_single_endpoint: false` (Envoy's default), LOGICAL_DNS is
  `true`, as the extension's documentation maps them.
- The refresh rate, the TTL rule and the lookup family move into the DnsCluster; Envoy reads
  the family from there once `cluster_type` is set.
- Endpoints stay inline in `load_assignment`, as before.

Generators build a DNS cluster with its plain `type` and call `use_dns_extension` last, so the
steps in between (locality, PASSTHROUGH, subsets taking their parent's type) read the type as
they always did. `discovery_type` names any generated cluster's type for people: an extension
DNS cluster is still STRICT_DNS or LOGICAL_DNS there.
"""

from __future__ import annotations

from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.clusters.common.dns.v3 import dns_pb2
from envoy.extensions.clusters.dns.v3 import dns_cluster_pb2

#: Envoy's name for its DNS cluster extension.
DNS_CLUSTER: Final = "envoy.cluster.dns"
#: Istio's mesh default DNS refresh rate.
DNS_REFRESH_SECONDS: Final = 60

_Cluster = cluster_pb2.Cluster
_DNS_TYPES: Final = frozenset({_Cluster.STRICT_DNS, _Cluster.LOGICAL_DNS})


def is_dns_type(kind: int) -> bool:
    """Whether a cluster `type` is one of the DNS types (STRICT_DNS, LOGICAL_DNS)."""
    return kind in _DNS_TYPES


def dns_lookup_family(family: str) -> int:
    """Istio's lookup family for a proxy with one address: IPv6 only if its address is an IPv6
    one (`family` "v6"), else IPv4 only."""
    return int(dns_pb2.V6_ONLY if family == "v6" else dns_pb2.V4_ONLY)


def dns_cluster_config(*, logical: bool, family: str) -> dns_cluster_pb2.DnsCluster:
    """The DnsCluster for a STRICT_DNS (`logical=False`) or LOGICAL_DNS cluster."""
    out = dns_cluster_pb2.DnsCluster(
        respect_dns_ttl=True,
        dns_lookup_family=dns_lookup_family(family),
        all_addresses_in_single_endpoint=logical,
    )
    out.dns_refresh_rate.seconds = DNS_REFRESH_SECONDS
    return out


def use_dns_extension(cluster: cluster_pb2.Cluster, family: str) -> cluster_pb2.Cluster:
    """Move a STRICT_DNS or LOGICAL_DNS cluster onto the DNS cluster extension (in place, and
    returned); other clusters are left as they are."""
    if cluster.WhichOneof("cluster_discovery_type") != "type" or not is_dns_type(cluster.type):
        return cluster
    config = dns_cluster_config(logical=cluster.type == _Cluster.LOGICAL_DNS, family=family)
    cluster.cluster_type.name = DNS_CLUSTER
    cluster.cluster_type.typed_config.Pack(config)  # clears `type`: the two are a oneof
    return cluster


def discovery_type(cluster: cluster_pb2.Cluster) -> str:
    """The cluster's discovery type as istioctl names it: EDS, STATIC, ORIGINAL_DST, STRICT_DNS,
    LOGICAL_DNS (a DNS extension cluster by what it resolves to), or the name of another
    extension type."""
    if cluster.WhichOneof("cluster_discovery_type") != "cluster_type":
        return str(_Cluster.DiscoveryType.Name(cluster.type))
    custom = cluster.cluster_type
    config = dns_cluster_pb2.DnsCluster()
    if custom.typed_config.Unpack(config):
        return "LOGICAL_DNS" if config.all_addresses_in_single_endpoint else "STRICT_DNS"
    return str(custom.name)
