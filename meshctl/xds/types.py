"""xDS type URLs and the order pushes follow.

Make-before-break: clusters first (so routes never point at a cluster Envoy lacks), then their
endpoints (an updated cluster stays warming until it has them), then listeners, then the routes
the listeners name.
"""

from __future__ import annotations

from typing import Final

CLUSTER: Final = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER: Final = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE: Final = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SECRET: Final = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

#: Secrets first: a renewed certificate is sent before anything that could name it.
PUSH_ORDER: Final = (SECRET, CLUSTER, ENDPOINT, LISTENER, ROUTE)

#: Types whose subscription is the whole set when a node names nothing (LDS, CDS).
WILDCARD_TYPES: Final = frozenset((CLUSTER, LISTENER))

SHORT_NAMES: Final = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS", SECRET: "SDS"}
