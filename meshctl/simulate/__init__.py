"""Where a request from a proxy goes, worked out from the resources that proxy is sent.

`simulate` walks Envoy's own path through the generated Listener, RouteConfiguration, Cluster
and ClusterLoadAssignment protos: listener by port, filter chain, HTTP connection manager, route
config, virtual host, route, action, clusters and their endpoints. It never reads Istio YAML, so
its answer cannot disagree with what the server sends; the Istio resource a route came from is
found again through the `istio` metadata the generators write into it.

    request.py     the simulated request, parsed from a URL, a method and headers
    listener.py    listener and filter chain choice, as Envoy picks them for a connection
    match.py       Envoy's string, header, query and path matchers
    http.py        route config -> virtual host -> route -> action
    upstream.py    the chosen clusters: TLS mode and endpoints
    result.py      the answer, its outcome and its dict form for `-o json`
    simulator.py   the walk that ties them together
    grpc.py        the same walk for a proxyless gRPC call: listener by target, gRPC status codes
"""

from __future__ import annotations

from meshctl.simulate.request import Request, parse_request
from meshctl.simulate.result import Outcome, Simulation
from meshctl.simulate.simulator import Target, simulate

__all__ = ["Outcome", "Request", "Simulation", "Target", "parse_request", "simulate"]
