"""EnvoyFilter patches: pilot's envoyfilter test cases (cluster_patch_test, rc_patch_test,
listener_patch_test), restated as EnvoyFilter YAML applied by `apply_envoy_filters` to the same
input resources, expecting the same patched result.

Each case loads its EnvoyFilter through the loader (so validation runs), binds a proxy in a
snapshot (so selection runs) and patches resources written as protobuf JSON.
"""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401  # registers UpstreamTlsContext
from google.protobuf import json_format
from google.protobuf.message import Message
from udpa.type.v1 import typed_struct_pb2  # noqa: F401  # registers TypedStruct

from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.xds import types
from meshctl.xds.envoyfilter import apply_envoy_filters

SIDECAR = "sidecar~10.0.0.99~client.not-default~not-default.svc.cluster.local"
ROUTER = "router~10.0.0.98~gw.not-default~not-default.svc.cluster.local"


def _filter(patches: str, namespace: str = "istio-system", name: str = "patches", extra: str = "") -> str:
    return f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: {name}, namespace: {namespace}}}
spec:
{extra}  configPatches:
{patches}
"""


def _parse(cls: type[Message], data: dict[str, Any]) -> Any:
    return json_format.ParseDict(data, cls())


_TYPES = {"clusters": types.CLUSTER, "listeners": types.LISTENER, "routes": types.ROUTE}


def _patched(yaml: str, node: str, **by_type: list[Message]) -> dict[str, list[Any]]:
    snapshot = snapshot_from_yaml(yaml)
    proxy = proxy_for(snapshot, node)
    config = {
        t: tuple(by_type.get(k, []))
        for k, t in (("clusters", types.CLUSTER), ("listeners", types.LISTENER), ("routes", types.ROUTE))
    }
    out = apply_envoy_filters(config, proxy)
    return {
        "clusters": list(out[types.CLUSTER]),
        "listeners": list(out[types.LISTENER]),
        "routes": list(out[types.ROUTE]),
    }


def _json(messages: list[Any]) -> list[dict[str, Any]]:
    return [json_format.MessageToDict(m, preserving_proto_field_name=True) for m in messages]


# --- clusters (cluster_patch_test.go, TestClusterPatching) ---------------------------------

CLUSTER_PATCHES = """\
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: new-cluster1}}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: new-cluster2}}
  - applyTo: CLUSTER
    match: {context: GATEWAY, cluster: {service: gateway.com}}
    patch: {operation: REMOVE}
  - applyTo: CLUSTER
    match: {context: SIDECAR_INBOUND, cluster: {portNumber: 9999}}
    patch: {operation: REMOVE}
  - applyTo: CLUSTER
    match: {context: ANY}
    patch: {operation: MERGE, value: {dns_lookup_family: V6_ONLY}}
  - applyTo: CLUSTER
    match: {context: ANY}
    patch: {operation: MERGE, value: {lb_policy: RING_HASH}}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {portNumber: 443}}
    patch:
      operation: MERGE
      value:
        transport_socket:
          name: envoy.transport_sockets.tls
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
            common_tls_context: {tls_params: {tls_minimum_protocol_version: TLSv1_3}}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {portNumber: 7777}}
    patch:
      operation: MERGE
      value:
        transport_socket:
          name: transport_sockets.alts
          typed_config:
            "@type": type.googleapis.com/udpa.type.v1.TypedStruct
            type_url: type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts
            value: {handshaker_service: 1.2.3.4}
"""

_H2 = {"http2_protocol_options": {"allow_connect": True, "allow_metadata": True}}
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_ALTS = {
    "name": "transport_sockets.alts",
    "typed_config": {
        "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
        "type_url": "type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts",
        "value": {"handshaker_service": "1.2.3.4"},
    },
}


def _tls(params: dict[str, Any], provider: bool = True) -> dict[str, Any]:
    context: dict[str, Any] = {"tls_params": params}
    if provider:
        context["tls_certificate_certificate_provider_instance"] = {
            "instance_name": "instance",
            "certificate_name": "certificate",
        }
    return {"name": "envoy.transport_sockets.tls", "typed_config": {"@type": _TLS, "common_tls_context": context}}


def _clusters(items: list[dict[str, Any]]) -> list[Any]:
    return [_parse(cluster_pb2.Cluster, c) for c in items]


def test_sidecar_outbound_cluster_patch() -> None:
    v11 = {"ecdh_curves": ["X25519"], "tls_minimum_protocol_version": "TLSv1_1"}
    given = _clusters(
        [
            {"name": "outbound|443||cluster1", "dns_lookup_family": "V4_ONLY", "lb_policy": "ROUND_ROBIN",
             "transport_socket_matches": [{"name": "tlsMode-istio", "transport_socket": _tls(v11)}]},
            {"name": "outbound|443||cluster2", **_H2,
             "lb_policy": "MAGLEV"},
            {"name": "outbound|443||cluster3", "dns_lookup_family": "V4_ONLY", "lb_policy": "ROUND_ROBIN",
             "transport_socket": _tls({"ecdh_curves": ["X25519"], "tls_maximum_protocol_version": "TLSv1_3"})},
            {"name": "outbound|7777||custom-tls-addition"},
            {"name": "outbound|7777||custom-tls-replacement", "dns_lookup_family": "V4_ONLY",
             "lb_policy": "ROUND_ROBIN", "transport_socket": _tls(v11)},
            {"name": "outbound|7777||custom-tls-replacement-tsm", "dns_lookup_family": "V4_ONLY",
             "lb_policy": "ROUND_ROBIN",
             "transport_socket_matches": [{"name": "tlsMode-istio", "transport_socket": _tls(v11)}]},
        ]
    )  # fmt: skip
    v6 = {"dns_lookup_family": "V6_ONLY", "lb_policy": "RING_HASH"}
    v13 = {"tls_minimum_protocol_version": "TLSv1_3"}
    want = _clusters(
        [
            {"name": "outbound|443||cluster1", **v6, "transport_socket_matches": [
                {"name": "tlsMode-istio", "transport_socket": _tls({**v11, **v13})}]},
            {"name": "outbound|443||cluster2", **_H2,
             **v6, "transport_socket": _tls({"tls_minimum_protocol_version": "TLSv1_3"}, provider=False)},
            {"name": "outbound|443||cluster3", **v6, "transport_socket": _tls(
                {"ecdh_curves": ["X25519"], "tls_minimum_protocol_version": "TLSv1_3",
                 "tls_maximum_protocol_version": "TLSv1_3"})},
            {"name": "outbound|7777||custom-tls-addition", **v6, "transport_socket": _ALTS},
            {"name": "outbound|7777||custom-tls-replacement", **v6, "transport_socket": _ALTS},
            {"name": "outbound|7777||custom-tls-replacement-tsm", **v6,
             "transport_socket_matches": [{"name": "tlsMode-istio", "transport_socket": _tls(v11)}]},
            {"name": "new-cluster1"},
            {"name": "new-cluster2"},
        ]
    )  # fmt: skip
    got = _patched(_filter(CLUSTER_PATCHES), SIDECAR, clusters=given)["clusters"]
    assert _json(got) == _json(want)


def test_sidecar_inbound_cluster_patch() -> None:
    given = _clusters(
        [
            {"name": "cluster1", "dns_lookup_family": "V4_ONLY", "lb_policy": "ROUND_ROBIN"},
            {"name": "inbound|9999||mgmtCluster"},
        ]
    )
    # cluster1 is no inbound| cluster, so it is patched in the outbound context, where it also
    # gets the ADDs; pilot patches each list in the context it builds it in.
    got = _patched(_filter(CLUSTER_PATCHES), SIDECAR, clusters=given)["clusters"]
    names = [c.name for c in got]
    assert "inbound|9999||mgmtCluster" not in names
    assert _json(got[:1]) == _json(
        _clusters([{"name": "cluster1", "dns_lookup_family": "V6_ONLY", "lb_policy": "RING_HASH"}])
    )


SERVICE_MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: service, namespace: servicens}
spec:
  hosts: [service.servicens]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7443, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: service}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: service-1, namespace: servicens}
spec: {address: 10.0.0.99, labels: {app: service}}
---
"""


def test_sidecar_inbound_cluster_patch_with_service_name() -> None:
    patch = """\
  - applyTo: CLUSTER
    match: {context: SIDECAR_INBOUND, cluster: {service: service.servicens}}
    patch: {operation: MERGE, value: {type: EDS}}
  - applyTo: CLUSTER
    match: {context: ANY}
    patch: {operation: MERGE, value: {dns_lookup_family: V6_ONLY, lb_policy: RING_HASH}}
"""
    given = _clusters([{"name": "inbound|7443||", "dns_lookup_family": "V4_ONLY", "lb_policy": "ROUND_ROBIN"}])
    got = _patched(SERVICE_MESH + _filter(patch), SIDECAR, clusters=given)["clusters"]
    want = [{"name": "inbound|7443||", "type": "EDS", "dns_lookup_family": "V6_ONLY", "lb_policy": "RING_HASH"}]
    assert _json(got) == _json(_clusters(want))


def test_gateway_cds_patch() -> None:
    given = _clusters(
        [
            {"name": "cluster1", "dns_lookup_family": "V4_ONLY", "lb_policy": "ROUND_ROBIN"},
            {"name": "cluster2", **_H2,
             "lb_policy": "MAGLEV"},
            {"name": "outbound|443||gateway.com"},
        ]
    )  # fmt: skip
    want = _clusters(
        [
            {"name": "cluster1", "dns_lookup_family": "V6_ONLY", "lb_policy": "RING_HASH"},
            {"name": "cluster2", **_H2,
             "lb_policy": "RING_HASH", "dns_lookup_family": "V6_ONLY"},
        ]
    )  # fmt: skip
    got = _patched(_filter(CLUSTER_PATCHES), ROUTER, clusters=given)["clusters"]
    assert _json(got) == _json(want)


@pytest.mark.parametrize(
    ("match", "cluster", "hit"),
    [
        ("{name: scooby}", "scrappy", False),
        ("{portNumber: 80, service: foo.bar, subset: v1}", "outbound|80|v2|foo.bar", False),
        ("{portNumber: 80, service: foo.bar, subset: v1}", "outbound|80|v1|google.com", False),
        ("{portNumber: 80, service: foo.bar, subset: v1}", "outbound|90|v1|foo.bar", False),
        ("{portNumber: 80, service: foo.bar, subset: v1}", "outbound|80|v1|foo.bar", True),
    ],
)
def test_cluster_match(match: str, cluster: str, hit: bool) -> None:
    patch = f"""\
  - applyTo: CLUSTER
    match: {{cluster: {match}}}
    patch: {{operation: MERGE, value: {{lb_policy: MAGLEV}}}}
  - applyTo: CLUSTER
    patch: {{operation: MERGE, value: {{dns_lookup_family: V6_ONLY}}}}
"""
    (got,) = _patched(_filter(patch), SIDECAR, clusters=_clusters([{"name": cluster}]))["clusters"]
    assert got.dns_lookup_family == cluster_pb2.Cluster.V6_ONLY  # the patch without a match applies
    assert (got.lb_policy == cluster_pb2.Cluster.MAGLEV) is hit


# --- routes (rc_patch_test.go, TestApplyRouteConfigurationPatches) ------------------------

ROUTE_PATCHES = """\
  - applyTo: ROUTE_CONFIGURATION
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {portNumber: 80}}
    patch: {operation: MERGE, value: {request_headers_to_remove: [h3, h4]}}
  - applyTo: HTTP_ROUTE
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {portNumber: 80, vhost: {route: {action: ROUTE}}}}
    patch: {operation: MERGE, value: {route: {prefix_rewrite: /foo}}}
  - applyTo: HTTP_ROUTE
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {portNumber: 80, vhost: {route: {name: bar}}}}
    patch: {operation: REMOVE}
  - applyTo: VIRTUAL_HOST
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {vhost: {name: allow_any}}}
    patch: {operation: REMOVE}
  - applyTo: VIRTUAL_HOST
    patch: {operation: ADD, value: {name: new-vhost}}
  - applyTo: VIRTUAL_HOST
    match: {context: GATEWAY, routeConfiguration: {vhost: {name: vhost1}}}
    patch: {operation: REMOVE}
  - applyTo: VIRTUAL_HOST
    match: {context: SIDECAR_INBOUND, routeConfiguration: {vhost: {name: vhost2}}}
    patch: {operation: REMOVE}
  - applyTo: VIRTUAL_HOST
    match: {context: ANY}
    patch: {operation: MERGE, value: {domains: ["domain:80"]}}
  - applyTo: HTTP_ROUTE
    match: {context: ANY, routeConfiguration: {portNumber: 9090, vhost: {name: test.com}}}
    patch: {operation: ADD, value: {name: route4.0}}
  - applyTo: HTTP_ROUTE
    match: {context: ANY, routeConfiguration: {portNumber: 9090, vhost: {name: test.com}}}
    patch: {operation: INSERT_FIRST, value: {name: route0.0}}
  - applyTo: HTTP_ROUTE
    match: {context: ANY, routeConfiguration: {portNumber: 9090, vhost: {name: test.com, route: {name: route2.0}}}}
    patch: {operation: INSERT_AFTER, value: {name: route2.5}}
  - applyTo: HTTP_ROUTE
    match: {context: ANY, routeConfiguration: {portNumber: 9090, vhost: {name: test.com, route: {name: route2.0}}}}
    patch: {operation: INSERT_BEFORE, value: {name: route1.5}}
"""


def _rc(data: dict[str, Any]) -> Any:
    return _parse(route_pb2.RouteConfiguration, data)


def test_sidecar_outbound_rds_patch() -> None:
    given = _rc(
        {
            "name": "80",
            "virtual_hosts": [
                {
                    "name": "foo.com",
                    "domains": ["domain"],
                    "routes": [
                        {"name": "foo", "route": {"prefix_rewrite": "/"}},
                        {"name": "bar", "redirect": {"response_code": "MOVED_PERMANENTLY"}},
                    ],
                }
            ],
            "request_headers_to_remove": ["h1", "h2"],
        }
    )
    want = _rc(
        {
            "name": "80",
            "virtual_hosts": [
                {"name": "foo.com", "domains": ["domain", "domain:80"],
                 "routes": [{"name": "foo", "route": {"prefix_rewrite": "/foo"}}]},
                {"name": "new-vhost"},
            ],
            "request_headers_to_remove": ["h1", "h2", "h3", "h4"],
        }
    )  # fmt: skip
    got = _patched(_filter(ROUTE_PATCHES), SIDECAR, routes=[given])["routes"]
    assert _json(got) == _json([want])


def test_gateway_rds_patch() -> None:
    given = _rc(
        {
            "name": "80",
            "virtual_hosts": [{"name": "vhost1", "domains": ["domain"]}, {"name": "gateway", "domains": ["gateway"]}],
        }
    )
    want = _rc(
        {
            "name": "80",
            "virtual_hosts": [{"name": "gateway", "domains": ["gateway", "domain:80"]}, {"name": "new-vhost"}],
        }
    )
    got = _patched(_filter(ROUTE_PATCHES), ROUTER, routes=[given])["routes"]
    assert _json(got) == _json([want])


def test_array_insert_patch() -> None:
    r1 = {"name": "route1.0", "route": {"prefix_rewrite": "/"}}
    r2 = {"name": "route2.0", "redirect": {"response_code": "MOVED_PERMANENTLY"}}
    r3 = {"name": "route3.0", "redirect": {"response_code": "TEMPORARY_REDIRECT"}}
    given = _rc(
        {"name": "9090", "virtual_hosts": [{"name": "test.com", "domains": ["domain"], "routes": [r1, r2, r3]}]}
    )
    routes = [{"name": "route0.0"}, r1, {"name": "route1.5"}, r2, {"name": "route2.5"}, r3, {"name": "route4.0"}]
    want = _rc(
        {"name": "9090", "virtual_hosts": [{"name": "test.com", "domains": ["domain", "domain:80"], "routes": routes},
                                           {"name": "new-vhost"}]}
    )  # fmt: skip
    got = _patched(_filter(ROUTE_PATCHES), SIDECAR, routes=[given])["routes"]
    assert _json(got) == _json([want])


def _inbound_listener(route_config: dict[str, Any]) -> Any:
    hcm = _parse(hcm_pb2.HttpConnectionManager, {"stat_prefix": "inbound_0.0.0.0_80", "route_config": route_config,
                                                 "http_filters": [{"name": "envoy.filters.http.router"}]})  # fmt: skip
    listener = listener_pb2.Listener(name="virtualInbound", traffic_direction="INBOUND")
    chain = listener.filter_chains.add()
    f = chain.filters.add(name="envoy.filters.network.http_connection_manager")
    f.typed_config.Pack(hcm)
    return listener


def _inline_route(listener: Any) -> dict[str, Any]:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return json_format.MessageToDict(hcm.route_config, preserving_proto_field_name=True)


def test_sidecar_inbound_rc_patch() -> None:
    listener = _inbound_listener({"name": "inbound|http|80", "virtual_hosts": [{"name": "vhost2"}]})
    (got,) = _patched(_filter(ROUTE_PATCHES), SIDECAR, listeners=[listener])["listeners"]
    assert _inline_route(got) == {"name": "inbound|http|80", "virtual_hosts": [{"name": "new-vhost"}]}


def test_sidecar_inbound_vhost_replace() -> None:
    patch = """\
  - applyTo: VIRTUAL_HOST
    match: {context: SIDECAR_INBOUND, routeConfiguration: {vhost: {name: to-be-replaced}}}
    patch:
      operation: REPLACE
      value:
        name: replaced
        domains: [replaced.com]
        rate_limits: [{actions: [{request_headers: {header_name: ":path", descriptor_key: PATH}}]}]
"""
    listener = _inbound_listener(
        {"name": "inbound|http|80", "virtual_hosts": [{"name": "to-be-replaced", "domains": ["xxx"],
         "routes": [{"name": "xxx", "route": {"prefix_rewrite": "/xxx"}}]}]}
    )  # fmt: skip
    (got,) = _patched(_filter(patch), SIDECAR, listeners=[listener])["listeners"]
    assert _inline_route(got)["virtual_hosts"] == [
        {
            "name": "replaced",
            "domains": ["replaced.com"],
            "rate_limits": [{"actions": [{"request_headers": {"header_name": ":path", "descriptor_key": "PATH"}}]}],
        }
    ]


@pytest.mark.parametrize(
    ("match", "name", "gateway", "hit"),
    [
        ("{portNumber: 443, portName: app1, gateway: ns1/gw1}", "https.443.app1.gw1.ns1", True, True),
        ("{portNumber: 443, portName: app1, gateway: ns1/gw1}", "http.80", True, False),
        ("{portNumber: 9090}", "http.9090", True, True),
        ("{portNumber: 80}", "80", False, True),
        ("{portNumber: 80}", "8080", False, False),
        ("{name: http_proxy}", "http_proxy", False, True),
    ],
)
def test_route_configuration_match(match: str, name: str, gateway: bool, hit: bool) -> None:
    patch = f"""\
  - applyTo: ROUTE_CONFIGURATION
    match: {{routeConfiguration: {match}}}
    patch: {{operation: MERGE, value: {{request_headers_to_remove: [patched]}}}}
  - applyTo: ROUTE_CONFIGURATION
    patch: {{operation: MERGE, value: {{request_headers_to_add: [{{header: {{key: x-all, value: "1"}}}}]}}}}
"""
    (got,) = _patched(_filter(patch), ROUTER if gateway else SIDECAR, routes=[_rc({"name": name})])["routes"]
    assert [h.header.key for h in got.request_headers_to_add] == ["x-all"]  # the patch without a match
    assert (list(got.request_headers_to_remove) == ["patched"]) is hit


def test_cluster_adds_by_context() -> None:
    patches = """\
  - applyTo: CLUSTER
    patch: {operation: ADD, value: {name: any-context}}
  - applyTo: CLUSTER
    match: {context: SIDECAR_INBOUND}
    patch: {operation: ADD, value: {name: inbound-only}}
  - applyTo: CLUSTER
    match: {context: GATEWAY}
    patch: {operation: ADD, value: {name: gateway-only}}
  - applyTo: CLUSTER
    patch: {operation: ADD, value: {name: outbound|80||exists}}
"""
    given = _clusters([{"name": "outbound|80||exists", "lb_policy": "MAGLEV"}])
    sidecar = _patched(_filter(patches), SIDECAR, clusters=given)["clusters"]
    assert [c.name for c in sidecar] == ["outbound|80||exists", "any-context", "inbound-only"]
    assert sidecar[0].lb_policy == cluster_pb2.Cluster.MAGLEV  # an ADD never replaces a cluster
    gateway = _patched(_filter(patches), ROUTER, clusters=given)["clusters"]
    assert [c.name for c in gateway] == ["outbound|80||exists", "any-context", "gateway-only"]
