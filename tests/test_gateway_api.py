"""The Gateway API's translation into Istio Gateways and VirtualServices, read as Istio's own
conversion writes it (cases after pilot/pkg/config/kube/gateway/testdata): names, hosts, the
order of routes, filters, backends, and the status conditions of what does not attach."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config.gateway_api import translate
from meshctl.config.gateway_api.reader import seconds
from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.model import Config, ConfigKey
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import build_snapshot
from meshctl.testing.builders import configs_from_yaml

runner = CliRunner()

SERVICES = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: default}
spec:
  hosts: [httpbin.default.svc.cluster.local, httpbin-second.default.svc.cluster.local,
          httpbin-mirror.default.svc.cluster.local, httpbin-wildcard.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: other}
spec:
  hosts: [db.other.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
---
"""

GATEWAY = """apiVersion: gateway.networking.k8s.io/v1beta1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: gateway, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: default
    hostname: "*.domain.example"
    port: 80
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
"""

ROUTES = """apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: http, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: ["first.domain.example", "another.domain.example"]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /get}
      headers: [{name: my-header, value: some-value, type: Exact}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add: [{name: my-added-header, value: added-value}]
        remove: [my-removed-header]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add: [{name: my-added-resp-header, value: added-resp-value}]
        remove: [my-removed-header]
    backendRefs: [{name: httpbin, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: http2, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: ["second.domain.example"]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{name: httpbin-wildcard, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /second}}]
    backendRefs: [{name: httpbin-second, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: redirect, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  rules:
  - filters:
    - type: RequestRedirect
      requestRedirect:
        port: 8080
        statusCode: 302
        scheme: https
        path: {type: ReplaceFullPath, replaceFullPath: /replace-full}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: rewrite, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  rules:
  - name: route1
    matches: [{path: {type: PathPrefix, value: /prefix-original}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: new.example.com, path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement}}
    backendRefs: [{name: httpbin, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /prefix-to-be-removed}}]
    filters:
    - type: URLRewrite
      urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: ""}}
    backendRefs: [{name: httpbin, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /full-original}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: new.example.com, path: {type: ReplaceFullPath, replaceFullPath: /replacement}}
    backendRefs: [{name: httpbin, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: mirror, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  rules:
  - filters:
    - type: RequestMirror
      requestMirror: {fraction: {numerator: 4, denominator: 8}, backendRef: {name: httpbin-mirror, port: 80}}
    - type: RequestMirror
      requestMirror: {percent: 80, backendRef: {name: httpbin-second, port: 80}}
    backendRefs: [{name: httpbin, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: http-retry-request, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: ["retry.domain.example"]
  rules:
  - matches: [{path: {type: PathPrefix, value: /explicit}}]
    backendRefs: [{name: httpbin, port: 80}]
    retry: {attempts: 3, backoff: 3ms, codes: [503, 429]}
    timeouts: {request: 2ms, backendRequest: 1ms}
  - matches: [{path: {type: PathPrefix, value: /empty}}]
    backendRefs: [{name: httpbin, port: 80}]
    retry: {}
  - matches: [{path: {type: PathPrefix, value: /disable}}]
    backendRefs: [{name: httpbin, port: 80}]
    retry: {attempts: 0}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: http-not-selected, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: ["should.not.select"]
  rules:
  - backendRefs: [{name: httpbin, port: 80}]
"""

GW = "istio-system/gateway-istio-autogenerated-k8s-gateway-default"
D = {"host": "httpbin.default.svc.cluster.local", "port": {"number": 80}}


def _translated(text: str) -> tuple[dict[str, dict[str, Any]], Any]:
    result = translate(configs_from_yaml(text))
    specs = {f"{c.kind} {c.namespace}/{c.name}": json_format.MessageToDict(c.spec) for c in result.configs}
    return specs, result


def vs(host: str) -> str:
    return f"VirtualService default/istio-system~gateway-istio-autogenerated-k8s-gateway-default~{host}"


@pytest.fixture(scope="module")
def http() -> tuple[dict[str, dict[str, Any]], Any]:
    return _translated(SERVICES + GATEWAY + ROUTES)


def test_each_listener_is_an_istio_gateway_bound_by_the_gateway_name_label(http: Any) -> None:
    specs, _ = http
    assert specs["Gateway istio-system/gateway-istio-autogenerated-k8s-gateway-default"] == {
        "selector": {"gateway.networking.k8s.io/gateway-name": "gateway"},
        "servers": [{"port": {"number": 80, "protocol": "HTTP", "name": "default"}, "hosts": ["*/*.domain.example"]}],
    }


def test_one_virtual_service_per_host_and_none_for_a_host_the_listener_does_not_take(http: Any) -> None:
    specs, result = http
    assert sorted(k for k in specs if k.startswith("VirtualService")) == sorted(
        vs(h)
        for h in (
            "*",
            "another.domain.example",
            "first.domain.example",
            "retry.domain.example",
            "second.domain.example",
        )
    )
    assert specs[vs("first.domain.example")]["gateways"] == [GW]
    (condition,) = [c for c in result.conditions if c.key.name == "http-not-selected"]
    assert (condition.type, condition.reason) == ("Accepted", "NoMatchingListenerHostname")


def test_header_modifiers_and_matches(http: Any) -> None:
    (route,) = http[0][vs("first.domain.example")]["http"]
    assert route == {
        "name": "default.http.0",
        "match": [{"uri": {"prefix": "/get"}, "headers": {"my-header": {"exact": "some-value"}}}],
        "headers": {
            "request": {"add": {"my-added-header": "added-value"}, "remove": ["my-removed-header"]},
            "response": {"add": {"my-added-resp-header": "added-resp-value"}, "remove": ["my-removed-header"]},
        },
        "route": [{"destination": D}],
    }


def test_routes_of_one_host_are_ordered_longest_path_first_and_matchless_last(http: Any) -> None:
    routes = http[0][vs("*")]["http"]
    assert [r["name"] for r in routes] == [
        "default.rewrite.1",
        "route1",
        "default.rewrite.2",
        "default.mirror.0",
        "default.redirect.0",
    ]
    second = http[0][vs("second.domain.example")]["http"]
    assert [r["match"][0]["uri"]["prefix"] for r in second] == ["/second", "/"]


def test_rewrites_redirects_and_mirrors(http: Any) -> None:
    routes = {r["name"]: r for r in http[0][vs("*")]["http"]}
    assert routes["default.rewrite.1"]["rewrite"] == {"uri": "/"}
    assert routes["route1"]["rewrite"] == {"uri": "/replacement", "authority": "new.example.com"}
    assert routes["default.rewrite.2"]["rewrite"] == {
        "authority": "new.example.com",
        "uriRegexRewrite": {"match": "/.*", "rewrite": "/replacement"},
    }
    assert routes["default.redirect.0"]["redirect"] == {
        "uri": "/replace-full",
        "port": 8080,
        "scheme": "https",
        "redirectCode": 302,
    }
    assert "route" not in routes["default.redirect.0"]
    mirrors = routes["default.mirror.0"]["mirrors"]
    assert [(m["destination"]["host"], m["percentage"]["value"]) for m in mirrors] == [
        ("httpbin-mirror.default.svc.cluster.local", 50.0),
        ("httpbin-second.default.svc.cluster.local", 80.0),
    ]


def test_retries_and_timeouts_as_istio_writes_them(http: Any) -> None:
    routes = {r["match"][0]["uri"]["prefix"]: r for r in http[0][vs("retry.domain.example")]["http"]}
    assert routes["/explicit"]["retries"] == {
        "attempts": 3,
        "backoff": "0.003s",
        "retryOn": "connect-failure,refused-stream,unavailable,cancelled,503,429",
    }
    assert routes["/explicit"]["timeout"] == "0.001s"
    assert routes["/empty"]["retries"] == {
        "attempts": 2,
        "retryOn": "connect-failure,refused-stream,unavailable,cancelled",
    }
    assert routes["/disable"]["retries"] == {}
    assert [r["match"][0]["uri"]["prefix"] for r in http[0][vs("retry.domain.example")]["http"]] == [
        "/explicit",
        "/disable",
        "/empty",
    ]


def test_synthetic_configs_point_at_the_gateway_api_document(http: Any) -> None:
    _, result = http
    made = {c.name: c for c in result.configs}
    text = SERVICES + GATEWAY
    written = text[: text.index("apiVersion: gateway.networking.k8s.io/v1beta1\nkind: Gateway\n")].count("\n") + 1
    assert made["gateway-istio-autogenerated-k8s-gateway-default"].source.line == written
    route = made["istio-system~gateway-istio-autogenerated-k8s-gateway-default~first.domain.example"]
    assert route.source.line == 1 + (SERVICES + GATEWAY).count("\n")
    assert route.annotations["internal.istio.io/parents"] == "HTTPRoute/http.default"


CROSS = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cross, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: [db.domain.example]
  rules:
  - backendRefs: [{name: db, namespace: other, port: 80}]
"""
GRANT = """---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: allow, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]
  to: [{group: "", kind: Service}]
"""


def test_a_cross_namespace_backend_without_a_reference_grant_is_refused_and_answers_500() -> None:
    specs, result = _translated(SERVICES + GATEWAY + CROSS)
    (condition,) = result.conditions
    assert (condition.key, condition.type, condition.reason) == (
        ConfigKey("HTTPRoute", "default", "cross"),
        "ResolvedRefs",
        "RefNotPermitted",
    )
    assert condition.path == ("spec", "rules", 0, "backendRefs", 0)
    (route,) = specs[vs("db.domain.example")]["http"]
    assert route["directResponse"] == {"status": 500} and "route" not in route


def test_a_reference_grant_lets_the_backend_in() -> None:
    specs, result = _translated(SERVICES + GATEWAY + CROSS + GRANT)
    assert result.conditions == ()
    (route,) = specs[vs("db.domain.example")]["http"]
    assert route["route"] == [{"destination": {"host": "db.other.svc.cluster.local", "port": {"number": 80}}}]


def test_validate_reports_the_condition_at_the_backend_ref(tmp_path: Any) -> None:
    (tmp_path / "mesh.yaml").write_text(SERVICES + GATEWAY + CROSS)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    line = next(x for x in result.output.splitlines() if "RefNotPermitted" in x)
    written = 8 + (SERVICES + GATEWAY).count("\n")
    assert f"mesh.yaml:{written}:" in line and "HTTPRoute default/cross" in line, line
    assert "spec.rules[0].backendRefs[0]" in line and "ResolvedRefs=False" in line


LISTENERS = """apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: ingress}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: secure.example.com
    tls: {mode: Terminate, certificateRefs: [{name: edge-cert}]}
  - name: passthrough
    port: 8443
    protocol: TLS
    tls: {mode: Passthrough}
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {kubernetes.io/metadata.name: default}}}}
  - {name: tcp, port: 9000, protocol: TCP, allowedRoutes: {namespaces: {from: All}}}
  - {name: udp, port: 53, protocol: UDP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: same, namespace: ingress}
spec:
  parentRefs: [{name: edge, sectionName: https}]
  hostnames: [secure.example.com]
  rules: [{backendRefs: [{name: httpbin, namespace: default, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: elsewhere, namespace: default}
spec:
  parentRefs: [{name: edge, namespace: ingress, sectionName: http}]
  rules: [{backendRefs: [{name: httpbin, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: tls, namespace: default}
spec:
  parentRefs: [{name: edge, namespace: ingress}]
  hostnames: [db.example.com]
  rules: [{backendRefs: [{name: db, namespace: other, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: tcp, namespace: default}
spec:
  parentRefs: [{name: edge, namespace: ingress, port: 9000}]
  rules: [{backendRefs: [{name: httpbin, port: 80, weight: 3}, {name: httpbin-second, port: 80, weight: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: ingress, namespace: default}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: ingress}]
  to: [{group: "", kind: Service, name: httpbin}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: tls, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: TLSRoute, namespace: default}]
  to: [{group: "", kind: Service}]
"""


@pytest.fixture(scope="module")
def listeners() -> tuple[dict[str, dict[str, Any]], Any]:
    return _translated(SERVICES + LISTENERS)


def test_listener_protocols_become_servers(listeners: Any) -> None:
    specs, _ = listeners
    servers = {k.split("-")[-1]: v["servers"][0] for k, v in specs.items() if k.startswith("Gateway ")}
    assert servers["http"]["hosts"] == ["ingress/*"]
    assert servers["https"]["tls"] == {"mode": "SIMPLE", "credentialName": "kubernetes-gateway://ingress/edge-cert"}
    assert servers["https"]["hosts"] == ["ingress/secure.example.com"]
    assert servers["passthrough"] == {
        "port": {"number": 8443, "protocol": "TLS", "name": "passthrough"},
        "hosts": ["default/*"],
        "tls": {},  # mode PASSTHROUGH, the enum's zero value
    }
    assert servers["tcp"]["hosts"] == ["*/*"]
    assert "udp" not in servers


def test_routes_bind_by_section_namespace_and_kind(listeners: Any) -> None:
    specs, result = listeners
    prefix = "ingress~edge-istio-autogenerated-k8s-gateway"
    assert specs[f"VirtualService ingress/{prefix}-https~secure.example.com"]["http"][0]["route"] == [
        {"destination": D}
    ]
    assert specs[f"VirtualService default/{prefix}-passthrough~db.example.com"]["tls"] == [
        {
            "match": [{"sniHosts": ["db.example.com"]}],
            "route": [{"destination": {"host": "db.other.svc.cluster.local", "port": {"number": 80}}}],
        }
    ]
    tcp = specs[f"VirtualService default/{prefix}-tcp~*"]["tcp"][0]["route"]
    assert [(r["destination"]["host"], r["weight"]) for r in tcp] == [
        ("httpbin.default.svc.cluster.local", 3),
        ("httpbin-second.default.svc.cluster.local", 1),
    ]
    found = {(c.key.name, c.type, c.reason) for c in result.conditions}
    assert found == {
        ("edge", "Accepted", "UnsupportedProtocol"),
        ("elsewhere", "Accepted", "NotAllowedByListeners"),
    }
    assert {(a.route.name, a.listener) for a in result.attachments} == {
        ("same", "https"),
        ("tls", "passthrough"),
        ("tcp", "tcp"),
    }


GRPC = """apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc, namespace: default}
spec:
  parentRefs: [{name: gateway, namespace: istio-system}]
  hostnames: [grpc.domain.example]
  rules:
  - matches:
    - method: {service: helloworld.Greeter, method: SayHello}
    - method: {service: helloworld.Greeter}
    - method: {method: SayBye}
      headers: [{name: x-version, value: "v[0-9]", type: RegularExpression}]
    backendRefs: [{name: httpbin, port: 80}]
"""


def test_grpc_method_matches_become_paths() -> None:
    specs, _ = _translated(SERVICES + GATEWAY + GRPC)
    routes = specs[vs("grpc.domain.example")]["http"]
    assert [r["match"][0] for r in routes] == [
        {"uri": {"exact": "/helloworld.Greeter/SayHello"}},
        {"uri": {"prefix": "/helloworld.Greeter/"}},
        {"uri": {"regex": "/[^/]+/SayBye"}, "headers": {"x-version": {"regex": "v[0-9]"}}},
    ]


MESH = """apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: httpbin, port: 80}, {group: "", kind: Service, name: nothing}]
  rules: [{backendRefs: [{name: httpbin-second, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: consumer, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: db, namespace: other}]
  rules: [{backendRefs: [{name: httpbin, namespace: default, port: 80}]}]
"""


def test_a_route_whose_parent_is_a_service_is_that_host_s_mesh_virtual_service() -> None:
    specs, result = _translated(SERVICES + MESH)
    producer = specs["VirtualService default/default~mesh~httpbin.default.svc.cluster.local"]
    assert producer["gateways"] == ["mesh"] and producer["hosts"] == ["httpbin.default.svc.cluster.local"]
    assert producer["http"][0]["match"] == [{"port": 80}]
    assert "exportTo" not in producer
    consumer = specs["VirtualService shop/shop~mesh~db.other.svc.cluster.local"]
    assert consumer["exportTo"] == ["."]
    reasons = {(c.key.name, c.reason) for c in result.conditions}
    assert reasons == {("reviews", "NoMatchingParent"), ("consumer", "RefNotPermitted")}


def test_the_snapshot_built_on_a_change_equals_a_full_build() -> None:
    configs = configs_from_yaml(SERVICES + GATEWAY + ROUTES)
    first = build_snapshot(configs, build_file_model(configs))
    first.index  # noqa: B018 - an indexed snapshot is a base for the next
    changed = [c for c in configs if c.key.name != "http2"]
    removed = {ConfigKey("HTTPRoute", "default", "http2")}
    after = build_snapshot(changed, build_file_model(changed), previous=first, changed=removed)
    full = build_snapshot(changed, build_file_model(changed))
    assert after.version == full.version
    assert vs("second.domain.example") not in {f"{k.kind} {k.namespace}/{k.name}" for k in after.configs}
    assert set(after.configs) == set(full.configs)


def test_a_config_set_without_the_gateway_api_is_left_as_it_is() -> None:
    configs = configs_from_yaml(SERVICES)
    snapshot = build_snapshot(configs, build_file_model(configs))
    assert set(snapshot.configs) == {c.key for c in configs} and snapshot.gateway_api.conditions == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listeners: [{name: a, port: 80, protocol: HTTPS}]", "an HTTPS listener needs tls.mode Terminate"),
        ("listeners: [{name: a, port: 0, protocol: HTTP}]", "must be a whole number from 1 to 65535"),
        ("listeners: [{name: A_b, port: 80, protocol: HTTP}]", "invalid listener name"),
        ("listeners: []", "a Gateway needs at least one listener"),
    ],
)
def test_gateway_api_validation_names_the_field(text: str, message: str) -> None:
    head = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g}\n"
    doc = f"{head}spec:\n  gatewayClassName: istio\n  {text}\n"
    result = load_text(doc, "gw.yaml", LoadOptions())
    assert not result.ok
    assert any(message in f.message and f.line >= 6 for f in result.findings), result.findings


def test_durations() -> None:
    assert (seconds("1h30m"), seconds("500ms"), seconds("10s"), seconds("1.5s")) == (5400.0, 0.5, 10.0, None)


def test_keys_keep_the_gateway_api_gateway_apart_from_istio_s() -> None:
    configs: list[Config] = configs_from_yaml(GATEWAY)
    assert {c.kind for c in configs} == {"GatewayClass", "KubernetesGateway"}


def test_dump_of_a_gateway_says_which_routes_attached_to_which_listener(tmp_path: Any) -> None:
    router = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: gateway-vm, namespace: istio-system}
spec:
  address: 10.0.0.5
  labels: {gateway.networking.k8s.io/gateway-name: gateway}
"""
    (tmp_path / "mesh.yaml").write_text(SERVICES + GATEWAY + ROUTES + router)
    args = [
        "dump",
        "--config-dir",
        str(tmp_path),
        "--proxy",
        "router~10.0.0.5~gateway-vm.istio-system~x",
        "-t",
        "routes",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    note = next(x for x in result.output.splitlines() if x.startswith("note: Gateway API"))
    assert note.startswith("note: Gateway API: Gateway istio-system/gateway listener default (port 80) takes ")
    assert "HTTPRoute default/http (first.domain.example, another.domain.example)" in note
    assert "HTTPRoute default/http-not-selected" not in note


def test_the_last_gateway_api_resource_removed_takes_its_translation_with_it() -> None:
    configs = configs_from_yaml(SERVICES + GATEWAY + ROUTES)
    first = build_snapshot(configs, build_file_model(configs))
    first.index  # noqa: B018 - an indexed snapshot is a base for the next
    kept = [c for c in configs if c.kind == "ServiceEntry"]
    gone = {c.key for c in configs if c.kind != "ServiceEntry"}
    after = build_snapshot(kept, build_file_model(kept), previous=first, changed=gone)
    assert set(after.configs) == {c.key for c in kept}
    assert after.version == build_snapshot(kept, build_file_model(kept)).version


ROUTE_HEAD = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n"


@pytest.mark.parametrize(
    ("rule", "message", "field"),
    [
        (
            "  - filters: [{type: RequestRedirect, requestRedirect: {statusCode: 302}}]\n"
            "    backendRefs: [{name: a, port: 80}]\n",
            "cannot have backendRefs",
            "spec.rules[0].backendRefs",
        ),
        (
            "  - filters: [{type: RequestMirror, requestMirror: {percent: 150, backendRef: {name: a, port: 80}}}]\n",
            "must be a whole number from 0 to 100",
            "spec.rules[0].filters[0].requestMirror.percent",
        ),
        ("  - retry: {codes: [200]}\n", "a retry code is an HTTP status", "spec.rules[0].retry.codes[0]"),
        ("  - timeouts: {request: 5 seconds}\n", "invalid duration", "spec.rules[0].timeouts.request"),
    ],
)
def test_route_validation_names_the_field(rule: str, message: str, field: str) -> None:
    result = load_text(ROUTE_HEAD + rule, "route.yaml", LoadOptions())
    assert not result.ok
    assert any(message in f.message and f.field == field for f in result.findings), result.findings


def test_validate_of_a_rejected_route_reports_its_errors_and_no_traceback(tmp_path: Any) -> None:
    broken = ROUTE_HEAD.replace("  rules:\n", "  parentRefs: [{name: gateway, namespace: istio-system}]\n  rules:\n")
    broken += "  - retry: {attempts: [1]}\n    backendRefs: [{name: httpbin, port: 80}]\n"
    (tmp_path / "mesh.yaml").write_text(SERVICES + GATEWAY + broken)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "spec.rules[0].retry.attempts" in result.output and "Traceback" not in result.output
