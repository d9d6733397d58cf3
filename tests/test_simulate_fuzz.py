"""`meshctl simulate` against a real Envoy, on random meshes.

Each mesh is drawn from a seeded `random.Random`: a handful of ServiceEntry hosts, each with a
workload per version (v1, v2, v3) that is a real Backend naming itself, DestinationRules with
some of those subsets, a Gateway on one port, and VirtualServices whose routes overlap on
purpose (prefix, exact and regex URIs, `ignoreUriCase`, header, `withoutHeaders` and query
parameter matches) and end in subsets, weighted splits, redirects and direct responses.

Every mesh lives in a namespace of its own with its own gateway port, so its listener, route
config and clusters have names no other mesh uses: the generated resources of all meshes go in
one static bootstrap and one Envoy serves them all, which keeps the run short. Each request is
sent through that Envoy and given to `simulate` with the resources of its own mesh; the answering
backend (or the status, and Location of a redirect) must be what the simulation says. A
weighted split other than 0/100 is checked only to land on one of its clusters with weight > 0.

A failing request names the seed of its mesh: `mesh_for(seed)` rebuilds it.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy

from meshctl.simulate.request import Request
from meshctl.simulate.simulator import Target, simulate
from meshctl.simulate.upstream import healthy
from meshctl.testing.backends import BACKEND_HEADER, Backend
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds import types
from meshctl.xds.generate import generate

SEEDS = range(1000, 1060)
REQUESTS_PER_MESH = 25
HOSTS = ("alpha", "beta", "gamma", "delta")
VERSIONS = ("v1", "v2", "v3")
PORTS = (9080, 9090)
ROUTER_META = {"LABELS": {"istio": "ingressgateway"}}

PREFIXES = ("/", "/a", "/a/", "/api", "/API", "/api/v1", "/static")
EXACTS = ("/", "/a", "/api/v1", "/login", "/Login", "/static/x.css")
REGEXES = ("/api/v[0-9]+(/.*)?", "/[a-z]+", ".*\\.css", "/A.*", "/(a|b)/.*", "/login/?")
PATHS = (
    "/",
    "/a",
    "/a/",
    "/a/b",
    "/A",
    "/A/b",
    "/ab",
    "/b/c",
    "/api",
    "/API",
    "/api/v1",
    "/Api/V1",
    "/api/v12/x",
    "/api/v1/users",
    "/login",
    "/Login",
    "/login/",
    "/static",
    "/static/x.css",
    "/STATIC/x.css",
    "/a//b",
    "/a/./b",
    "/b/../api/v1",
    "/api%2Fv1",
    "/%61",
    "/A/%62",
    "/static/x%2Ecss",
    "/a/b/..",
    "/a/%2e%2E/login",
    "/./static/",
    "/api/v1/.",
    "/a%2fb",
)
HEADER_VALUES = ("red", "Red", "reddish", "blue", "green", "")
QUERY_VALUES = ("1", "10", "yes", "no", "")


def backend_address(host: int, version: int) -> str:
    return f"127.0.{40 + host}.{1 + version}"


def backend_name(host: int, version: int) -> str:
    return f"{HOSTS[host]}-{VERSIONS[version]}"


# -- random meshes -------------------------------------------------------------------------------


@dataclass
class Mesh:
    seed: int
    namespace: str
    gateway_port: int
    hosts: list[str]
    host_ports: dict[str, list[int]]
    documents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def router(self) -> str:
        return f"router~127.0.0.60~ingress.{self.namespace}~{self.namespace}.svc.cluster.local"

    def yaml(self) -> str:
        return "".join(f"---\n{json.dumps(doc)}\n" for doc in self.documents)


def _string_match(rng: random.Random, values: Sequence[str], kinds: Sequence[str]) -> dict[str, str]:
    kind = rng.choice(kinds)
    if kind == "regex":
        return {"regex": rng.choice(("re.*", "(red|blue)", "[a-z]+", "R.*"))}
    return {kind: rng.choice([v for v in values if v])}


def _match(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    uri = rng.random()
    if uri < 0.3:
        out["uri"] = {"prefix": rng.choice(PREFIXES)}
    elif uri < 0.55:
        out["uri"] = {"exact": rng.choice(EXACTS)}
    elif uri < 0.8:
        out["uri"] = {"regex": rng.choice(REGEXES)}
    if "uri" in out and rng.random() < 0.3:
        out["ignoreUriCase"] = True
    if rng.random() < 0.35:
        out["headers"] = {"x-color": _string_match(rng, HEADER_VALUES, ("exact", "prefix", "regex"))}
        if rng.random() < 0.2:
            out["headers"]["x-flag"] = {}
    if rng.random() < 0.2:
        out["withoutHeaders"] = {"x-color": _string_match(rng, HEADER_VALUES, ("exact", "prefix", "regex"))}
    if rng.random() < 0.25:
        out["queryParams"] = {"q": _string_match(rng, QUERY_VALUES, ("exact", "prefix", "regex"))}
    if rng.random() < 0.1:
        out["method"] = {"exact": rng.choice(("GET", "POST"))}
    return out


def _destination(rng: random.Random, mesh: Mesh) -> dict[str, Any]:
    host = rng.choice(mesh.hosts)
    out: dict[str, Any] = {"host": host}
    ports = mesh.host_ports[host]
    if len(ports) > 1 or rng.random() < 0.5:
        out["port"] = {"number": rng.choice(ports)}
    if rng.random() < 0.7:
        out["subset"] = rng.choice(VERSIONS)
    return out


def _http_route(rng: random.Random, mesh: Mesh, last: bool) -> dict[str, Any]:
    route: dict[str, Any] = {}
    if not last or rng.random() < 0.3:
        route["match"] = [_match(rng) for _ in range(rng.choice((1, 1, 2)))]
    kind = rng.random()
    if kind < 0.12:
        redirect: dict[str, Any] = {"uri": rng.choice(("/moved", "/a/new", "/q?x=1"))} if rng.random() < 0.8 else {}
        if rng.random() < 0.5:
            redirect["authority"] = "elsewhere.example.com"
        if rng.random() < 0.25:
            redirect["scheme"] = rng.choice(("http", "https"))
        port = rng.random()
        if port < 0.2:
            redirect["port"] = rng.choice((80, 443, 8443))
        elif port < 0.3:
            redirect["derivePort"] = rng.choice(("FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"))
        if rng.random() < 0.4:
            redirect["redirectCode"] = rng.choice((301, 302, 307, 308))
        if not {"uri", "authority", "scheme", "port"} & redirect.keys():
            redirect["authority"] = "elsewhere.example.com"
        route["redirect"] = redirect
    elif kind < 0.22:
        route["directResponse"] = {"status": rng.choice((200, 204, 403, 418, 503)), "body": {"string": "direct"}}
    elif kind < 0.4:
        first, second = _destination(rng, mesh), _destination(rng, mesh)
        weight = rng.choice((0, 100, 30, 50))
        route["route"] = [
            {"destination": first, "weight": weight},
            {"destination": second, "weight": 100 - weight},
        ]
    else:
        route["route"] = [{"destination": _destination(rng, mesh)}]
    return route


def mesh_for(seed: int, gateway_port: int) -> Mesh:
    """The mesh of `seed`, its Gateway on `gateway_port`."""
    rng = random.Random(seed)
    ns = f"fz{seed}"
    count = rng.choice((3, 4))
    hosts = [f"{HOSTS[i]}.{ns}.mesh" for i in range(count)]
    host_ports = {h: (list(PORTS) if rng.random() < 0.3 else [PORTS[0]]) for h in hosts}
    mesh = Mesh(seed, ns, gateway_port, hosts, host_ports)
    docs = mesh.documents
    for i, host in enumerate(hosts):
        name = HOSTS[i]
        ports = [{"number": p, "name": f"http-{p}", "protocol": "HTTP"} for p in host_ports[host]]
        docs.append(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "ServiceEntry",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "hosts": [host],
                    "location": "MESH_INTERNAL",
                    "resolution": "STATIC",
                    "ports": ports,
                    "workloadSelector": {"labels": {"app": name}},
                },
            }
        )
        for v, version in enumerate(VERSIONS):
            docs.append(
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "WorkloadEntry",
                    "metadata": {"name": f"{name}-{version}", "namespace": ns},
                    "spec": {
                        "address": backend_address(i, v),
                        "ports": {f"http-{p}": BACKEND_PORT for p in host_ports[host]},
                        "labels": {"app": name, "version": version},
                    },
                }
            )
        if rng.random() < 0.85:
            subsets = [v for v in VERSIONS if rng.random() < 0.8]
            docs.append(
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "DestinationRule",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {
                        "host": host,
                        "subsets": [{"name": v, "labels": {"version": v}} for v in subsets],
                    },
                }
            )
    served = ["*"] if rng.random() < 0.7 else rng.sample(hosts, rng.randint(1, len(hosts)))
    docs.append(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "ingress", "namespace": ns},
            "spec": {
                "selector": {"istio": "ingressgateway"},
                "servers": [{"port": {"number": gateway_port, "name": "http", "protocol": "HTTP"}, "hosts": served}],
            },
        }
    )
    for n in range(rng.choice((1, 2, 3))):
        vs_hosts = rng.sample(hosts, rng.randint(1, 2))
        if rng.random() < 0.15:
            vs_hosts = [f"*.{ns}.mesh"]
        routes = rng.randint(1, 5)
        docs.append(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": f"vs{n}", "namespace": ns},
                "spec": {
                    "hosts": vs_hosts,
                    "gateways": ["ingress"],
                    "http": [_http_route(rng, mesh, r == routes - 1) for r in range(routes)],
                },
            }
        )
    return mesh


def random_request(rng: random.Random, mesh: Mesh) -> Request:
    host = rng.choice([*mesh.hosts, *mesh.hosts, f"other.{mesh.namespace}.mesh", "unknown.example.com"])
    if rng.random() < 0.1:
        host = host.upper()
    authority = host if rng.random() < 0.6 else f"{host}:{rng.choice((mesh.gateway_port, 9080, 80, 443))}"
    headers = {"host": authority}
    if rng.random() < 0.6:
        headers["x-color"] = rng.choice(HEADER_VALUES)
    if rng.random() < 0.2:
        headers["x-flag"] = "on"
    query = ""
    if rng.random() < 0.4:
        query = urlencode([("q", rng.choice(QUERY_VALUES))] + ([("q", "1")] if rng.random() < 0.2 else []))
    elif rng.random() < 0.2:
        query = rng.choice(("q", "q=1%30", "q=%31", "Q=1", "q=y+es", "x=1&q=no", "q=1&q=yes"))
    return Request(
        method=rng.choice(("GET", "GET", "POST")),
        scheme="http",
        host=host.split(":")[0].lower(),
        port=mesh.gateway_port,
        path=rng.choice(PATHS),
        query=query,
        headers=MappingProxyType(headers),
    )


# -- sending and comparing -----------------------------------------------------------------------

#: Every backend listens on this port of its own address (a WorkloadEntry names one port).
BACKEND_PORT = free_port()


@dataclass(frozen=True)
class Reply:
    status: int
    backend: str
    location: str
    body: str


def send(request: Request) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", request.port, timeout=DEADLINE)
    try:
        headers = {k: v for k, v in request.headers.items() if k != "host"}
        conn.putrequest(request.method, request.path_and_query, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", request.authority)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
        return Reply(
            response.status, response.getheader(BACKEND_HEADER) or "", response.getheader("location") or "", body
        )
    finally:
        conn.close()


#: Backend name by address.
NAMES = {backend_address(h, v): backend_name(h, v) for h in range(len(HOSTS)) for v in range(len(VERSIONS))}


def disagreement(resources: Mapping[str, Sequence[Any]], mesh: Mesh, request: Request, reply: Reply) -> str | None:
    """Why Envoy's `reply` is not what simulate says of `request`; None when they agree."""
    sim = simulate(resources, request, Target(mesh.router, router=True))
    outcome = sim.outcome
    said = f"simulate: {outcome.status} {outcome.flag} {outcome.reason}"
    if outcome.status is not None:
        if reply.status != outcome.status:
            return f"{said}; envoy: {reply.status} {reply.backend} {reply.body[:80]!r}"
        if sim.action and sim.action.get("kind") == "redirect" and reply.location != sim.action.get("location"):
            return f"simulate: Location {sim.action.get('location')}; envoy: Location {reply.location}"
        return None
    if not outcome.routed:
        return f"{said}; envoy: {reply.status} {reply.backend}"
    live = [u for u in sim.clusters if u.weight > 0 and u.found and healthy(u.endpoints)]
    allowed = {NAMES.get(e.address.rsplit(":", 1)[0], e.address) for u in live for e in healthy(u.endpoints)}
    # A split with a share on a missing or empty cluster answers 503 for that share.
    dead = len(live) < len([u for u in sim.clusters if u.weight > 0])
    if not (reply.status == 200 and reply.backend in allowed) and not (dead and reply.status == 503):
        clusters = ", ".join(f"{u.name}={u.weight}" for u in sim.clusters)
        return f"simulate: one of {sorted(allowed)} ({clusters}); envoy: {reply.status} {reply.backend!r}"
    return None


def _merge(into: dict[str, dict[str, Any]], resources: Mapping[str, Sequence[Any]]) -> None:
    for type_url, items in resources.items():
        bucket = into.setdefault(type_url, {})
        for item in items:
            key = item.cluster_name if type_url == types.ENDPOINT else item.name
            bucket.setdefault(key, item)


@dataclass
class Fleet:
    meshes: list[tuple[Mesh, Mapping[str, Sequence[Any]]]]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with ExitStack() as stack:
        for h in range(len(HOSTS)):
            for v in range(len(VERSIONS)):
                stack.enter_context(Backend(backend_name(h, v), backend_address(h, v), BACKEND_PORT))
        meshes = []
        merged: dict[str, dict[str, Any]] = {}
        ports = _distinct_ports(len(SEEDS))
        for seed, port in zip(SEEDS, ports, strict=True):
            mesh = mesh_for(seed, port)
            snapshot = snapshot_from_yaml(mesh.yaml(), namespace=mesh.namespace)
            resources = generate(snapshot, proxy_for(snapshot, mesh.router, ROUTER_META))
            meshes.append((mesh, resources))
            _merge(merged, resources)
        combined = {t: list(items.values()) for t, items in merged.items()}
        stack.enter_context(EnvoyProcess(bootstrap(combined, node_id=meshes[0][0].router)))
        _wait_listening([m.gateway_port for m, _ in meshes])
        yield Fleet(meshes)


def _distinct_ports(count: int) -> list[int]:
    """Free ports, no two alike: meshes on one port would share a listener and a route config."""
    found: list[int] = []
    while len(found) < count:
        port = free_port()
        if port not in found and port != BACKEND_PORT:
            found.append(port)
    return found


def _wait_listening(ports: Sequence[int]) -> None:
    """Envoy says LIVE before every listener takes connections on a loaded machine."""
    deadline = time.monotonic() + DEADLINE
    for port in ports:
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
                conn.request("GET", "/", headers={"Host": "nothing.invalid"})
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
@envoy_log_left_open
def test_simulate_agrees_with_envoy_on_random_meshes(fleet: Fleet) -> None:
    failures: list[str] = []
    sent = 0
    for mesh, resources in fleet.meshes:
        rng = random.Random(mesh.seed * 7919)
        for _ in range(REQUESTS_PER_MESH):
            request = random_request(rng, mesh)
            reply = send(request)
            sent += 1
            why = disagreement(resources, mesh, request, reply)
            if why:
                failures.append(
                    f"seed {mesh.seed}: {request.method} {request.authority}{request.path_and_query}"
                    f" {dict(request.headers)}: {why}"
                )
    assert sent >= 500
    assert not failures, f"{len(failures)} of {sent} requests disagree:\n" + "\n".join(failures[:40])


# -- what the meshes found, one at a time --------------------------------------------------------

_GATEWAY_MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: one}
spec:
  hosts: [web.one.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.9}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: one}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*"]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: one}
spec:
  hosts: [web.one.mesh]
  gateways: [ingress]
  http:
  - match: [{uri: {exact: /api}}]
    route: [{destination: {host: web.one.mesh}}]
  - match: [{uri: {prefix: /old}}]
    redirect: {uri: /new}
  - match: [{uri: {prefix: /port}}]
    redirect: {uri: /new, port: 8443}
  - match: [{uri: {prefix: /secure}}]
    redirect: {uri: /new, scheme: https}
"""
_ROUTER = "router~127.0.0.60~ingress.one~one.svc.cluster.local"


@pytest.fixture(scope="module")
def one_gateway() -> Mapping[str, Sequence[Any]]:
    snapshot = snapshot_from_yaml(_GATEWAY_MESH, namespace="one")
    return generate(snapshot, proxy_for(snapshot, _ROUTER, ROUTER_META))


def _at_gateway(resources: Mapping[str, Sequence[Any]], path: str, host: str) -> Any:
    request = Request(
        "GET", "http", host.split(":", maxsplit=1)[0], 8080, path, headers=MappingProxyType({"host": host})
    )
    return simulate(resources, request, Target(_ROUTER, router=True))


@pytest.mark.parametrize(
    ("path", "host", "location"),
    [
        # Without an authority, the Host header as sent, not the port the gateway listens on.
        ("/old", "web.one.mesh", "http://web.one.mesh/new"),
        ("/old", "web.one.mesh:9999", "http://web.one.mesh:9999/new"),
        ("/old", "WEB.one.mesh", "http://WEB.one.mesh/new"),
        # A port_redirect replaces the Host header's port.
        ("/port", "web.one.mesh:9999", "http://web.one.mesh:8443/new"),
        # A new scheme drops the old scheme's default port, and only that one.
        ("/secure", "web.one.mesh:80", "https://web.one.mesh/new"),
        ("/secure", "web.one.mesh:81", "https://web.one.mesh:81/new"),
    ],
)
def test_redirect_location_is_envoys(
    one_gateway: Mapping[str, Sequence[Any]], path: str, host: str, location: str
) -> None:
    """Http::Utility::newUri and processRequestHost."""
    result = _at_gateway(one_gateway, path, host)
    assert result.action is not None and result.action["location"] == location


@pytest.mark.parametrize(
    ("path", "route"),
    [("/b/../api", "/api"), ("/%61pi", "/api"), ("/api/.", None), ("/x/%2e%2E/api", "/api"), ("/api%2F", None)],
)
def test_routes_see_the_normalized_path(one_gateway: Mapping[str, Sequence[Any]], path: str, route: str | None) -> None:
    """Istio sets normalize_path: Envoy routes `/b/../api` as `/api` (RFC 3986, unreserved
    escapes decoded), keeps `%2F` (KEEP_UNCHANGED), and a last `.` segment leaves `/api/`."""
    result = _at_gateway(one_gateway, path, "web.one.mesh")
    assert result.outcome.status == (None if route else 404)
    assert result.request["path"] == path


def test_redirect_keeps_the_normalized_path(one_gateway: Mapping[str, Sequence[Any]]) -> None:
    result = _at_gateway(one_gateway, "/x/../old/./a", "web.one.mesh")
    assert result.outcome.status == 301
