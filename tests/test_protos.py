"""Istio's networking and security schemas as generated protobuf: committed code is fresh, and
full-featured specs of every kind, written as users write them for Istio, parse without a single
issue (the security kinds meshctl does not serve yet included)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT
from google.protobuf.message import Message
from ruamel.yaml import YAML

from meshctl.config.model import GATEWAY_API_GROUP, KINDS, served_group, spec_class
from meshctl.config.schema import parse_spec


def test_committed_generated_code_matches_the_protos() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


VIRTUAL_SERVICE = """
hosts: [reviews.shop.mesh, "*.shop.example.com"]
gateways: [mesh, istio-system/edge]
exportTo: ["."]
http:
- name: canary
  match:
  - name: v2-users
    uri: {prefix: /api/}
    scheme: {exact: https}
    method: {regex: "GET|HEAD"}
    authority: {exact: reviews.shop.example.com}
    headers:
      x-user: {exact: beta}
    withoutHeaders:
      x-skip: {prefix: "1"}
    queryParams:
      debug: {exact: "on"}
    port: 9080
    sourceLabels: {app: productpage}
    sourceNamespace: shop
    gateways: [mesh]
    ignoreUriCase: true
    statPrefix: canary_users
  route:
  - destination: {host: reviews.shop.mesh, subset: v2, port: {number: 9080}}
    weight: 90
    headers:
      request:
        set: {x-canary: "true"}
        add: {x-trace: "1"}
        remove: [x-internal]
  - destination: {host: reviews.shop.mesh, subset: v1}
    weight: 10
  rewrite:
    uriRegexRewrite: {match: "^/api/(.*)", rewrite: "/\\\\1"}
    authority: reviews.internal
  timeout: 5s
  retries:
    attempts: 3
    perTryTimeout: 0.5s
    retryOn: 5xx,connect-failure,unavailable
    retryRemoteLocalities: true
    retryIgnorePreviousHosts: false
    backoff: 0.025s
  fault:
    delay: {fixedDelay: 2s, percentage: {value: 0.5}}
    abort: {httpStatus: 503, percentage: {value: 0.1}}
  mirror: {host: reviews-shadow.shop.mesh}
  mirror_percent: 20
  mirrorPercentage: {value: 12.5}
  mirrors:
  - destination: {host: audit.shop.mesh, port: {number: 80}}
    percentage: {value: 5}
  corsPolicy:
    allowOrigins: [{exact: "https://shop.example.com"}, {regex: "https://.*\\\\.example\\\\.com"}]
    allowOrigin: ["https://legacy.example.com"]
    allowMethods: [GET, POST]
    allowHeaders: [authorization]
    exposeHeaders: [x-request-id]
    maxAge: 86400s
    allowCredentials: true
    unmatchedPreflights: IGNORE
  headers:
    response:
      remove: [server]
- match: [{uri: {exact: /old}}]
  redirect: {uri: /new, authority: shop.example.com, derivePort: FROM_REQUEST_PORT, scheme: https, redirectCode: 308}
- match: [{uri: {prefix: /legacy/}}]
  redirect: {prefixRewrite: /v2/, port: 8443}
- match: [{uri: {exact: /healthz}}]
  directResponse: {status: 200, body: {string: ok}}
- match: [{uri: {exact: /blob}}]
  directResponse: {status: 200, body: {bytes: aGVsbG8=}}
- match: [{uri: {prefix: /ratings}}]
  delegate: {name: ratings-routes, namespace: ratings}
- fault:
    delay: {percent: 10, fixedDelay: 1s}
    abort: {grpcStatus: UNAVAILABLE}
  route: [{destination: {host: reviews.shop.mesh}}]
tls:
- match:
  - sniHosts: [secure.shop.example.com]
    port: 443
    destinationSubnets: [10.0.0.0/8]
    sourceLabels: {app: a}
    gateways: [mesh]
    sourceNamespace: shop
  route: [{destination: {host: secure.shop.mesh, port: {number: 8443}}, weight: 100}]
tcp:
- match:
  - port: 27017
    destinationSubnets: [10.1.0.0/16]
    sourceSubnet: 10.2.0.0/16
    sourceLabels: {app: b}
    gateways: [mesh]
    sourceNamespace: shop
  route: [{destination: {host: mongo.shop.mesh, port: {number: 5555}}, weight: 100}]
"""

TRAFFIC_POLICY = """
loadBalancer:
  simple: LEAST_REQUEST
  localityLbSetting:
    enabled: true
    distribute:
    - from: us-west/zone1/*
      to: {"us-west/zone1/*": 80, "us-west/zone2/*": 20}
    failoverPriority: [topology.istio.io/network]
  warmup: {duration: 60s, minimumPercent: 10, aggression: 1.5}
  warmupDurationSecs: 30s
connectionPool:
  tcp:
    maxConnections: 100
    connectTimeout: 0.030s
    tcpKeepalive: {probes: 9, time: 7200s, interval: 75s}
    maxConnectionDuration: 3600s
    idleTimeout: 300s
  http:
    http1MaxPendingRequests: 64
    http2MaxRequests: 1000
    maxRequestsPerConnection: 10
    maxRetries: 3
    idleTimeout: 90s
    h2UpgradePolicy: UPGRADE
    useClientProtocol: false
    maxConcurrentStreams: 128
    http2KeepAlive: {interval: 30s, timeout: 5s}
outlierDetection:
  consecutiveErrors: 7
  consecutive5xxErrors: 7
  consecutiveGatewayErrors: 3
  splitExternalLocalOriginErrors: true
  consecutiveLocalOriginFailures: 4
  interval: 300s
  baseEjectionTime: 900s
  maxEjectionPercent: 50
  minHealthPercent: 30
  outlierDetectionHttpErrorCodes: [503, 504]
tls:
  mode: MUTUAL
  clientCertificate: /etc/certs/client.pem
  privateKey: /etc/certs/key.pem
  caCertificates: /etc/certs/ca.pem
  caCrl: /etc/certs/crl.pem
  subjectAltNames: [spiffe://shop/ns/shop/sa/reviews]
  sni: reviews.shop.mesh
  insecureSkipVerify: false
portLevelSettings:
- port: {number: 9080}
  loadBalancer:
    consistentHash:
      httpCookie:
        name: session
        path: /
        ttl: 0s
        attributes: [{name: SameSite, value: Strict}, {name: Secure}]
      maglev: {tableSize: 65537}
  connectionPool: {http: {maxRetries: 1}}
  outlierDetection: {consecutive5xxErrors: 0}
  tls: {mode: ISTIO_MUTUAL}
- port: {number: 9081}
  loadBalancer:
    consistentHash: {httpHeaderName: x-user, ringHash: {minimumRingSize: 2048}}
- port: {number: 9082}
  loadBalancer:
    consistentHash: {useSourceIp: true, minimumRingSize: 1024}
- port: {number: 9083}
  loadBalancer:
    consistentHash: {httpQueryParameterName: user}
    zoneAwareLbSetting: {enabled: true, minClusterSize: 3, failoverPriority: [topology.kubernetes.io/zone]}
tunnel: {protocol: CONNECT, targetHost: proxy.corp.example.com, targetPort: 3128}
proxyProtocol: {version: V2}
retryBudget: {percent: 25, minRetryConcurrency: 3, budgetInterval: 10s}
"""

DESTINATION_RULE = """
host: reviews.shop.mesh
exportTo: ["*"]
workloadSelector:
  matchLabels: {app: productpage}
trafficPolicy:
  TRAFFIC_POLICY
subsets:
- name: v1
  labels: {version: v1}
- name: v2
  labels: {version: v2}
  trafficPolicy:
    loadBalancer:
      simple: ROUND_ROBIN
      localityLbSetting:
        failover: [{from: us-east, to: eu-west}]
"""

GATEWAY = """
selector: {istio: ingressgateway}
servers:
- name: https-shop
  port: {number: 443, name: https, protocol: HTTPS}
  bind: 0.0.0.0
  hosts: [shop/shop.example.com]
  tls:
    mode: SIMPLE
    credentialName: shop-cert
    minProtocolVersion: TLSV1_2
    maxProtocolVersion: TLSV1_3
    cipherSuites: [ECDHE-ECDSA-AES256-GCM-SHA384]
- port: {number: 8443, name: mtls, protocol: HTTPS}
  hosts: ["*"]
  tls:
    mode: MUTUAL
    serverCertificate: /etc/certs/server.pem
    privateKey: /etc/certs/key.pem
    caCertificates: /etc/certs/ca.pem
    caCrl: /etc/certs/crl.pem
    subjectAltNames: [client.example.com]
    verifyCertificateSpki: [abc=]
    verifyCertificateHash: ["AB:CD"]
- port: {number: 9443, name: dual, protocol: HTTPS}
  hosts: ["*"]
  tls:
    mode: OPTIONAL_MUTUAL
    credentialNames: [rsa-cert, ecdsa-cert]
    caCertCredentialName: client-ca
- port: {number: 10443, name: files, protocol: HTTPS}
  hosts: ["*"]
  tls:
    mode: SIMPLE
    tlsCertificates:
    - {serverCertificate: /etc/certs/rsa.pem, privateKey: /etc/certs/rsa.key, caCertificates: /etc/certs/ca.pem}
- port: {number: 80, name: http, protocol: HTTP, targetPort: 8080}
  hosts: ["*"]
  defaultEndpoint: 127.0.0.1:8080
  tls: {httpsRedirect: true}
- port: {number: 15443, name: tls, protocol: TLS}
  hosts: ["*.local"]
  tls: {mode: AUTO_PASSTHROUGH}
"""

SERVICE_ENTRY = """
hosts: [payments.shop.mesh]
addresses: [240.0.0.10]
ports:
- {number: 8080, name: http, protocol: HTTP, targetPort: 9080}
- {number: 9443, name: grpc-tls, protocol: TLS}
location: MESH_INTERNAL
resolution: STATIC
endpoints:
- address: 10.10.0.41
  ports: {http: 9080}
  labels: {app: payments, version: v1}
  network: vpc-1
  locality: us-west/zone1
  weight: 2
  serviceAccount: payments
exportTo: ["."]
subjectAltNames: [spiffe://cluster.local/ns/shop/sa/payments]
"""

SERVICE_ENTRY_SELECTOR = """
hosts: [api.example.com]
ports: [{number: 443, name: https, protocol: TLS}]
location: MESH_EXTERNAL
resolution: DYNAMIC_DNS
workloadSelector:
  labels: {app: payments}
"""

WORKLOAD_ENTRY = """
address: 10.10.0.41
ports: {http: 9080, grpc: 9090}
labels: {app: reviews, version: v1}
network: vpc-1
locality: us-west/zone1/rack3
weight: 10
serviceAccount: reviews
"""

WORKLOAD_GROUP = """
metadata:
  labels: {app: reviews}
  annotations: {owner: team-shop}
template:
  ports: {http: 9080}
  serviceAccount: reviews
  network: vpc-1
probe:
  initialDelaySeconds: 5
  timeoutSeconds: 3
  periodSeconds: 4
  successThreshold: 3
  failureThreshold: 3
  httpGet:
    path: /ready
    port: 9080
    host: 127.0.0.1
    scheme: HTTPS
    httpHeaders: [{name: x-probe, value: "1"}]
"""

SIDECAR = """
workloadSelector:
  labels: {app: reviews}
ingress:
- port: {number: 9080, protocol: HTTP, name: http}
  defaultEndpoint: 127.0.0.1:8080
  captureMode: NONE
  bind: 10.10.0.41
  connectionPool: {http: {http1MaxPendingRequests: 10}}
- port: {number: 9443, protocol: HTTPS, name: https}
  defaultEndpoint: 127.0.0.1:8443
  tls: {mode: SIMPLE, privateKey: /etc/certs/key.pem, serverCertificate: /etc/certs/cert.pem}
egress:
- port: {number: 3306, protocol: MYSQL, name: mysql, targetPort: 3306}
  bind: 127.0.0.1
  captureMode: NONE
  hosts: ["*/mysql.example.com"]
- hosts: ["./*", "istio-system/*"]
inboundConnectionPool:
  tcp: {maxConnections: 500}
  http: {idleTimeout: 30s}
outboundTrafficPolicy:
  mode: REGISTRY_ONLY
  egressProxy: {host: egress.shop.mesh, subset: v1, port: {number: 80}}
"""

PEER_AUTHENTICATION = """
selector:
  matchLabels: {app: finance, version: v1}
mtls: {mode: STRICT}
portLevelMtls:
  8080: {mode: DISABLE}
  "9090": {mode: PERMISSIVE}
  9443: {mode: UNSET}
"""

AUTHORIZATION_POLICY = """
selector:
  matchLabels: {app: httpbin}
action: CUSTOM
provider: {name: my-custom-authz}
rules:
- from:
  - source:
      principals: [cluster.local/ns/default/sa/sleep]
      notPrincipals: [cluster.local/ns/default/sa/bad]
      requestPrincipals: ["issuer-foo/*"]
      notRequestPrincipals: ["issuer-bar/*"]
      namespaces: [test]
      notNamespaces: [dev]
      ipBlocks: [203.0.113.0/24]
      notIpBlocks: [203.0.113.4]
      remoteIpBlocks: [198.51.100.0/24]
      notRemoteIpBlocks: [198.51.100.7]
  to:
  - operation:
      hosts: ["*.example.com"]
      notHosts: [admin.example.com]
      ports: ["8080"]
      notPorts: ["8443"]
      methods: [GET, HEAD]
      notMethods: [POST]
      paths: ["/info*", "/foo/{*}"]
      notPaths: ["/admin*"]
  when:
  - key: request.auth.claims[iss]
    values: ["https://accounts.google.com"]
    notValues: ["https://evil.example.com"]
"""

AUTHORIZATION_POLICY_TARGET_REFS = """
action: DENY
targetRefs:
- {kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}
targetRef: {kind: Service, group: "", name: reviews}
rules:
- to:
  - operation: {paths: [/headers]}
"""

REQUEST_AUTHENTICATION = """
selector:
  matchLabels: {app: httpbin}
targetRefs:
- {kind: Gateway, group: gateway.networking.k8s.io, name: ingress}
jwtRules:
- issuer: issuer-foo
  audiences: [bookstore_android.apps.example.com, bookstore_web.apps.example.com]
  jwksUri: https://example.com/.well-known/jwks.json
  fromHeaders:
  - {name: x-jwt-assertion, prefix: "Bearer "}
  fromParams: [my_token]
  fromCookies: [auth-token]
  outputPayloadToHeader: x-jwt-payload
  forwardOriginalToken: true
  outputClaimToHeaders:
  - {header: x-my-company-jwt-group, claim: my-group}
  timeout: 10s
  failureMode: STRICT
- issuer: issuer-bar
  jwks: '{"keys": []}'
"""

ENVOY_FILTER = """
workloadSelector:
  labels: {app: reviews}
priority: -10
configPatches:
- applyTo: HTTP_FILTER
  match:
    context: SIDECAR_OUTBOUND
    proxy:
      proxyVersion: '^1\\.4.*'
      metadata: {ISTIO_VERSION: "1.24.0"}
    listener:
      portNumber: 9080
      name: 0.0.0.0_9080
      listenerFilter: envoy.filters.listener.tls_inspector
      filterChain:
        name: main
        sni: reviews.example.com
        transportProtocol: tls
        applicationProtocols: h2,http/1.1
        destinationPort: 9080
        filter:
          name: envoy.filters.network.http_connection_manager
          subFilter: {name: envoy.filters.http.router}
  patch:
    operation: INSERT_BEFORE
    filterClass: AUTHZ
    value:
      name: envoy.lua
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
        inlineCode: "function envoy_on_request(h) end"
- applyTo: HTTP_ROUTE
  match:
    context: GATEWAY
    routeConfiguration:
      portNumber: 443
      portName: https
      gateway: istio-system/edge
      name: https.443.https.edge.istio-system
      vhost:
        name: reviews.example.com:443
        domainName: reviews.example.com
        route: {name: default, action: ROUTE}
  patch: {operation: MERGE, value: {route: {timeout: 3s}}}
- applyTo: CLUSTER
  match:
    context: ANY
    cluster: {portNumber: 9080, service: reviews.shop.mesh, subset: v1, name: "outbound|9080|v1|reviews.shop.mesh"}
  patch: {operation: REMOVE}
"""

TELEMETRY = """
selector: {matchLabels: {app: reviews}}
targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge, namespace: shop}]
accessLogging:
- match: {mode: CLIENT}
  providers: [{name: envoy}]
  disabled: false
  filter: {expression: "response.code >= 400"}
tracing:
- match: {mode: SERVER}
  providers: [{name: zipkin}]
  randomSamplingPercentage: 10.5
  disableSpanReporting: false
  useRequestIdForTraceSampling: true
  enableIstioTags: true
  customTags:
    team: {literal: {value: shop}}
    host: {environment: {name: HOSTNAME, defaultValue: unknown}}
    user: {header: {name: x-user, defaultValue: anonymous}}
metrics:
- providers: [{name: prometheus}]
  reportingInterval: 15s
  overrides:
  - match: {metric: REQUEST_COUNT, mode: CLIENT}
    disabled: true
    tagOverrides:
      request_protocol: {operation: REMOVE}
      source: {operation: UPSERT, value: "'x'"}
  - match: {customMetric: my_metric}
"""

WASM_PLUGIN = """
selector: {matchLabels: {app: web}}
url: file:///opt/wasm/stamp.wasm
sha256: 3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855c
imagePullPolicy: IfNotPresent
imagePullSecret: pull
pluginConfig: {header: x-stamp, limits: {rps: 10}, on: true}
pluginName: stamp
phase: AUTHZ
priority: 10
failStrategy: FAIL_OPEN
vmConfig:
  env:
  - {name: POD_NAME, valueFrom: HOST}
  - {name: MODE, value: strict}
match:
- mode: SERVER
  ports: [{number: 8080}]
- mode: CLIENT_AND_SERVER
type: HTTP
"""


def _load(text: str) -> Any:
    return YAML(typ="safe").load(text)


def _parse(kind: str, text: str) -> Message:
    msg, issues = parse_spec(_load(text), spec_class(kind))
    assert issues == [], issues
    return msg


def _destination_rule() -> str:
    policy = "\n".join("  " + line if line else line for line in TRAFFIC_POLICY.strip("\n").splitlines())
    return DESTINATION_RULE.replace("  TRAFFIC_POLICY", policy, 1)


SPECS = [
    ("VirtualService", VIRTUAL_SERVICE),
    ("DestinationRule", None),
    ("Gateway", GATEWAY),
    ("ServiceEntry", SERVICE_ENTRY),
    ("ServiceEntry", SERVICE_ENTRY_SELECTOR),
    ("WorkloadEntry", WORKLOAD_ENTRY),
    ("WorkloadGroup", WORKLOAD_GROUP),
    ("Sidecar", SIDECAR),
    ("EnvoyFilter", ENVOY_FILTER),
    ("PeerAuthentication", PEER_AUTHENTICATION),
    ("AuthorizationPolicy", AUTHORIZATION_POLICY),
    ("AuthorizationPolicy", AUTHORIZATION_POLICY_TARGET_REFS),
    ("RequestAuthentication", REQUEST_AUTHENTICATION),
    ("Telemetry", TELEMETRY),
    ("WasmPlugin", WASM_PLUGIN),
]


def test_every_kind_has_a_full_spec_here() -> None:
    # The Gateway API has no protobuf schema (its specs are Structs, read by config/gateway_api).
    assert {kind for kind, _ in SPECS} == {k for k in KINDS if served_group(k) != GATEWAY_API_GROUP}


@pytest.mark.parametrize(("kind", "text"), SPECS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SPECS)])
def test_full_featured_spec_parses_without_issues(kind: str, text: str | None) -> None:
    msg = _parse(kind, text if text is not None else _destination_rule())
    assert msg.ByteSize() > 0


def test_virtual_service_values_land_in_the_right_fields() -> None:
    vs: Any = _parse("VirtualService", VIRTUAL_SERVICE)
    route = vs.http[0]
    assert route.timeout.ToMilliseconds() == 5000
    assert route.retries.per_try_timeout.ToMilliseconds() == 500
    assert route.retries.backoff.ToMilliseconds() == 25
    assert route.retries.HasField("retry_ignore_previous_hosts") and not route.retries.retry_ignore_previous_hosts.value
    assert route.mirror_percent.value == 20
    assert route.mirror_percentage.value == 12.5
    assert route.match[0].headers["x-user"].exact == "beta"
    assert route.match[0].uri.WhichOneof("match_type") == "prefix"
    assert route.route[0].headers.request.set["x-canary"] == "true"
    assert route.cors_policy.allow_credentials.value is True
    assert route.cors_policy.unmatched_preflights == type(route.cors_policy).UnmatchedPreflights.IGNORE
    assert vs.http[1].redirect.WhichOneof("redirect_port") == "derive_port"
    assert vs.http[4].direct_response.body.bytes == b"hello"
    assert vs.tcp[0].match[0].port == 27017


def test_destination_rule_values_land_in_the_right_fields() -> None:
    dr: Any = _parse("DestinationRule", _destination_rule())
    policy = dr.traffic_policy
    assert dr.workload_selector.match_labels["app"] == "productpage"
    assert policy.load_balancer.WhichOneof("lb_policy") == "simple"
    assert policy.load_balancer.locality_lb_setting.distribute[0].to["us-west/zone1/*"] == 80
    assert policy.load_balancer.warmup.minimum_percent.value == 10.0
    assert policy.connection_pool.tcp.connect_timeout.ToMilliseconds() == 30
    assert policy.outlier_detection.consecutive_5xx_errors.value == 7
    assert policy.port_level_settings[1].load_balancer.consistent_hash.ring_hash.minimum_ring_size == 2048
    assert policy.port_level_settings[3].load_balancer.zone_aware_lb_setting.min_cluster_size.value == 3
    assert policy.retry_budget.percent.value == 25.0
    assert dr.subsets[1].traffic_policy.load_balancer.locality_lb_setting.failover[0].to == "eu-west"


def test_proto_field_names_are_accepted_as_well_as_json_names() -> None:
    msg: Any = _parse(
        "DestinationRule", "host: a.mesh\ntraffic_policy: {outlier_detection: {consecutive_5xx_errors: 3}}"
    )
    assert msg.traffic_policy.outlier_detection.consecutive_5xx_errors.value == 3


def test_unknown_field_is_reported_with_its_path() -> None:
    _, issues = parse_spec(
        _load("hosts: [a]\nhttp:\n- route: [{destination: {host: a, weigth: 3}}]\n"), spec_class("VirtualService")
    )
    assert [(i.path, "weigth" in i.message) for i in issues] == [
        (("spec", "http", 0, "route", 0, "destination", "weigth"), True)
    ]


def test_wrong_enum_is_reported_with_its_path_and_the_allowed_names() -> None:
    _, issues = parse_spec(
        _load("host: a\ntrafficPolicy: {loadBalancer: {simple: FASTEST}}\n"), spec_class("DestinationRule")
    )
    assert len(issues) == 1
    assert issues[0].path == ("spec", "trafficPolicy", "loadBalancer", "simple")
    assert "FASTEST" in issues[0].message and "LEAST_REQUEST" in issues[0].message


def test_oneof_fields_set_together_are_reported() -> None:
    _, issues = parse_spec(
        _load("hosts: [a]\nhttp:\n- match: [{uri: {exact: /a, prefix: /b}}]\n"), spec_class("VirtualService")
    )
    assert [i.path for i in issues] == [("spec", "http", 0, "match", 0, "uri", "prefix")]


def test_security_values_land_in_the_right_fields() -> None:
    pa: Any = _parse("PeerAuthentication", PEER_AUTHENTICATION)
    assert pa.DESCRIPTOR.full_name == "istio.security.v1beta1.PeerAuthentication"
    assert {port: mtls.mode for port, mtls in pa.port_level_mtls.items()} == {8080: 1, 9090: 2, 9443: 0}
    ap: Any = _parse("AuthorizationPolicy", AUTHORIZATION_POLICY)
    assert ap.WhichOneof("action_detail") == "provider" and ap.provider.name == "my-custom-authz"
    assert ap.rules[0].when[0].not_values == ["https://evil.example.com"]
    refs: Any = _parse("AuthorizationPolicy", AUTHORIZATION_POLICY_TARGET_REFS)
    assert [r.name for r in refs.targetRefs] == ["waypoint"] and refs.targetRef.kind == "Service"
    ra: Any = _parse("RequestAuthentication", REQUEST_AUTHENTICATION)
    assert ra.jwt_rules[0].timeout.ToMilliseconds() == 10_000
    assert ra.jwt_rules[0].from_headers[0].prefix == "Bearer "
    assert type(ra.jwt_rules[0]).FailureMode.Name(ra.jwt_rules[0].failure_mode) == "STRICT"
