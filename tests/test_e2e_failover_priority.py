"""End to end: a VM's Envoy, fed by `meshctl serve`, prefers the endpoint its labels and zone
point to, and fails over to the other when that one stops (outlier detection ejects it).

Two backends of one service, each an inline endpoint of the ServiceEntry on its own loopback
address: `near` shares the client's network and rack but not its zone, `far` its zone alone.
The client is a WorkloadEntry (zone-a, network n1, rack r1) whose Envoy gets its config from a
real `meshctl serve`. Either a DestinationRule's `failoverPriority: [rack, zone]` (Istio's
applyFailoverPriorities) or the ServiceEntry's `networking.istio.io/traffic-distribution:
PreferClose` (network, region, zone) ranks `near` first, where plain locality failover would
rank `far` first; both have outlier detection, so a stopped `near` is ejected and traffic moves
to `far`.
What a user sees is asserted: where a loop of requests through the client's Envoy lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import needs_envoy, wait_for

from meshctl.testing.backends import Backend, RequestLoop
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"api.{NS}.mesh"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
NEAR, FAR = "127.0.0.91", "127.0.0.92"

OUTLIER = (
    "    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}\n"
)
#: Two ways to rank the endpoints by closeness: a DestinationRule's failoverPriority (a
#: topology label and a label of the workloads), or the service's traffic distribution.
RULES = {
    "failoverPriority": (
        "",
        "    loadBalancer: {localityLbSetting: {failoverPriority: [rack, topology.kubernetes.io/zone]}}\n" + OUTLIER,
    ),
    "PreferClose": ("\n  annotations: {networking.istio.io/traffic-distribution: PreferClose}", OUTLIER),
}


def mesh_yaml(rule: str, service_port: int, app_port: int, client_port: int) -> str:
    annotations, policy = RULES[rule]
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: api
  namespace: {NS}{annotations}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {service_port}, name: http, protocol: HTTP, targetPort: {app_port}}}]
  endpoints:
  - {{address: {FAR}, locality: us-east/zone-a, network: n2, labels: {{rack: r2}}}}
  - {{address: {NEAR}, locality: us-east/zone-b, network: n1, labels: {{rack: r1}}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: client, namespace: {NS}}}
spec:
  hosts: [client.{NS}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {client_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: client}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client, namespace: {NS}}}
spec: {{address: 127.0.0.9, labels: {{app: client, rack: r1}}, locality: us-east/zone-a, network: n1}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: api, namespace: {NS}}}
spec:
  host: {HOST}
  trafficPolicy:
{policy}"""


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.parametrize("rule", sorted(RULES))
def test_traffic_stays_close_and_fails_over_when_the_close_endpoint_stops(
    rule: str, tmp_path: Path, stack: ExitStack
) -> None:
    service_port, app_port = free_port(), free_port()
    config = tmp_path / "mesh"
    config.mkdir()
    (config / "mesh.yaml").write_text(mesh_yaml(rule, service_port, app_port, free_port()))
    near = stack.enter_context(Backend("near", NEAR, app_port))
    stack.enter_context(Backend("far", FAR, app_port))
    server = stack.enter_context(ServeProcess([config]))
    stack.callback(lambda: print(f"--- meshctl serve log:\n{server.log()[-6000:]}"))
    envoy = stack.enter_context(EnvoyProcess(server.bootstrap(CLIENT)))
    stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-3000:]}"))

    with RequestLoop(service_port, HOST) as loop:
        loop.wait_for_answers(1, timeout=60)
        mark = loop.mark()
        loop.wait_for_answers(40)
        # Priority 0 holds one healthy endpoint, so Envoy sends it everything.
        assert set(loop.since(mark)) == {"near"}, loop.since(mark)

        near.stop()
        mark = loop.mark()
        wait_for(lambda: loop.settled_on("far", mark, count=20), "traffic on far after near stopped", envoy.log)
        ejected = envoy.admin("clusters")
        assert f"{NEAR}:{app_port}::health_flags::/failed_outlier_check" in ejected, ejected
