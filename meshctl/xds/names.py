"""Istio's names for generated Envoy resources, so Istio users and their dashboards feel at home.

Clusters `outbound|9080|v1|reviews.bookinfo.mesh` and `inbound|9080||`, `BlackHoleCluster`,
`PassthroughCluster`; listeners `0.0.0.0_9080` / `10.0.0.5_9080`, `virtualOutbound`,
`virtualInbound`; sidecar route configs named by port (`9080`), gateway ones `http.8080`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf.message import Message

from meshctl.config.model import Config

BLACKHOLE_CLUSTER: Final = "BlackHoleCluster"
PASSTHROUGH_CLUSTER: Final = "PassthroughCluster"
VIRTUAL_OUTBOUND: Final = "virtualOutbound"
VIRTUAL_INBOUND: Final = "virtualInbound"
#: Istio's name for the passthrough chains that serve HTTP (`VirtualInboundCatchAllHTTPFilterChainName`).
VIRTUAL_INBOUND_CATCHALL_HTTP: Final = "virtualInbound-catchall-http"
VIRTUAL_OUTBOUND_PORT: Final = 15001
VIRTUAL_INBOUND_PORT: Final = 15006
#: Where inbound traffic for no declared port goes (the inbound listener and its cluster agree).
INBOUND_PASSTHROUGH_CLUSTER: Final = "InboundPassthroughCluster"
#: The workload's own address as its sidecar reaches it, and where loopback-bound listeners bind.
LOCALHOST: Final = "127.0.0.1"
#: The address a listener binds to reach every interface.
WILDCARD: Final = "0.0.0.0"


class Direction(enum.StrEnum):
    INBOUND = "inbound"
    OUTBOUND = "outbound"


@dataclass(frozen=True, slots=True)
class ClusterName:
    direction: Direction
    port: int
    subset: str
    host: str

    def __str__(self) -> str:
        return f"{self.direction}|{self.port}|{self.subset}|{self.host}"


def outbound_cluster(port: int, host: str, subset: str = "") -> str:
    return f"outbound|{port}|{subset}|{host}"


def inbound_cluster(port: int) -> str:
    return f"inbound|{port}||"


def parse_cluster_name(name: str) -> ClusterName | None:
    """`outbound|9080|v1|reviews.bookinfo.mesh` -> its parts; None for other names."""
    parts = name.split("|")
    direction = _DIRECTIONS.get(parts[0])
    if len(parts) != 4 or direction is None or not parts[1].isdigit():
        return None
    return ClusterName(direction, int(parts[1]), parts[2], parts[3])


#: The directions by their text: a lookup here, not the enum's call (a microsecond each, asked
#: for every cluster name of an EDS set).
_DIRECTIONS: Final = {d.value: d for d in Direction}


def listener_name(address: str, port: int) -> str:
    return f"{address}_{port}"


def sidecar_route_name(port: int) -> str:
    return str(port)


def gateway_route_name(protocol: str, port: int) -> str:
    """`http.8080`; HTTPS servers terminated on a gateway get `https.443.NAME.GW.NS` in Istio,
    the caller appends what makes them unique."""
    return f"{protocol}.{port}"


_KIND_PATHS: Final = {
    "VirtualService": "virtual-service",
    "DestinationRule": "destination-rule",
    "Gateway": "gateway",
    "ServiceEntry": "service-entry",
    "Sidecar": "sidecar",
}


def config_path(config: Config) -> str:
    """Istio's `config` metadata value pointing back at a resource:
    `/apis/networking.istio.io/v1/namespaces/NS/virtual-service/NAME`."""
    version = config.api_version.partition("/")[2] or "v1"
    kind = _KIND_PATHS.get(config.kind, config.kind.lower())
    return f"/apis/networking.istio.io/{version}/namespaces/{config.namespace}/{kind}/{config.name}"


def gateway_https_route_name(port: int, port_name: str, gateway_name: str, gateway_namespace: str) -> str:
    """Route config of one terminated HTTPS server, unique per server as in Istio:
    `https.443.https.bookinfo-gateway.bookinfo`."""
    return f"https.{port}.{port_name}.{gateway_name}.{gateway_namespace}"


def resource_name(message: Message) -> str:
    """The xDS name of a generated resource (Cluster/Listener/RouteConfiguration `name`,
    ClusterLoadAssignment `cluster_name`)."""
    name = getattr(message, "cluster_name", "") or getattr(message, "name", "")
    return str(name)


def eds_cluster_names(clusters: Iterable[Message]) -> list[str]:
    """Names of the clusters whose endpoints come over EDS."""
    return [c.name for c in clusters if c.type == cluster_pb2.Cluster.EDS]  # type: ignore[attr-defined]
