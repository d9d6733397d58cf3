"""What a proxy's outbound and inbound clusters share: Istio's metadata and stat names, the
ORIGINAL_DST passthrough shape, and clusters of several parts merged by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import struct_pb2

from meshctl.registry.model import Service
from meshctl.xds.cluster_policy import ClusterDraft, default_thresholds, duration
from meshctl.xds.endpoints import ISTIO_METADATA

_Cluster = cluster_pb2.Cluster

_PASSTHROUGH_IDLE_SECONDS: Final = 300


def merge_clusters(*parts: Iterable[cluster_pb2.Cluster]) -> list[cluster_pb2.Cluster]:
    """Clusters of several parts sorted by name; the first of a name wins."""
    out: dict[str, cluster_pb2.Cluster] = {}
    for part in parts:
        for c in part:
            out.setdefault(c.name, c)
    return [out[name] for name in sorted(out)]


def delimited_stats(clusters: list[cluster_pb2.Cluster]) -> list[cluster_pb2.Cluster]:
    """Istio's ClusterBuilder.buildCluster (`util.DelimitedStatsPrefix`): stats under the
    cluster's name ended by `;`, so the bootstrap's `cluster_name` tag extractor takes the whole
    name (`outbound|9080|v1|reviews.bookinfo.mesh`) as a label instead of cutting it at a dot."""
    for cluster in clusters:
        cluster.alt_stat_name = f"{cluster.name};"
    return clusters


def passthrough_cluster(name: str, timeout: float) -> cluster_pb2.Cluster:
    """ORIGINAL_DST to wherever the client connected, speaking the client's HTTP version."""
    cluster = _Cluster(name=name)
    cluster.type = _Cluster.ORIGINAL_DST
    cluster.lb_policy = _Cluster.CLUSTER_PROVIDED
    draft = ClusterDraft(cluster)
    options = draft.http_options()
    options.common_http_protocol_options.idle_timeout.CopyFrom(duration(_PASSTHROUGH_IDLE_SECONDS))
    draft.use_downstream_protocol()
    cluster.connect_timeout.CopyFrom(duration(timeout))
    cluster.circuit_breakers.thresholds.append(default_thresholds())
    return draft.finish()


def istio_metadata(cluster: cluster_pb2.Cluster) -> struct_pb2.Struct:
    """The cluster's `filter_metadata.istio`, made when absent, to be updated in place."""
    meta: struct_pb2.Struct = cluster.metadata.filter_metadata[ISTIO_METADATA]
    return meta


def service_metadata(service: Service) -> dict[str, str]:
    """One entry of Istio's `services` metadata (a service entry's name is its host)."""
    return {"host": service.hostname, "name": service.hostname, "namespace": service.namespace}
