"""Whatever valid mesh a user writes, Envoy accepts the config meshctl generates for it.

Hypothesis draws random meshes that the loader accepts: ServiceEntries with random ports,
protocols, resolutions, addresses and endpoints; WorkloadEntries; DestinationRules with subsets
and traffic policies at every level; VirtualServices with random matches, weighted routes,
redirects, direct responses, delegation, retries, faults, rewrites, mirrors, CORS, header
operations and TCP/TLS routes; Sidecars; and a Gateway with HTTP, HTTPS, TLS and TCP servers.
Config is generated for several proxies of the mesh (a sidecar without a workload, one bound to a
WorkloadEntry, the same in REDIRECT mode, and an ingress gateway) and checked by a real Envoy
(`envoy --mode validate` on a static bootstrap). A mesh the loader rejects is discarded; the
strategies stay inside Istio's rules so that this is rare.

Envoy rejecting a config is always a meshctl bug: a proxy would NACK it and keep stale config.
The failure names the proxy, Envoy's words and the mesh as YAML, shrunk by Hypothesis.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import needs_envoy
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from meshctl.config.loader import LoadOptions, load_text
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import build_snapshot
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyError, bootstrap, validate_config
from meshctl.xds.generate import generate

pytestmark = [
    pytest.mark.slow,
    needs_envoy,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI for certificate files"),
]

Doc = dict[str, Any]

NAMESPACES = ("ns-a", "ns-b")
GATEWAY_NS = "istio-system"
GATEWAY = f"{GATEWAY_NS}/gw"
GATEWAY_LABELS = {"istio": "ingressgateway"}
GATEWAY_TCP_PORT, GATEWAY_TLS_PORT = 31400, 15443
#: Certificate paths written in the mesh; replaced by real files before Envoy reads the config.
TLS_DIR = "/etc/meshctl-fuzz/certs"
SERVER_CERT, SERVER_KEY, CA_CERT = (f"{TLS_DIR}/{n}" for n in ("server.pem", "server-key.pem", "ca.pem"))

#: 15001 and 15006 are Envoy's own (virtualOutbound, virtualInbound) in REDIRECT mode.
PORTS = (80, 443, 3306, 5000, 6379, 7070, 8080, 9080, 9443, 15001, 15006, 15021, 27017)
PROTOCOLS = ("HTTP", "HTTP2", "GRPC", "GRPC-Web", "HTTP_PROXY", "HTTPS", "TLS", "TCP", "Mongo", "MySQL", "Redis", "")
HTTP_PROTOCOLS = frozenset({"HTTP", "HTTP2", "GRPC", "GRPC-Web", "HTTP_PROXY"})
TLS_PROTOCOLS = frozenset({"HTTPS", "TLS"})
DURATIONS = ("1ms", "250ms", "1s", "5s", "30s", "2m", "1h")
RETRY_ON = ("5xx", "gateway-error", "reset", "connect-failure", "retriable-4xx", "refused-stream", "503", "429")
HEADERS = ("x-user", "x-canary", "x-env")
HEADER_VALUES = ("1", "a b", "100%%", "%DOWNSTREAM_REMOTE_ADDRESS%", "%REQ(x-user)%", "%PROTOCOL%", "%START_TIME%")
VERSIONS = ("v1", "v2")
LOCALITIES = ("us-east/zone-1", "us-east/zone-2", "us-west/zone-1")

durations = st.sampled_from(DURATIONS)
small = st.integers(1, 1000)


def maybe(doc: Doc, key: str, value: Any) -> None:
    if value is not None:
        doc[key] = value


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


# -- the mesh as it is drawn ----------------------------------------------------------------------


@dataclass
class Port:
    number: int
    protocol: str
    name: str

    @property
    def kind(self) -> str:
        """HTTP, TLS or TCP, as a port name implies when the protocol is unset (Istio's rule)."""
        protocol = self.protocol or self.name.split("-", 1)[0].upper()
        if protocol in HTTP_PROTOCOLS or protocol == "GRPC-WEB":
            return "http"
        if protocol in TLS_PROTOCOLS:
            return "tls"
        return "tcp"


@dataclass
class Service:
    host: str
    namespace: str
    ports: list[Port]
    resolution: str


@dataclass
class Workload:
    name: str
    namespace: str
    address: str
    app: str


@dataclass
class Mesh:
    docs: list[Doc] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)

    def yaml(self) -> str:
        out = io.StringIO()
        YAML().dump_all(self.docs, out)
        return out.getvalue()


def resource(kind: str, name: str, namespace: str, spec: Doc) -> Doc:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# -- ServiceEntry and WorkloadEntry ---------------------------------------------------------------


@st.composite
def ports(draw: st.DrawFn) -> list[Port]:
    numbers = draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=3, unique=True))
    out = []
    for number in numbers:
        # HTTP ports carry most features (routes), so they come up more often.
        protocol = draw(st.sampled_from(("HTTP", "HTTP", *PROTOCOLS)))
        # With no protocol, Istio reads it from the name's prefix (`http-web`, `grpc-api`).
        prefix = (
            draw(st.sampled_from(("http", "grpc", "tcp", "tls", "port")))
            if not protocol
            else protocol.lower().replace("_", "-")
        )
        out.append(Port(number, protocol, f"{prefix}-{number}"))
    return out


@st.composite
def endpoint(draw: st.DrawFn, address: str, port_names: list[str]) -> Doc:
    out: Doc = {"address": address, "labels": {"version": draw(st.sampled_from(VERSIONS))}}
    named = draw(st.lists(st.sampled_from(port_names), unique=True, max_size=len(port_names)))
    if named and not address.startswith("unix://"):
        out["ports"] = {name: draw(st.integers(1024, 65535)) for name in named}
    maybe(out, "locality", draw(optional(st.sampled_from(LOCALITIES))))
    maybe(out, "weight", draw(optional(st.integers(1, 100))))
    return out


@st.composite
def service_entry(draw: st.DrawFn, mesh: Mesh, i: int) -> None:
    ns = draw(st.sampled_from(NAMESPACES))
    name = f"svc{i}"
    host = f"{name}.{ns}.mesh"
    port_list = draw(ports())
    resolution = draw(st.sampled_from(("STATIC", "STATIC", "DNS", "DNS_ROUND_ROBIN", "NONE")))
    hosts = [host]
    # Several hosts can share a port only where HTTP (Host) or TLS (SNI) tells them apart; the
    # loader judges this by the declared protocol, not by one a port name implies.
    if resolution == "NONE" or all(p.protocol in HTTP_PROTOCOLS | TLS_PROTOCOLS for p in port_list):
        if draw(st.booleans()):
            hosts.append(f"alias{i}.{ns}.mesh")
        if resolution == "NONE" and draw(st.booleans()):
            hosts.append(f"*.ext{i}.example.com")
    spec: Doc = {
        "hosts": hosts,
        "location": draw(st.sampled_from(("MESH_INTERNAL", "MESH_EXTERNAL"))),
        "resolution": resolution,
        "ports": [],
    }
    for p in port_list:
        port: Doc = {"number": p.number, "name": p.name}
        maybe(port, "protocol", p.protocol or None)
        if resolution != "NONE":
            maybe(port, "targetPort", draw(optional(st.integers(1024, 65535))))
        spec["ports"].append(port)
    address = draw(st.sampled_from(("none", "vip", "cidr") if resolution in ("NONE", "STATIC") else ("none", "vip")))
    if address == "vip":
        spec["addresses"] = [f"240.0.{i}.1"]
    elif address == "cidr":
        spec["addresses"] = [f"240.1.{i}.0/24"]
    names = [p.name for p in port_list]
    selected = resolution == "STATIC" and draw(st.booleans())
    if selected:
        spec["workloadSelector"] = {"labels": {"app": name}}
    elif resolution == "STATIC":
        count = draw(st.integers(0, 3))
        # A unix socket endpoint serves a ServiceEntry with exactly one port.
        unix = len(port_list) == 1 and draw(st.integers(0, 3)) == 0
        addresses = [f"unix:///var/run/svc{i}-{j}.sock" if unix else f"10.{i}.1.{j + 1}" for j in range(count)]
        spec["endpoints"] = [draw(endpoint(a, names)) for a in addresses]
    elif resolution in ("DNS", "DNS_ROUND_ROBIN"):
        count = draw(st.integers(0, 1 if resolution == "DNS_ROUND_ROBIN" else 2))
        addresses = [draw(st.sampled_from((f"backend{j}.example.com", f"10.{i}.2.{j + 1}"))) for j in range(count)]
        spec["endpoints"] = [draw(endpoint(a, names)) for a in addresses]
    if draw(st.integers(0, 4)) == 0:
        spec["exportTo"] = [draw(st.sampled_from((".", "*")))]
    mesh.docs.append(resource("ServiceEntry", name, ns, spec))
    mesh.services.append(Service(host, ns, port_list, resolution))
    if not selected:
        return
    for j in range(draw(st.integers(0, 3))):
        # A WorkloadEntry may name its VM by DNS name, even when the ServiceEntry is STATIC.
        address = f"vm{j}.{ns}.example.com" if draw(st.integers(0, 4)) == 0 else f"10.{i}.0.{j + 1}"
        we = draw(endpoint(address, names))
        we["labels"]["app"] = name
        we["serviceAccount"] = name
        workload = Workload(f"{name}-{j}", ns, we["address"], name)
        mesh.docs.append(resource("WorkloadEntry", workload.name, ns, we))
        mesh.workloads.append(workload)


# -- DestinationRule ------------------------------------------------------------------------------


@st.composite
def load_balancer(draw: st.DrawFn, outlier: bool, distribute: bool) -> Doc:
    out: Doc = {}
    kind = draw(st.sampled_from(("simple", "hash", "none")))
    if kind == "simple":
        out["simple"] = draw(st.sampled_from(("ROUND_ROBIN", "LEAST_REQUEST", "RANDOM", "PASSTHROUGH")))
    elif kind == "hash":
        key = draw(st.sampled_from(("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")))
        value: Any = {
            "httpHeaderName": "x-user",
            "httpCookie": {"name": "session", "ttl": draw(durations), "path": "/"},
            "useSourceIp": True,
            "httpQueryParameterName": "user",
        }[key]
        hashing: Doc = {key: value}
        algorithm = draw(st.sampled_from(("default", "ringHash", "maglev")))
        if algorithm == "ringHash":
            hashing["ringHash"] = {"minimumRingSize": draw(st.sampled_from((64, 1024)))}
        elif algorithm == "maglev":
            hashing["maglev"] = {"tableSize": draw(st.sampled_from((65537, 131)))}
        out["consistentHash"] = hashing
    locality = draw(st.sampled_from(("none", "distribute", "failover", "priority")))
    if locality == "distribute" and distribute:
        weight = draw(st.integers(1, 99))
        out["localityLbSetting"] = {
            "enabled": True,
            "distribute": [{"from": "us-east/*", "to": {"us-east/*": weight, "us-west/*": 100 - weight}}],
        }
    elif locality == "failover" and outlier:
        out["localityLbSetting"] = {"enabled": True, "failover": [{"from": "us-east", "to": "us-west"}]}
    elif locality == "priority" and outlier:
        out["localityLbSetting"] = {"enabled": True, "failoverPriority": ["topology.istio.io/network", "version"]}
    warmup = draw(st.sampled_from(("none", "none", "none", "secs", "warmup")))
    if warmup == "secs":
        out["warmupDurationSecs"] = draw(durations)
    elif warmup == "warmup":
        out["warmup"] = {"duration": draw(durations), "minimumPercent": 10, "aggression": 1.5}
    return out or {"simple": "ROUND_ROBIN"}


@st.composite
def connection_pool(draw: st.DrawFn) -> Doc:
    out: Doc = {}
    if draw(st.booleans()):
        tcp: Doc = {"maxConnections": draw(small)}
        maybe(tcp, "connectTimeout", draw(optional(durations)))
        maybe(tcp, "maxConnectionDuration", draw(optional(durations)))
        maybe(tcp, "idleTimeout", draw(optional(durations)))
        if draw(st.booleans()):
            tcp["tcpKeepalive"] = {
                "time": draw(durations),
                "interval": draw(durations),
                "probes": draw(st.integers(1, 9)),
            }
        out["tcp"] = tcp
    if draw(st.booleans()) or not out:
        http: Doc = {
            "http1MaxPendingRequests": draw(small),
            "http2MaxRequests": draw(small),
            "maxRequestsPerConnection": draw(st.integers(0, 100)),
            "maxRetries": draw(st.integers(0, 10)),
        }
        maybe(http, "idleTimeout", draw(optional(durations)))
        policy = draw(st.sampled_from(("DEFAULT", "DO_NOT_UPGRADE", "UPGRADE")))
        http["h2UpgradePolicy"] = policy
        if policy != "UPGRADE" and draw(st.booleans()):
            http["useClientProtocol"] = True
        maybe(http, "maxConcurrentStreams", draw(optional(small)))
        out["http"] = http
    return out


@st.composite
def outlier_detection(draw: st.DrawFn) -> Doc:
    out: Doc = {
        "consecutive5xxErrors": draw(st.integers(0, 10)),
        "interval": draw(durations),
        "baseEjectionTime": draw(durations),
        "maxEjectionPercent": draw(st.integers(0, 100)),
    }
    maybe(out, "consecutiveGatewayErrors", draw(optional(st.integers(0, 10))))
    maybe(out, "minHealthPercent", draw(optional(st.integers(0, 100))))
    if draw(st.booleans()):
        out["splitExternalLocalOriginErrors"] = True
        out["consecutiveLocalOriginFailures"] = draw(st.integers(1, 10))
    return out


@st.composite
def client_tls(draw: st.DrawFn) -> Doc:
    mode = draw(st.sampled_from(("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL")))
    out: Doc = {"mode": mode}
    if mode in ("SIMPLE", "MUTUAL"):
        if mode == "MUTUAL":
            out["clientCertificate"] = SERVER_CERT
            out["privateKey"] = SERVER_KEY
        if draw(st.booleans()):
            out["insecureSkipVerify"] = True
        else:
            maybe(out, "caCertificates", draw(st.sampled_from((CA_CERT, None))))
            if draw(st.booleans()):
                out["subjectAltNames"] = draw(
                    st.lists(st.sampled_from(("backend.example.com", "spiffe://cluster.local/ns/a/sa/b", "10.0.0.1")),
                             min_size=1, max_size=2, unique=True)
                )  # fmt: skip
        maybe(out, "sni", draw(optional(st.just("backend.example.com"))))
    return out


@st.composite
def traffic_policy(draw: st.DrawFn, port_numbers: list[int], *, top: bool, distribute: bool = True) -> Doc:
    out: Doc = {}
    outlier = draw(st.booleans())
    if outlier:
        out["outlierDetection"] = draw(outlier_detection())
    if draw(st.booleans()):
        out["loadBalancer"] = draw(load_balancer(outlier, distribute))
    if draw(st.booleans()):
        out["connectionPool"] = draw(connection_pool())
    if draw(st.booleans()):
        out["tls"] = draw(client_tls())
    extra = draw(st.sampled_from(("none", "none", "proxyProtocol", "tunnel", "retryBudget")))
    if top and extra == "proxyProtocol":
        out["proxyProtocol"] = {"version": draw(st.sampled_from(("V1", "V2")))}
    elif top and extra == "tunnel":
        out["tunnel"] = {
            "protocol": draw(st.sampled_from(("CONNECT", "POST"))),
            "targetHost": draw(st.sampled_from(("egress.example.com", "10.9.9.9"))),
            "targetPort": draw(st.sampled_from((443, 8080))),
        }
    elif top and extra == "retryBudget":
        out["retryBudget"] = {"percent": draw(st.sampled_from((5, 25.5))), "minRetryConcurrency": 3}
    if top and port_numbers and draw(st.booleans()):
        settings_ = []
        for number in draw(st.lists(st.sampled_from(port_numbers), min_size=1, max_size=2, unique=True)):
            level = draw(traffic_policy([], top=False, distribute=distribute))
            for top_only in ("proxyProtocol", "tunnel", "retryBudget"):
                level.pop(top_only, None)
            settings_.append({"port": {"number": number}, **level})
        out["portLevelSettings"] = settings_
    return out or {"connectionPool": {"tcp": {"maxConnections": 10}}}


@st.composite
def destination_rule(draw: st.DrawFn, mesh: Mesh, i: int) -> None:
    svc = draw(st.sampled_from(mesh.services))
    ns = draw(st.sampled_from((svc.namespace, *NAMESPACES)))
    spec: Doc = {"host": svc.host}
    numbers = [p.number for p in svc.ports]
    distribute = True
    if draw(st.booleans()):
        spec["trafficPolicy"] = draw(traffic_policy(numbers, top=True, distribute=distribute))
    subsets = []
    for version in draw(st.lists(st.sampled_from(VERSIONS), unique=True, max_size=2)):
        subset: Doc = {"name": version, "labels": {"version": version}}
        if draw(st.integers(0, 2)) == 0:
            subset["trafficPolicy"] = draw(traffic_policy(numbers, top=True, distribute=distribute))
        subsets.append(subset)
    if subsets:
        spec["subsets"] = subsets
    if "trafficPolicy" not in spec and not subsets:
        spec["trafficPolicy"] = {"loadBalancer": {"simple": "LEAST_REQUEST"}}
    mesh.docs.append(resource("DestinationRule", f"dr{i}", ns, spec))


# -- VirtualService -------------------------------------------------------------------------------


@st.composite
def string_match(draw: st.DrawFn, values: tuple[str, ...]) -> Doc:
    kind = draw(st.sampled_from(("exact", "prefix", "regex")))
    value = draw(st.sampled_from(values))
    return {kind: value if kind != "regex" else f"{value}.*"}


@st.composite
def http_match(draw: st.DrawFn, svc: Service) -> Doc:
    out: Doc = {}
    if draw(st.booleans()):
        out["uri"] = draw(string_match(("/api", "/v1/", "/")))
        if draw(st.integers(0, 3)) == 0:
            out["ignoreUriCase"] = True
    if draw(st.booleans()):
        out["headers"] = {draw(st.sampled_from(HEADERS)): draw(string_match(("yes", "a", "b")))}
    if draw(st.integers(0, 3)) == 0:
        out["withoutHeaders"] = {"x-skip": draw(string_match(("1",)))}
    if draw(st.integers(0, 3)) == 0:
        out["queryParams"] = {"debug": draw(string_match(("1", "on")))}
    if draw(st.integers(0, 3)) == 0:
        out["method"] = {"exact": draw(st.sampled_from(("GET", "POST")))}
    if draw(st.integers(0, 4)) == 0:
        out["authority"] = {"prefix": svc.host.split(".")[0]}
    if draw(st.integers(0, 3)) == 0:
        out["port"] = draw(st.sampled_from([p.number for p in svc.ports]))
    if draw(st.integers(0, 4)) == 0:
        out["sourceLabels"] = {"app": draw(st.sampled_from(("svc0", "svc1", "frontend")))}
    if draw(st.integers(0, 5)) == 0:
        out["sourceNamespace"] = draw(st.sampled_from(NAMESPACES))
    if draw(st.integers(0, 4)) == 0:
        out["name"] = draw(st.sampled_from(("m1", "m2")))
    return out


@st.composite
def destination(draw: st.DrawFn, mesh: Mesh) -> Doc:
    svc = draw(st.sampled_from(mesh.services))
    out: Doc = {"host": svc.host}
    maybe(out, "subset", draw(optional(st.sampled_from(VERSIONS))))
    if len(svc.ports) > 1 or draw(st.booleans()):
        out["port"] = {"number": draw(st.sampled_from([p.number for p in svc.ports]))}
    return out


@st.composite
def header_operations(draw: st.DrawFn, *, authority: bool) -> Doc:
    out: Doc = {}
    for side in ("request", "response"):
        if not draw(st.booleans()):
            continue
        ops: Doc = {}
        if draw(st.booleans()):
            ops["set"] = {"x-set": draw(st.sampled_from(HEADER_VALUES))}
            if side == "request" and authority and draw(st.integers(0, 3)) == 0:
                ops["set"][":authority"] = "rewritten.example.com"
        if draw(st.booleans()):
            ops["add"] = {"x-add": "v"}
        if draw(st.booleans()):
            ops["remove"] = ["x-remove"]
        out[side] = ops or {"remove": ["x-remove"]}
    return out


@st.composite
def route_destinations(draw: st.DrawFn, mesh: Mesh) -> list[Doc]:
    count = draw(st.integers(1, 3))
    out = []
    for _ in range(count):
        item: Doc = {"destination": draw(destination(mesh))}
        if count > 1:
            item["weight"] = draw(st.integers(0, 100))
        if draw(st.integers(0, 4)) == 0:
            item["headers"] = draw(header_operations(authority=False))
        out.append(item)
    if count > 1 and not any(d["weight"] for d in out):
        out[0]["weight"] = 100
    return out


@st.composite
def retries(draw: st.DrawFn) -> Doc:
    attempts = draw(st.integers(0, 5))
    if attempts == 0:
        return {"attempts": 0}
    out: Doc = {"attempts": attempts}
    maybe(out, "perTryTimeout", draw(optional(durations)))
    on = draw(st.lists(st.sampled_from(RETRY_ON), unique=True, max_size=3))
    if on:
        out["retryOn"] = ",".join(on)
    maybe(out, "retryRemoteLocalities", draw(optional(st.booleans())))
    maybe(out, "retryIgnorePreviousHosts", draw(optional(st.booleans())))
    maybe(out, "backoff", draw(optional(durations)))
    return out


@st.composite
def fault(draw: st.DrawFn) -> Doc:
    out: Doc = {}
    kinds = draw(st.sampled_from((("delay",), ("abort",), ("delay", "abort"))))
    percentage = optional(st.sampled_from((0, 0.5, 50, 100)).map(lambda v: {"value": v}))
    if "delay" in kinds:
        out["delay"] = {"fixedDelay": draw(durations)}
        maybe(out["delay"], "percentage", draw(percentage))
    if "abort" in kinds:
        status = draw(st.sampled_from(("httpStatus", "grpcStatus")))
        out["abort"] = {status: 503 if status == "httpStatus" else draw(st.sampled_from(("UNAVAILABLE", "INTERNAL")))}
        maybe(out["abort"], "percentage", draw(percentage))
    return out


@st.composite
def cors(draw: st.DrawFn) -> Doc:
    out: Doc = {"allowOrigins": [draw(string_match(("https://a.example.com", "https://b")))]}
    out["allowMethods"] = draw(st.lists(st.sampled_from(("GET", "POST", "OPTIONS")), min_size=1, unique=True))
    maybe(out, "allowHeaders", draw(optional(st.just(["x-user", "*"]))))
    maybe(out, "exposeHeaders", draw(optional(st.just(["x-trace"]))))
    maybe(out, "maxAge", draw(optional(st.sampled_from(("1s", "24h")))))
    maybe(out, "allowCredentials", draw(optional(st.booleans())))
    maybe(out, "unmatchedPreflights", draw(optional(st.sampled_from(("FORWARD", "IGNORE")))))
    return out


@st.composite
def rewrite(draw: st.DrawFn) -> Doc:
    kind = draw(st.sampled_from(("uri", "regex", "authority", "both")))
    if kind == "uri":
        return {"uri": draw(st.sampled_from(("/", "/v2/", "/new")))}
    if kind == "regex":
        return {"uriRegexRewrite": {"match": "^/api/(.*)$", "rewrite": "/\\1"}}
    if kind == "authority":
        return {"authority": "backend.example.com"}
    return {"uri": "/v2", "authority": "backend.example.com"}


@st.composite
def redirect(draw: st.DrawFn) -> Doc:
    out: Doc = {}
    uri = draw(st.sampled_from(("none", "uri", "prefix")))
    if uri == "uri":
        out["uri"] = draw(st.sampled_from(("/new", "/")))
    elif uri == "prefix":
        out["prefixRewrite"] = draw(st.sampled_from(("/new/", "/")))
        out["authority"] = "www.example.com"  # prefixRewrite alone is not a redirect to the loader
    maybe(out, "authority", draw(optional(st.just("www.example.com"))))
    maybe(out, "scheme", draw(optional(st.sampled_from(("http", "https")))))
    port = draw(st.sampled_from(("none", "port", "derive")))
    if port == "port":
        out["port"] = draw(st.sampled_from((443, 8443)))
    elif port == "derive":
        out["derivePort"] = "FROM_REQUEST_PORT"
    maybe(out, "redirectCode", draw(optional(st.sampled_from((301, 302, 303, 307, 308)))))
    if not out.keys() & {"uri", "authority", "scheme", "port", "derivePort"}:
        out["uri"] = "/moved"  # a redirect must change something
    return out


@st.composite
def http_route(draw: st.DrawFn, mesh: Mesh, svc: Service, delegates: list[tuple[str, str]]) -> Doc:
    out: Doc = {}
    maybe(out, "name", draw(optional(st.sampled_from(("r1", "r2", "default")))))
    matches = draw(st.lists(http_match(svc), max_size=2))
    if matches:
        out["match"] = matches
    action = draw(st.sampled_from(("route", "route", "route", "redirect", "direct", "delegate")))
    if action == "delegate" and delegates:
        name, ns = draw(st.sampled_from(delegates))
        out["delegate"] = {"name": name, "namespace": ns}
        return out
    if action == "redirect":
        out["redirect"] = draw(redirect())
    elif action == "direct":
        response: Doc = {"status": draw(st.sampled_from((200, 204, 404, 503)))}
        maybe(response, "body", draw(optional(st.sampled_from(({"string": "hello"}, {"bytes": "aGVsbG8="})))))
        out["directResponse"] = response
    else:
        out["route"] = draw(route_destinations(mesh))
        if draw(st.integers(0, 2)) == 0:
            out["rewrite"] = draw(rewrite())
        if draw(st.integers(0, 2)) == 0:
            out["fault"] = draw(fault())
    if draw(st.booleans()):
        out["timeout"] = draw(durations)
    if draw(st.booleans()):
        out["retries"] = draw(retries())
    mirror = draw(st.sampled_from(("none", "none", "mirror", "mirrors")))
    if mirror == "mirror":
        out["mirror"] = draw(destination(mesh))
        maybe(out, "mirrorPercentage", draw(optional(st.sampled_from(({"value": 0}, {"value": 12.5})))))
    elif mirror == "mirrors":
        out["mirrors"] = [{"destination": draw(destination(mesh)), "percentage": {"value": 50}}]
    if draw(st.integers(0, 3)) == 0:
        out["corsPolicy"] = draw(cors())
    if draw(st.integers(0, 2)) == 0:
        authority = "rewrite" not in out or "authority" not in out["rewrite"]
        out["headers"] = draw(header_operations(authority=authority))
    return out


@st.composite
def l4_routes(draw: st.DrawFn, mesh: Mesh, svc: Service, hosts: list[str], gateway: bool) -> Doc:
    """`tcp` routes for the service's TCP ports and `tls` routes (by SNI) for its TLS ports, and
    for the Gateway's TCP and TLS servers when the VirtualService is bound to it."""
    out: Doc = {}
    tcp_ports = [p.number for p in svc.ports if p.kind == "tcp"] + ([GATEWAY_TCP_PORT] if gateway else [])
    tls_ports = [p.number for p in svc.ports if p.kind == "tls"] + ([GATEWAY_TLS_PORT] if gateway else [])
    if tcp_ports and draw(st.booleans()):
        rule: Doc = {"route": draw(route_destinations(mesh))}
        for item in rule["route"]:
            item.pop("headers", None)
        if draw(st.booleans()):
            rule["match"] = [{"port": draw(st.sampled_from(tcp_ports))}]
        out["tcp"] = [rule]
    if tls_ports and draw(st.booleans()):
        match: Doc = {"sniHosts": [draw(st.sampled_from(hosts))]}
        maybe(match, "port", draw(optional(st.sampled_from(tls_ports))))
        routes = draw(route_destinations(mesh))
        for item in routes:
            item.pop("headers", None)
        out["tls"] = [{"match": [match], "route": routes}]
    return out


@st.composite
def virtual_service(draw: st.DrawFn, mesh: Mesh, i: int, delegates: list[tuple[str, str]]) -> None:
    svc = draw(st.sampled_from(mesh.services))
    ns = draw(st.sampled_from((svc.namespace, *NAMESPACES)))
    gateways = draw(st.sampled_from(((), ("mesh",), (GATEWAY,), ("mesh", GATEWAY))))
    hosts = [svc.host]
    if draw(st.integers(0, 3)) == 0:
        hosts.append(draw(st.sampled_from(("api.example.com", f"*.{svc.namespace}.svc.cluster.local"))))
    if gateways == (GATEWAY,) and draw(st.integers(0, 3)) == 0:
        hosts = ["*"]  # a VirtualService bound only to gateways may take every host
    spec: Doc = {"hosts": hosts}
    if gateways:
        spec["gateways"] = list(gateways)
    http = draw(st.lists(http_route(mesh, svc, delegates), max_size=3))
    if http:
        spec["http"] = http
    spec.update(draw(l4_routes(mesh, svc, [h for h in hosts if h != "*"] or [svc.host], GATEWAY in gateways)))
    if not (http or "tcp" in spec or "tls" in spec):
        spec["http"] = [{"route": [{"destination": {"host": svc.host}}]}]
    mesh.docs.append(resource("VirtualService", f"vs{i}", ns, spec))


@st.composite
def delegate_service(draw: st.DrawFn, mesh: Mesh, i: int) -> tuple[str, str]:
    """A VirtualService without hosts, for other VirtualServices to delegate to."""
    svc = draw(st.sampled_from(mesh.services))
    ns = draw(st.sampled_from(NAMESPACES))
    http = draw(st.lists(http_route(mesh, svc, []), min_size=1, max_size=2))
    mesh.docs.append(resource("VirtualService", f"delegate{i}", ns, {"http": http}))
    return f"delegate{i}", ns


# -- Sidecar and Gateway --------------------------------------------------------------------------


@st.composite
def sidecars(draw: st.DrawFn, mesh: Mesh) -> None:
    for ns in draw(st.lists(st.sampled_from(NAMESPACES), unique=True, max_size=2)):
        spec: Doc = {}
        egress_hosts = draw(
            st.lists(st.sampled_from(("./*", "*/*", "istio-system/*", "ns-b/*", "*/svc0.ns-a.mesh")),
                     min_size=1, max_size=3, unique=True)
        )  # fmt: skip
        egress: list[Doc] = []
        if draw(st.booleans()):
            svc = draw(st.sampled_from(mesh.services))
            port = draw(st.sampled_from(svc.ports))
            listener: Doc = {
                "port": {"number": port.number, "name": f"egress-{port.number}"},
                "hosts": [f"*/{svc.host}"],
            }
            maybe(listener["port"], "protocol", port.protocol or None)
            maybe(listener, "bind", draw(optional(st.sampled_from(("127.0.0.2", "0.0.0.0")))))
            egress.append(listener)
        if not egress or draw(st.booleans()):
            egress.append({"hosts": egress_hosts})
        spec["egress"] = egress
        if draw(st.booleans()):
            spec["outboundTrafficPolicy"] = {"mode": draw(st.sampled_from(("ALLOW_ANY", "REGISTRY_ONLY")))}
        mesh.docs.append(resource("Sidecar", "default", ns, spec))
    if mesh.workloads and draw(st.booleans()):
        workload = mesh.workloads[0]  # the one a proxy is generated for
        number = draw(st.sampled_from((8080, 9090, 9443)))
        protocol = draw(st.sampled_from(("HTTP", "TCP", "GRPC", "HTTPS")))
        ingress: Doc = {
            "port": {"number": number, "protocol": protocol, "name": f"in-{number}"},
            "defaultEndpoint": f"127.0.0.1:{draw(st.integers(1024, 65535))}",
        }
        if protocol == "HTTPS" or draw(st.integers(0, 3)) == 0:
            ingress["tls"] = {"mode": "SIMPLE", "serverCertificate": SERVER_CERT, "privateKey": SERVER_KEY}
        if draw(st.booleans()):
            ingress["connectionPool"] = draw(connection_pool())
        spec = {"workloadSelector": {"labels": {"app": workload.app}}, "ingress": [ingress]}
        if draw(st.booleans()):
            spec["inboundConnectionPool"] = draw(connection_pool())
        mesh.docs.append(resource("Sidecar", f"ingress-{workload.app}", workload.namespace, spec))


@st.composite
def gateway(draw: st.DrawFn, mesh: Mesh) -> None:
    hosts = st.lists(
        st.sampled_from(("*", "*/*", "ns-a/*", *(f"*/{s.host}" for s in mesh.services))), min_size=1, max_size=2,
        unique=True,
    )  # fmt: skip
    servers: list[Doc] = []
    kinds = draw(st.lists(st.sampled_from(("http", "http-alt", "https", "mutual", "passthrough", "tcp")),
                          min_size=1, max_size=4, unique=True))  # fmt: skip
    for kind in kinds:
        server: Doc
        if kind in ("http", "http-alt"):
            number = 80 if kind == "http" else 8080
            server = {"port": {"number": number, "name": f"{kind}-{number}", "protocol": "HTTP"}}
            if draw(st.integers(0, 3)) == 0:
                server["tls"] = {"httpsRedirect": True}
        elif kind in ("https", "mutual"):
            tls: Doc = {"mode": "SIMPLE", "serverCertificate": SERVER_CERT, "privateKey": SERVER_KEY}
            if kind == "mutual":
                tls["mode"] = draw(st.sampled_from(("MUTUAL", "OPTIONAL_MUTUAL")))
                tls["caCertificates"] = CA_CERT
            maybe(tls, "minProtocolVersion", draw(optional(st.sampled_from(("TLSV1_2", "TLSV1_3")))))
            number = 443 if kind == "https" else 8443
            server = {"port": {"number": number, "name": f"{kind}-{number}", "protocol": "HTTPS"}, "tls": tls}
        elif kind == "passthrough":
            server = {
                "port": {"number": GATEWAY_TLS_PORT, "name": "tls-passthrough", "protocol": "TLS"},
                "tls": {"mode": "PASSTHROUGH"},
            }
        else:
            server = {"port": {"number": GATEWAY_TCP_PORT, "name": "tcp", "protocol": "TCP"}}
        server["hosts"] = draw(hosts)
        # Unix socket binds need port 0, which these servers do not use: see
        # `test_gateway_server_on_a_unix_socket`.
        maybe(server, "bind", draw(st.sampled_from((None, None, None, "10.250.0.1", "0.0.0.0"))))
        servers.append(server)
    mesh.docs.append(resource("Gateway", "gw", GATEWAY_NS, {"selector": GATEWAY_LABELS, "servers": servers}))


# -- the whole mesh -------------------------------------------------------------------------------


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
    mesh = Mesh()
    for i in range(draw(st.integers(1, 4))):
        draw(service_entry(mesh, i))
    for i in range(draw(st.integers(0, 3))):
        draw(destination_rule(mesh, i))
    delegates = [draw(delegate_service(mesh, i)) for i in range(draw(st.integers(0, 1)))]
    for i in range(draw(st.integers(1, 3))):
        draw(virtual_service(mesh, i, delegates))
    draw(sidecars(mesh))
    if draw(st.booleans()):
        draw(gateway(mesh))
    return mesh


# -- the test -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, str]:
    """A self-signed certificate and key for every certificate path the meshes name."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=www.example.com",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return {SERVER_CERT: str(d / "cert.pem"), SERVER_KEY: str(d / "key.pem"), CA_CERT: str(d / "cert.pem")}


def proxies(mesh: Mesh) -> Iterator[tuple[str, dict[str, Any]]]:
    """The proxies config is generated for: node id and metadata."""
    yield "sidecar~10.250.0.9~client.ns-a~ns-a.svc.cluster.local", {}
    if mesh.workloads:
        w = mesh.workloads[0]
        # A VM whose WorkloadEntry names it by DNS still connects from an IP; the name binds it.
        ip = w.address if w.address[0].isdigit() else "10.250.0.11"
        node = f"sidecar~{ip}~{w.name}.{w.namespace}~{w.namespace}.svc.cluster.local"
        yield node, {}
        yield node, {"INTERCEPTION_MODE": "REDIRECT"}
    else:
        yield "sidecar~10.250.0.10~client.ns-b~ns-b.svc.cluster.local", {"INTERCEPTION_MODE": "REDIRECT"}
    yield f"router~10.250.0.1~ingress.{GATEWAY_NS}~{GATEWAY_NS}.svc.cluster.local", {"LABELS": GATEWAY_LABELS}


def with_files(config: Mapping[str, Any], files: Mapping[str, str]) -> dict[str, Any]:
    text = json.dumps(config)
    for fake, real in files.items():
        text = text.replace(fake, real)
    out: dict[str, Any] = json.loads(text)
    return out


def envoy_verdict(config: Mapping[str, Any]) -> str | None:
    try:
        validate_config(config)
    except EnvoyError as exc:
        return str(exc)
    return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mesh=meshes())
def test_envoy_accepts_config_generated_for_any_valid_mesh(mesh: Mesh, tls_files: Mapping[str, str]) -> None:
    text = mesh.yaml()
    loaded = load_text(text, "mesh.yaml", LoadOptions(default_namespace="ns-a"))
    if not loaded.ok:
        event("rejected by the loader")
        errors = [str(f) for f in loaded.findings if f.severity.value == "error"]
        event(f"rejected: {errors[0].split(': ', 1)[-1][:80]}")
    assume(loaded.ok)
    snapshot = build_snapshot(loaded.configs, build_file_model(loaded.configs))
    configs = {}
    for node_id, metadata in proxies(mesh):
        resources = generate(snapshot, proxy_for(snapshot, node_id, metadata))
        mode = metadata.get("INTERCEPTION_MODE", "NONE")
        configs[f"{node_id} ({mode})"] = with_files(bootstrap(resources, node_id=node_id), tls_files)
    with ThreadPoolExecutor(len(configs)) as pool:
        verdicts = dict(zip(configs, pool.map(envoy_verdict, configs.values()), strict=True))
    rejected = {proxy: error for proxy, error in verdicts.items() if error is not None}
    assert not rejected, "\n\n".join(f"proxy {p}:\n{e}" for p, e in rejected.items()) + f"\n\nmesh:\n{text}"


# -- Envoy rejections found by the test above, pinned as the smallest configs that show them -------


def envoy_rejection(text: str, node_id: str, metadata: Mapping[str, Any] | None = None) -> str | None:
    """What Envoy says of the config generated for `node_id` from `text`, None when it accepts."""
    snapshot = snapshot_from_yaml(text, namespace="ns-a")
    resources = generate(snapshot, proxy_for(snapshot, node_id, metadata))
    return envoy_verdict(bootstrap(resources, node_id=node_id))


CLIENT = "sidecar~10.250.0.9~client.ns-a~ns-a.svc.cluster.local"


@pytest.mark.parametrize("port", [15001, 15006])
def test_service_on_a_capture_port_in_redirect_mode(port: int) -> None:
    """A service port equal to virtualOutbound's (15001) or virtualInbound's (15006) port: in
    REDIRECT mode the outbound listener `0.0.0.0_PORT` has the same address as Envoy's own
    capture listener, and Envoy refuses the config ("duplicate address"). Istio skips such ports
    (conflictWithReservedListener), as meshctl already does in NONE mode."""
    text = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc0, namespace: ns-a}}
spec:
  hosts: [svc0.ns-a.mesh]
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
"""
    assert envoy_rejection(text, CLIENT, {"INTERCEPTION_MODE": "REDIRECT"}) is None


def test_client_tls_sans_without_ca_certificates() -> None:
    """TLS origination with `subjectAltNames` and no `caCertificates`: the cluster trusts the
    system roots (`system_root_certs`) and matches SANs, which Envoy refuses ("SAN-based
    verification of peer certificates without trusted CA is insecure and not allowed"). Istio
    points such clusters at the system CA bundle as a trusted CA file instead."""
    text = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc0, namespace: ns-a}
spec:
  hosts: [svc0.ns-a.mesh]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: svc0, namespace: ns-a}
spec:
  host: svc0.ns-a.mesh
  trafficPolicy:
    tls: {mode: SIMPLE, subjectAltNames: [backend.example.com]}
"""
    assert envoy_rejection(text, CLIENT) is None


def test_distribute_on_a_logical_dns_cluster() -> None:
    """A DNS_ROUND_ROBIN service (a LOGICAL_DNS cluster, one endpoint: the host itself, with no
    locality) under a `distribute` rule that matches the calling proxy: the endpoint's locality
    matches none of the rule's targets, so its lb_endpoints are removed, and Envoy refuses a
    LOGICAL_DNS cluster without exactly one ("LOGICAL_DNS clusters must have a single
    locality_lb_endpoint and a single lb_endpoint")."""
    text = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: client, namespace: ns-a}
spec:
  hosts: [client.ns-a.mesh]
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: client}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: client-0, namespace: ns-a}
spec: {address: 10.0.0.1, labels: {app: client}, locality: us-east/zone-1}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: ns-a}
spec:
  hosts: [db.ns-a.mesh]
  resolution: DNS_ROUND_ROBIN
  ports: [{number: 3306, name: tcp, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: ns-a}
spec:
  host: db.ns-a.mesh
  trafficPolicy:
    loadBalancer:
      localityLbSetting:
        distribute: [{from: us-east/*, to: {us-east/*: 80, us-west/*: 20}}]
"""
    assert envoy_rejection(text, "sidecar~10.0.0.1~client-0.ns-a~ns-a.svc.cluster.local") is None


def test_gateway_server_on_a_unix_socket() -> None:
    """A Gateway server bound to a unix domain socket (`bind: unix:///...`, port 0, which the
    loader accepts): the listener's address is a `socket_address` holding the `unix://` text,
    and Envoy refuses it ("malformed IP address"). Envoy needs a `pipe` address there."""
    text = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc0, namespace: ns-a}}
spec:
  hosts: [svc0.ns-a.mesh]
  resolution: STATIC
  ports: [{{number: 80, name: http, protocol: HTTP}}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: {GATEWAY_NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 0, name: uds, protocol: HTTP}}
    bind: unix:///var/run/gateway.sock
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc0, namespace: ns-a}}
spec:
  hosts: ["*"]
  gateways: [{GATEWAY}]
  http:
  - route: [{{destination: {{host: svc0.ns-a.mesh}}}}]
"""
    router = f"router~10.250.0.1~ingress.{GATEWAY_NS}~{GATEWAY_NS}.svc.cluster.local"
    assert envoy_rejection(text, router, {"LABELS": GATEWAY_LABELS}) is None


def header_value_mesh(value: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc0, namespace: ns-a}}
spec:
  hosts: [svc0.ns-a.mesh]
  resolution: STATIC
  ports: [{{number: 80, name: http, protocol: HTTP}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: svc0, namespace: ns-a}}
spec:
  hosts: [svc0.ns-a.mesh]
  http:
  - headers: {{request: {{set: {{x-value: "{value}"}}}}}}
    route: [{{destination: {{host: svc0.ns-a.mesh}}}}]
"""


@pytest.mark.parametrize("value", ["%BOGUS%", "%REQ( x-user )%"])
def test_header_values_the_loader_accepts_envoy_accepts(value: str) -> None:
    """A header value with an unknown `%COMMAND%`, or a header name with spaces in `%REQ(...)%`,
    passes `meshctl validate`, and every proxy then NACKs the route config ("Not supported field
    in StreamInfo", "Format string contains invalid characters")."""
    loaded = load_text(header_value_mesh(value), "mesh.yaml", LoadOptions(default_namespace="ns-a"))
    if loaded.ok:
        assert envoy_rejection(header_value_mesh(value), CLIENT) is None


def test_loader_accepts_truncated_header_variables() -> None:
    """`%REQ(x-user):10%` (the header truncated to 10 characters) is Envoy syntax that Envoy
    accepts in a header value, but the loader calls it an unterminated variable."""
    loaded = load_text(header_value_mesh("%REQ(x-user):10%"), "mesh.yaml", LoadOptions(default_namespace="ns-a"))
    assert loaded.ok, [str(f) for f in loaded.findings]
