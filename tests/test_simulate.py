"""`meshctl simulate`: the route Envoy would take, worked out from the generated resources, on the
example mesh and on small inline meshes; and, against a real Envoy, the cluster it names is the
backend that answers."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from conftest import DEADLINE, SLEEP_VM, envoy_log_left_open, examples_copy, needs_envoy, runner, wait_for

from meshctl.cli.app import app
from meshctl.simulate import Target, parse_request, simulate
from meshctl.simulate.request import parse_connection
from meshctl.snapshot.model import MeshSettings
from meshctl.testing.backends import Backend
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

REVIEWS = "http://reviews.bookinfo.mesh:9080/reviews/1"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example mesh with a client VM that calls the bookinfo services."""
    root = examples_copy(tmp_path_factory.mktemp("simulate"))
    (root / "bookinfo" / "sleep.yaml").write_text(SLEEP_VM)
    return root


def run(mesh: Path, url: str, *args: str, proxy: str = "sleep-vm.bookinfo") -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["simulate", url, "--config-dir", str(mesh), "--proxy", proxy, "-o", "json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_header_match_routes_to_the_canary_subset(mesh: Path) -> None:
    code, out = run(mesh, REVIEWS, "-H", "end-user: jason")
    assert code == 0
    assert out["listener"] == "127.0.0.1_9080" and out["route_config"] == "9080"
    assert out["virtual_host"] == "reviews.bookinfo.mesh:9080"
    assert out["route"]["name"] == "canary-jason"
    assert [c["name"] for c in out["clusters"]] == ["outbound|9080|v2|reviews.bookinfo.mesh"]
    assert [e["address"] for e in out["clusters"][0]["endpoints"]] == ["10.10.0.42:8080"]


def test_default_route_shows_weights_timeout_and_retries(mesh: Path) -> None:
    code, out = run(mesh, REVIEWS, "-H", "end-user: alice")
    assert code == 0
    assert out["route"]["name"] == "default"
    assert out["action"]["weighted_clusters"] == [
        {"name": "outbound|9080|v1|reviews.bookinfo.mesh", "weight": 90},
        {"name": "outbound|9080|v3|reviews.bookinfo.mesh", "weight": 10},
    ]
    assert out["action"]["timeout"] == "3s"
    assert out["action"]["retries"] == {
        "retry_on": "5xx,connect-failure,refused-stream",
        "num_retries": 3,
        "per_try_timeout": "1s",
    }
    assert [(c["name"].split("|")[2], c["weight"]) for c in out["clusters"]] == [("v1", 90), ("v3", 10)]


def test_the_route_names_its_virtual_service_and_line(mesh: Path) -> None:
    _, out = run(mesh, REVIEWS)
    traffic = mesh / "bookinfo" / "traffic.yaml"
    lines = traffic.read_text().splitlines()
    assert out["source"]["kind"] == "VirtualService"
    assert (out["source"]["namespace"], out["source"]["name"]) == ("bookinfo", "reviews")
    assert out["source"]["file"] == str(traffic)
    # The document's first line, followed by the kind and name of the VirtualService.
    document = "\n".join(lines[out["source"]["line"] - 1 : out["source"]["line"] + 4])
    assert "kind: VirtualService" in document and "name: reviews" in document


def test_json_has_one_object_with_every_step(mesh: Path) -> None:
    _, out = run(mesh, REVIEWS)
    assert set(out) >= {
        "listener",
        "filter_chain",
        "route_config",
        "virtual_host",
        "route",
        "source",
        "action",
        "clusters",
        "outcome",
    }
    assert set(out["route"]) == {"name", "match"}
    assert set(out["source"]) == {"kind", "namespace", "name", "file", "line"}
    assert set(out["outcome"]) >= {"status", "flag", "reason"}
    assert set(out["clusters"][0]) >= {"name", "weight", "tls", "endpoints"}
    assert set(out["clusters"][0]["endpoints"][0]) >= {"address", "locality", "priority", "weight", "health"}


def test_no_listener_for_the_port_is_refused(mesh: Path) -> None:
    code, out = run(mesh, "http://reviews.bookinfo.mesh:7777/")
    assert code == 1
    assert out["listener"] is None
    assert "connection refused" in out["outcome"]["reason"] and "7777" in out["outcome"]["reason"]


def test_unknown_host_under_registry_only_is_istios_502(mesh: Path) -> None:
    code, out = run(mesh, "http://unknown.example.com:9080/")
    assert code == 1
    assert out["virtual_host"] == "block_all" and out["outcome"]["status"] == 502
    assert "REGISTRY_ONLY" in out["outcome"]["reason"]


def test_unknown_host_at_a_gateway_is_404_nr(mesh: Path) -> None:
    code, out = run(mesh, "http://other.example.com:8080/productpage", proxy="ingressgateway-vm.bookinfo")
    assert code == 1
    assert (out["listener"], out["virtual_host"]) == ("0.0.0.0_8080", None)
    assert (out["outcome"]["status"], out["outcome"]["flag"]) == (404, "NR")


def test_gateway_routes_the_exact_path_and_404s_others(mesh: Path) -> None:
    code, out = run(mesh, "http://bookinfo.example.com:8080/productpage", proxy="ingressgateway-vm.bookinfo")
    assert code == 0 and out["clusters"][0]["name"] == "outbound|9080||productpage.bookinfo.mesh"
    code, out = run(mesh, "http://bookinfo.example.com:8080/elsewhere", proxy="ingressgateway-vm.bookinfo")
    assert code == 1 and (out["outcome"]["status"], out["outcome"]["flag"]) == (404, "NR")
    assert out["virtual_host"] == "bookinfo.example.com:8080" and out["route"] is None


def test_redirect_interception_goes_through_virtual_outbound(mesh: Path) -> None:
    code, out = run(mesh, REVIEWS, "--interception", "REDIRECT", "-H", "end-user: jason")
    assert code == 0
    assert out["listener"] == "0.0.0.0_9080"
    assert any("virtualOutbound" in note for note in out["notes"])
    assert out["clusters"][0]["name"] == "outbound|9080|v2|reviews.bookinfo.mesh"


def test_terminal_tables_and_usage_errors(mesh: Path) -> None:
    result = runner.invoke(app, ["simulate", REVIEWS, "--config-dir", str(mesh), "--proxy", "sleep-vm.bookinfo"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("STEP")
    assert "outbound|9080|v1|reviews.bookinfo.mesh" in result.stdout and "traffic.yaml:" in result.stdout
    bad = runner.invoke(app, ["simulate", "ftp://x/", "--config-dir", str(mesh), "--proxy", "sleep-vm.bookinfo"])
    assert bad.exit_code == 2
    bad = runner.invoke(
        app, ["simulate", REVIEWS, "--config-dir", str(mesh), "--proxy", "sleep-vm.bookinfo", "-H", "nocolon"]
    )
    assert bad.exit_code == 2


@pytest.mark.parametrize("url", ["http://[::1:9080/", "http://[::1]:99999/", "http://[not-an-ip]/"])
def test_a_malformed_url_is_a_usage_error(mesh: Path, url: str) -> None:
    result = runner.invoke(app, ["simulate", url, "--config-dir", str(mesh), "--proxy", "sleep-vm.bookinfo"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0] and url in lines[0], result.stderr


# -- a small inline mesh: redirects, direct responses, faults, matchers ------------------------

NS = "shop"
CLIENT = f"sidecar~10.20.0.9~client.{NS}~{NS}.svc.cluster.local"
SHOP = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: {NS}}}
spec:
  hosts: [web.shop.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: web}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: web, namespace: {NS}}}
spec: {{address: 10.20.0.5, labels: {{app: web}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: {NS}}}
spec:
  hosts: [web.shop.mesh]
  http:
  - name: moved
    match: [{{uri: {{prefix: /old}}}}]
    redirect: {{uri: /new, redirectCode: 302}}
  - name: teapot
    match: [{{uri: {{exact: /tea}}}}]
    directResponse: {{status: 418}}
  - name: broken
    match: [{{headers: {{x-fail: {{exact: "yes"}}}}}}]
    fault: {{abort: {{httpStatus: 503, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: web.shop.mesh}}}}]
  - name: slow
    match: [{{uri: {{regex: "/slow/[0-9]+"}}, queryParams: {{debug: {{exact: "1"}}}}}}]
    fault: {{delay: {{fixedDelay: 2s, percentage: {{value: 50}}}}}}
    timeout: 5s
    route: [{{destination: {{host: web.shop.mesh}}}}]
    mirror: {{host: web.shop.mesh}}
  - name: nowhere
    match: [{{uri: {{prefix: /ghost}}}}]
    route: [{{destination: {{host: ghost.shop.mesh}}}}]
"""


@pytest.fixture(scope="module")
def shop() -> Any:
    snapshot = snapshot_from_yaml(SHOP, namespace=NS)
    return generate(snapshot, proxy_for(snapshot, CLIENT))


def shop_route(resources: Any, url: str, *headers: str) -> Any:
    return simulate(resources, parse_request(url, "GET", headers), Target(CLIENT))


def test_a_redirect_is_a_configured_answer(shop: Any) -> None:
    result = shop_route(shop, "http://web.shop.mesh:8000/old/page?q=1")
    assert result.outcome.routed and result.outcome.status == 302
    assert result.action is not None and result.action["location"] == "http://web.shop.mesh:8000/new?q=1"


def test_a_direct_response(shop: Any) -> None:
    result = shop_route(shop, "http://web.shop.mesh:8000/tea")
    assert (result.outcome.status, result.outcome.routed, result.route_name) == (418, True, "teapot")


def test_an_abort_fault_answers_every_request(shop: Any) -> None:
    result = shop_route(shop, "http://web.shop.mesh:8000/", "x-fail: yes")
    assert (result.outcome.status, result.outcome.flag) == (503, "FI")
    assert result.action is not None and result.action["fault"]["abort"] == {"http_status": 503, "percent": 100.0}


def test_delay_timeout_mirror_regex_and_query_are_shown(shop: Any) -> None:
    result = shop_route(shop, "http://web.shop.mesh:8000/slow/42?debug=1")
    assert result.route_name == "slow" and result.outcome.routed
    assert result.action is not None
    assert result.action["fault"]["delay"] == {"fixed_delay": "2s", "percent": 50.0}
    assert result.action["timeout"] == "5s"
    assert result.action["mirrors"][0]["cluster"] == "outbound|8000||web.shop.mesh"
    # Without the query parameter the route does not match, and nothing after it does either.
    missed = shop_route(shop, "http://web.shop.mesh:8000/slow/42")
    assert (missed.outcome.status, missed.outcome.flag, missed.route_name) == (404, "NR", None)


def test_a_cluster_the_proxy_lacks_is_503_nc(shop: Any) -> None:
    result = shop_route(shop, "http://web.shop.mesh:8000/ghost")
    assert not result.outcome.routed
    assert (result.outcome.status, result.outcome.flag) == (503, "NC")


# -- against a real Envoy ----------------------------------------------------------------------

EDGE = "edge"
ROUTER = f"router~127.0.0.40~ingress.{EDGE}~{EDGE}.svc.cluster.local"


def edge_yaml(port: int, v1: Backend, v2: Backend) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: app, namespace: {EDGE}}}
spec:
  hosts: [app.{EDGE}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: app}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: app-v1, namespace: {EDGE}}}
spec: {{address: 127.0.0.41, ports: {{http: {v1.port}}}, labels: {{app: app, version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: app-v2, namespace: {EDGE}}}
spec: {{address: 127.0.0.42, ports: {{http: {v2.port}}}, labels: {{app: app, version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: app, namespace: {EDGE}}}
spec:
  host: app.{EDGE}.mesh
  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {EDGE}}}
spec:
  selector: {{istio: ingressgateway}}
  servers: [{{port: {{number: {port}, name: http, protocol: HTTP}}, hosts: [app.{EDGE}.mesh]}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: app, namespace: {EDGE}}}
spec:
  hosts: [app.{EDGE}.mesh]
  gateways: [ingress]
  http:
  - match: [{{headers: {{end-user: {{exact: jason}}}}}}, {{uri: {{prefix: /v2}}}}]
    route: [{{destination: {{host: app.{EDGE}.mesh, subset: v2, port: {{number: 9080}}}}}}]
  - match: [{{uri: {{exact: /gone}}}}]
    directResponse: {{status: 410}}
  - route: [{{destination: {{host: app.{EDGE}.mesh, subset: v1, port: {{number: 9080}}}}}}]
"""


@pytest.fixture(scope="module")
def edge() -> Iterator[tuple[int, Any]]:
    with ExitStack() as stack:
        v1 = stack.enter_context(Backend("v1", "127.0.0.41"))
        v2 = stack.enter_context(Backend("v2", "127.0.0.42"))
        port = free_port()
        snapshot = snapshot_from_yaml(edge_yaml(port, v1, v2), namespace=EDGE)
        resources = generate(snapshot, proxy_for(snapshot, ROUTER, {"LABELS": {"istio": "ingressgateway"}}))
        envoy = stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=ROUTER)))
        wait_for(lambda: _status(port, "/", {}) == 200, "the gateway routes", envoy.log)
        yield port, resources


def _send(port: int, path: str, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        conn.request("GET", path, headers={"Host": f"app.{EDGE}.mesh", **headers})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace").strip()
    finally:
        conn.close()


def _status(port: int, path: str, headers: dict[str, str]) -> int | None:
    try:
        return _send(port, path, headers)[0]
    except OSError:
        return None


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
@envoy_log_left_open
@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/", {}),
        ("/v2/x", {}),
        ("/a", {"end-user": "jason"}),
        ("/a", {"end-user": "bob"}),
        ("/gone", {}),
        ("/ghost", {}),
    ],
)
def test_simulate_agrees_with_envoy(edge: tuple[int, Any], path: str, headers: dict[str, str]) -> None:
    port, resources = edge
    given = [f"{k}:{v}" for k, v in headers.items()]
    result = simulate(
        resources, parse_request(f"http://app.{EDGE}.mesh:{port}{path}", "GET", given), Target(ROUTER, router=True)
    )
    status, body = _send(port, path, headers)
    if result.clusters:
        (chosen,) = result.clusters
        assert status == 200 and body == chosen.name.split("|")[2], (path, headers, chosen.name, body)
    else:
        assert status == result.outcome.status, (path, headers, result.outcome)


PASS_THROUGH = f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: db, namespace: {NS}}}
spec:
  hosts: [db.shop.mesh]
  addresses: [10.20.0.5]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 3306, name: mysql, protocol: TCP}}]
  endpoints: [{{address: 10.20.0.6}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: {NS}}}
spec:
  hosts: [api.example.com, pay.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{{number: 443, name: tls, protocol: TLS}}]
"""


def test_a_tcp_connection_and_a_tls_connection_by_sni() -> None:
    """--tcp: a connection Envoy passes through, to the address the proxy's DNS table gives the
    name (the TCP service's own loopback address); with --sni, on a listener TLS services share
    (no loopback range), the chain of that server name."""
    snapshot = snapshot_from_yaml(PASS_THROUGH, namespace=NS)
    resources = generate(snapshot, proxy_for(snapshot, CLIENT, {"DNS_PORT": "15053"}))
    tcp = simulate(resources, parse_connection("db.shop.mesh:3306"), Target(CLIENT))
    assert tcp.outcome.routed and tcp.action is not None and tcp.action["kind"] == "tcp_proxy"
    assert [c["name"] for c in tcp.action["clusters"]] == ["outbound|3306||db.shop.mesh"]
    own = snapshot.index.loopback["db.shop.mesh"]
    assert tcp.listener == f"{own}_3306"
    assert f"db.shop.mesh resolves to {own} (the proxy's DNS table)" in tcp.notes
    shared = snapshot_from_yaml(PASS_THROUGH, namespace=NS, mesh=MeshSettings(loopback_range=""))
    resources = generate(shared, proxy_for(shared, CLIENT))
    tls = simulate(resources, parse_connection("api.example.com:443", "pay.example.com"), Target(CLIENT))
    assert tls.outcome.routed and tls.action is not None
    assert [c["name"] for c in tls.action["clusters"]] == ["outbound|443||pay.example.com"]
    nowhere = simulate(resources, parse_connection("db.shop.mesh:5432"), Target(CLIENT))
    assert not nowhere.outcome.routed and "no listener for port 5432" in nowhere.outcome.reason


def test_tcp_through_the_command(mesh: Path) -> None:
    result = runner.invoke(
        app,
        [
            "simulate",
            "--tcp",
            "reviews.bookinfo.mesh:9080",
            "--config-dir",
            str(mesh),
            "--proxy",
            "sleep-vm.bookinfo",
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 1, result.output  # an HTTP port: a connection that is not HTTP fails there
    assert "serves HTTP" in json.loads(result.stdout)["outcome"]["reason"]
    usage = runner.invoke(app, ["simulate", "--sni", "x", "--config-dir", str(mesh), "--proxy", "sleep-vm.bookinfo"])
    assert usage.exit_code == 2


def test_a_gateway_https_redirect_answers_before_any_route() -> None:
    """A Gateway server with `httpsRedirect` sets the virtual host's `require_tls: ALL`: Envoy
    answers a plaintext request with a 301 to https, whatever the routes say; a request marked
    `x-forwarded-proto: https` is no different at a gateway, which sets that header itself."""
    text = edge_yaml(8080, Backend("v1", port=8001), Backend("v2", port=8002)).replace(
        "hosts: [app.edge.mesh]}]", "hosts: [app.edge.mesh], tls: {httpsRedirect: true}}]"
    )
    snapshot = snapshot_from_yaml(text, namespace=EDGE)
    resources = generate(snapshot, proxy_for(snapshot, ROUTER, {"LABELS": {"istio": "ingressgateway"}}))
    for headers in ((), ("x-forwarded-proto: https",)):
        result = simulate(
            resources, parse_request("http://app.edge.mesh:8080/gone?a=1", "GET", headers), Target(ROUTER, router=True)
        )
        assert (result.outcome.status, result.outcome.routed) == (301, True), result.outcome
        assert result.action is not None and result.action["location"] == "https://app.edge.mesh:8080/gone?a=1"
        assert "require_tls" in result.outcome.reason
