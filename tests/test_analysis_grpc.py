"""validate for proxyless gRPC workloads: a VirtualService or DestinationRule field gRPC ignores
is a warning naming the field (MC0010), an AuthorizationPolicy or RequestAuthentication a gRPC
server cannot enforce is an error (MC0011); workloads are gRPC by Istio's injection annotation."""

from __future__ import annotations

import pytest

from meshctl.config.analysis import analyze
from meshctl.config.findings import Severity
from meshctl.testing.builders import configs_from_yaml

GRPC_CLIENT = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: client
  namespace: shop
  annotations: {inject.istio.io/templates: grpc-agent}
spec: {address: 10.0.0.9, labels: {app: client}}
"""
ENVOY_CLIENT = GRPC_CLIENT.replace("  annotations: {inject.istio.io/templates: grpc-agent}\n", "")
SERVICE = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.0.0.1}]
"""
ROUTING = """---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.mesh]
  http:
  - match: [{headers: {x-canary: {exact: "1"}}}, {queryParams: {v: {exact: "2"}}}]
    rewrite: {uri: /v2}
    retries: {attempts: 2, retryOn: "5xx,unavailable"}
    timeout: 2s
    route: [{destination: {host: echo.shop.mesh}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: shop}
spec:
  host: echo.shop.mesh
  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    connectionPool: {http: {http2MaxRequests: 10}}
    tls: {mode: ISTIO_MUTUAL}
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy: {tls: {mode: SIMPLE}}
"""
JWT_POLICY = """---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: jwt, namespace: shop}
spec:
  selector: {matchLabels: {app: client}}
  rules: [{from: [{source: {requestPrincipals: ["issuer/*"]}}], to: [{operation: {paths: [/pkg.Echo/Say]}}]}]
"""


def findings(text: str, code: str) -> dict[str, tuple[Severity, str]]:
    issues = analyze(configs_from_yaml(text), known_hosts=["echo.shop.mesh"])
    return {f"{i.key.kind}/{'.'.join(map(str, i.path))}": (i.severity, i.message) for i in issues if i.code == code}


def test_fields_grpc_ignores_are_warned_by_name_for_a_grpc_client() -> None:
    found = findings(GRPC_CLIENT + SERVICE + ROUTING, "MC0010")
    assert set(found) == {
        "VirtualService/spec.http.0.match.1.queryParams",
        "VirtualService/spec.http.0.rewrite",
        "VirtualService/spec.http.0.retries.retryOn",
        "DestinationRule/spec.trafficPolicy.loadBalancer.simple",
        "DestinationRule/spec.subsets.0.trafficPolicy.tls.mode",
    }
    severity, message = found["VirtualService/spec.http.0.retries.retryOn"]
    assert severity is Severity.WARNING
    assert "WorkloadEntry shop/client" in message and "5xx" in message and "unavailable" in message
    assert "calls fail UNAVAILABLE" in found["DestinationRule/spec.subsets.0.trafficPolicy.tls.mode"][1]
    # The same rules for an Envoy client: nothing to say.
    assert findings(ENVOY_CLIENT + SERVICE + ROUTING, "MC0010") == {}


def test_a_rule_not_exported_to_the_grpc_clients_namespace_is_not_theirs() -> None:
    private = ROUTING.replace("  hosts: [echo.shop.mesh]\n", "  hosts: [echo.shop.mesh]\n  exportTo: [.]\n")
    moved = GRPC_CLIENT.replace("namespace: shop", "namespace: web")
    assert set(findings(moved + SERVICE + private, "MC0010")) == {
        "DestinationRule/spec.trafficPolicy.loadBalancer.simple",
        "DestinationRule/spec.subsets.0.trafficPolicy.tls.mode",
    }


CLAIM_POLICY = JWT_POLICY.replace(
    '{from: [{source: {requestPrincipals: ["issuer/*"]}}]', "{when: [{key: 'request.auth.claims[group]', values: [a]}]"
)
CUSTOM_POLICY = """---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec:
  selector: {matchLabels: {app: client}}
  action: CUSTOM
  provider: {name: ext}
  rules: [{to: [{operation: {paths: [/pkg.Echo/Say]}}]}]
"""


@pytest.mark.parametrize(
    ("policy", "path"),
    [
        (JWT_POLICY, "AuthorizationPolicy/spec.rules.0.from.0.source.requestPrincipals"),
        (CLAIM_POLICY, "AuthorizationPolicy/spec.rules.0.when.0.key"),
        (CUSTOM_POLICY, "AuthorizationPolicy/spec.action"),
    ],
)
def test_a_policy_a_grpc_server_cannot_enforce_is_refused(policy: str, path: str) -> None:
    found = findings(GRPC_CLIENT + SERVICE + policy, "MC0011")
    assert path in found, found
    assert found[path][0] is Severity.ERROR and "WorkloadEntry shop/client" in found[path][1]
    assert findings(ENVOY_CLIENT + SERVICE + policy, "MC0011") == {}


def test_permissive_for_a_grpc_server_is_warned_as_plaintext() -> None:
    peer = """---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: client, namespace: shop}
spec:
  selector: {matchLabels: {app: client}}
  mtls: {mode: PERMISSIVE}
  portLevelMtls: {7070: {mode: STRICT}}
"""
    found = findings(GRPC_CLIENT + SERVICE + peer, "MC0010")
    assert list(found) == ["PeerAuthentication/spec.mtls.mode"]
    assert "serves plaintext" in found["PeerAuthentication/spec.mtls.mode"][1]
    assert findings(ENVOY_CLIENT + SERVICE + peer, "MC0010") == {}
