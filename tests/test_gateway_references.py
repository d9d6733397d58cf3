"""A VirtualService names its Gateways in any of Istio's forms, and every reader (validation,
analysis, the Sidecar scope, HTTP and TCP generation) reads them alike (resolveGatewayName)."""

from __future__ import annotations

import pytest
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from meshctl.config.analysis import analyze
from meshctl.config.references import resolve_gateway_name
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.builders import configs_from_yaml, proxy_for, snapshot_from_yaml
from meshctl.xds.listeners import build_listeners
from meshctl.xds.routes import build_routes

ROUTER = "router~10.0.0.20~edge.edge~edge.svc.cluster.local"


@pytest.mark.parametrize(
    ("ref", "namespace", "resolved"),
    [
        ("gw", "shop", "shop/gw"),
        ("./gw", "shop", "shop/gw"),
        ("edge/gw", "shop", "edge/gw"),
        ("gw.edge.svc.cluster.local", "shop", "edge/gw"),
        ("gw.edge", "shop", "edge/gw"),
        ("mesh", "shop", "mesh"),
    ],
)
def test_resolve_gateway_name_as_istio(ref: str, namespace: str, resolved: str) -> None:
    """Istio's resolveGatewayName (pilot/pkg/model/virtualservice.go)."""
    assert resolve_gateway_name(ref, namespace) == resolved


def mesh(ref: str) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: edge, namespace: edge}}
spec: {{address: 10.0.0.20, labels: {{istio: edge}}}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: edge}}
spec:
  selector: {{istio: edge}}
  servers:
  - port: {{number: 5432, name: tcp, protocol: TCP}}
    hosts: ["*"]
  - port: {{number: 8080, name: http, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: db, namespace: shop}}
spec:
  hosts: [db.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 5432, name: tcp, protocol: TCP}}, {{number: 80, name: http, protocol: HTTP}}]
  endpoints: [{{address: 10.0.0.9}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: db, namespace: shop}}
spec:
  hosts: ["*"]
  gateways: ["{ref}"]
  tcp: [{{match: [{{port: 5432}}], route: [{{destination: {{host: db.shop.mesh, port: {{number: 5432}}}}}}]}}]
  http: [{{route: [{{destination: {{host: db.shop.mesh, port: {{number: 80}}}}}}]}}]
"""


@pytest.mark.parametrize("ref", ["edge/gw", "gw.edge.svc.cluster.local", "gw.edge"])
def test_every_form_binds_tcp_and_http_routes_at_the_gateway(ref: str) -> None:
    snapshot = snapshot_from_yaml(mesh(ref))
    scope = ProxyScope(snapshot, proxy_for(snapshot, ROUTER))
    listeners = {listener.name: listener for listener in build_listeners(scope)}
    tcp = listeners["0.0.0.0_5432"]
    filters = [f.typed_config for chain in tcp.filter_chains for f in chain.filters]
    proxies = [f for f in filters if f.Is(tcp_proxy_pb2.TcpProxy.DESCRIPTOR)]
    assert proxies, f"no TCP route at the gateway for {ref}"
    config = tcp_proxy_pb2.TcpProxy()
    proxies[0].Unpack(config)
    assert config.cluster == "outbound|5432||db.shop.mesh"
    routes = {r.name: r for r in build_routes(scope)}
    actions = [route.route.cluster for vh in routes["http.8080"].virtual_hosts for route in vh.routes]
    assert "outbound|80||db.shop.mesh" in actions
    assert [i for i in analyze(configs_from_yaml(mesh(ref))) if i.code == "IST0101"] == []


@pytest.mark.parametrize(
    ("export", "owner", "seen_from", "visible"),
    [
        ((), "shop", "other", True),
        (("*",), "shop", "other", True),
        ((".",), "shop", "shop", True),
        ((".",), "shop", "other", False),
        (("other",), "shop", "other", True),
        (("other",), "shop", "shop", False),
        ((".", "other"), "shop", "third", False),
    ],
)
def test_export_to_is_read_one_way(export: tuple[str, ...], owner: str, seen_from: str, visible: bool) -> None:
    """Istio's exportTo, read by the registry, the snapshot index and analysis through one
    function: `*` or nothing is everywhere, `.` its own namespace, else the namespaces listed."""
    from meshctl.config.references import is_exported

    assert is_exported(frozenset(export), owner, seen_from) is visible
