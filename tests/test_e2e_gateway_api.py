"""A real Envoy gateway routing per a Gateway API HTTPRoute, against the same routing written
as an Istio Gateway and VirtualService: both are generated, both Envoys are asked the same
requests, and `meshctl simulate` and the real answers must agree between the two.

The routes: a header match with a request header filter, a weighted split on a path prefix,
an exact-path redirect, and a rule whose only backend is in another namespace with no
ReferenceGrant (RefNotPermitted: it attaches no backend and answers 500, as Istio's
translation has it, where the Istio form says so outright).
"""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy

from meshctl.simulate.request import parse_request
from meshctl.simulate.simulator import Target, simulate
from meshctl.testing.backends import Backend
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy, envoy_log_left_open]

NS = "edge"
HOST = "shop.example.com"
ROUTER = f"router~127.0.0.30~ingress-vm.{NS}~{NS}.svc.cluster.local"


def services_yaml(reviews: Backend, ratings: Backend) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [reviews.{NS}.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: {reviews.host}, ports: {{http: {reviews.port}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ratings, namespace: {NS}}}
spec:
  hosts: [ratings.{NS}.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: {ratings.host}, ports: {{http: {ratings.port}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: db, namespace: other}}
spec:
  hosts: [db.other.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  endpoints: [{{address: {reviews.host}, ports: {{http: {reviews.port}}}}}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: ingress-vm, namespace: {NS}}}
spec:
  address: 127.0.0.30
  labels: {{gateway.networking.k8s.io/gateway-name: ingress}}
"""


def gateway_api_yaml(port: int) -> str:
    return f"""apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  gatewayClassName: istio
  listeners:
  - {{name: http, port: {port}, protocol: HTTP, hostname: "*.example.com"}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: {NS}}}
spec:
  parentRefs: [{{name: ingress}}]
  hostnames: [{HOST}]
  rules:
  - matches:
    - path: {{type: PathPrefix, value: /reviews}}
      headers: [{{name: x-canary, value: "yes"}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-route, value: canary}}]}}
    backendRefs: [{{name: ratings, port: 9080}}]
  - matches: [{{path: {{type: PathPrefix, value: /reviews}}}}]
    backendRefs:
    - {{name: reviews, port: 9080, weight: 80}}
    - {{name: ratings, port: 9080, weight: 20}}
  - matches: [{{path: {{type: Exact, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{path: {{type: ReplaceFullPath, replaceFullPath: /reviews}}, statusCode: 301}}
  - matches: [{{path: {{type: PathPrefix, value: /db}}}}]
    backendRefs: [{{name: db, namespace: other, port: 9080}}]
"""


def istio_yaml(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: ingress, namespace: {NS}}}
spec:
  selector: {{gateway.networking.k8s.io/gateway-name: ingress}}
  servers:
  - port: {{number: {port}, name: http, protocol: HTTP}}
    hosts: ["{NS}/*.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: shop, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  gateways: [ingress]
  http:
  - match: [{{uri: {{exact: /old}}}}]
    redirect: {{uri: /reviews, redirectCode: 301}}
  - match: [{{uri: {{prefix: /reviews}}, headers: {{x-canary: {{exact: "yes"}}}}}}]
    headers: {{request: {{set: {{x-route: canary}}}}}}
    route: [{{destination: {{host: ratings.{NS}.svc.cluster.local, port: {{number: 9080}}}}}}]
  - match: [{{uri: {{prefix: /reviews}}}}]
    route:
    - {{destination: {{host: reviews.{NS}.svc.cluster.local, port: {{number: 9080}}}}, weight: 80}}
    - {{destination: {{host: ratings.{NS}.svc.cluster.local, port: {{number: 9080}}}}, weight: 20}}
  - match: [{{uri: {{prefix: /db}}}}]
    directResponse: {{status: 500}}
"""


@dataclass
class Router:
    port: int
    resources: Any

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(status, the backend that answered, Location)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE)
        try:
            conn.request("GET", path, headers={"Host": HOST, **(headers or {})})
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("x-backend") or "", response.getheader("location") or ""
        finally:
            conn.close()

    def simulated(self, path: str, *headers: str) -> tuple[Any, ...]:
        result = simulate(
            self.resources, parse_request(f"http://{HOST}:{self.port}{path}", "GET", headers), Target(ROUTER)
        )
        return (
            result.outcome.status if result.outcome.status is not None else result.outcome.routed,
            tuple((u.name, u.weight) for u in result.clusters),
            # The whole route action (headers, retries, timeouts, redirect), but the listener's port.
            json.dumps(result.action, sort_keys=True).replace(str(self.port), "PORT"),
        )


@dataclass
class Pair:
    gateway_api: Router
    istio: Router
    reviews: Backend
    ratings: Backend


def _wait_until_routing(router: Router) -> None:
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = router.get("/reviews")
            if last[0] == 200:
                return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"the gateway did not route within {DEADLINE:.0f}s: {last!r}")


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with ExitStack() as stack:
        reviews = stack.enter_context(Backend("reviews", "127.0.0.31"))
        ratings = stack.enter_context(Backend("ratings", "127.0.0.32"))
        services = services_yaml(reviews, ratings)
        routers = []
        for make in (gateway_api_yaml, istio_yaml):
            port = free_port()
            snapshot = snapshot_from_yaml(services + "---\n" + make(port), namespace=NS)
            resources = generate(snapshot, proxy_for(snapshot, ROUTER))
            envoy = stack.enter_context(EnvoyProcess(bootstrap(resources, node_id=ROUTER)))
            stack.callback(lambda envoy=envoy: print(f"--- envoy log:\n{envoy.log()[-4000:]}"))
            routers.append(Router(port, resources))
        for router in routers:
            _wait_until_routing(router)
        yield Pair(routers[0], routers[1], reviews, ratings)


REQUESTS = [
    ("/reviews/1", ("x-canary: yes",)),
    ("/reviews/1", ()),
    ("/old", ()),
    ("/old/not-exact", ()),
    ("/db/rows", ()),
    ("/elsewhere", ()),
]


@pytest.mark.parametrize(("path", "headers"), REQUESTS)
def test_simulate_answers_alike_for_both_forms(pair: Pair, path: str, headers: tuple[str, ...]) -> None:
    assert pair.gateway_api.simulated(path, *headers) == pair.istio.simulated(path, *headers)


def test_simulate_follows_the_http_route(pair: Pair) -> None:
    canary = pair.gateway_api.simulated("/reviews/1", "x-canary: yes")
    assert canary[:2] == (True, ((f"outbound|9080||ratings.{NS}.svc.cluster.local", 100),))
    split = pair.gateway_api.simulated("/reviews/1")
    assert split[1] == (
        (f"outbound|9080||reviews.{NS}.svc.cluster.local", 80),
        (f"outbound|9080||ratings.{NS}.svc.cluster.local", 20),
    )
    assert pair.gateway_api.simulated("/db/rows")[:2] == (500, ())


def test_real_requests_get_the_same_answers_from_both(pair: Pair) -> None:
    for path, headers in [(p, dict(h.split(": ", 1) for h in hs)) for p, hs in REQUESTS if p != "/reviews/1" or hs]:
        answers = [router.get(path, headers) for router in (pair.gateway_api, pair.istio)]
        assert answers[0] == answers[1], path
    assert pair.gateway_api.get("/reviews/1", {"x-canary": "yes"})[:2] == (200, "ratings")
    assert pair.ratings.last_headers.get("x-route") == "canary"
    assert pair.gateway_api.get("/old") == (301, "", f"http://{HOST}/reviews")
    assert pair.gateway_api.get("/elsewhere")[0] == 404


def test_refused_cross_namespace_backend_answers_500_and_reaches_nothing(pair: Pair) -> None:
    pair.reviews.reset()
    assert pair.gateway_api.get("/db/rows")[0] == 500
    assert pair.reviews.served == 0


def test_the_weighted_split_reaches_both_backends_in_both_forms(pair: Pair) -> None:
    """200 requests at 80/20: each backend's expected share is 40 or more requests; fewer than
    10 would be five standard deviations off."""
    for router in (pair.gateway_api, pair.istio):
        seen = Counter(router.get("/reviews/1")[1] for _ in range(200))
        assert seen["reviews"] >= 100 and seen["ratings"] >= 10, seen


def test_a_path_prefix_matches_whole_segments_as_the_gateway_api_has_it(pair: Pair) -> None:
    """The Gateway API's PathPrefix `/reviews` takes `/reviews` and `/reviews/...`, never
    `/reviewsX` (Istio's path_separated_prefix for routes of gateway semantics), where an Istio
    VirtualService's plain prefix takes all three."""
    assert pair.gateway_api.get("/reviews")[0] == 200
    assert pair.gateway_api.get("/reviewsX")[0] == 404
    assert pair.istio.get("/reviewsX")[0] == 200
    assert pair.gateway_api.simulated("/reviewsX")[0] == 404
