"""A real Envoy from `meshctl bootstrap`: Istio's runtime layer at work, and the Prometheus port.

One mesh for the module: `meshctl serve` on ports it picks, a backend on its own loopback address,
and an Envoy started from `meshctl bootstrap --admin-port A --stats-port S` output as is (A and S
free ports). The Envoy runs the bootstrap as given (`EnvoyProcess(admin_port=A)`), admin API
included: the Prometheus listener forwards to the admin port the bootstrap names.

- The VirtualService routes with a regex whose RE2 program (1336) is over Envoy's default limit
  (100) and within Istio's (32768): Envoy takes the routes (no NACK, meshctl sees every type
  ACKed) and routes by it. The regex test in tests/test_bootstrap.py shows the same config is
  refused without the runtime layer.
- The stats port answers `/stats/prometheus` with Envoy's stats, and 404 for the rest of the
  admin API, however the path is dressed up.
- Istio's tag extractors make names Prometheus labels: `cluster_name="xds-grpc"`,
  `listener_address="127.0.0.1_PORT"`, and for a generated cluster, once its stats name it as
  Istio does (`alt_stat_name: "outbound|PORT||HOST;"`), `cluster_name="outbound|PORT||HOST"`
  whole, dots and all. A static bootstrap of generated resources named that way shows it; the
  Envoy fed by `meshctl serve` shows it once meshctl/xds names its clusters so (until then its
  test is an expected failure). Traffic stats of a cluster that carried no request are not
  created (Istio's deferred stat creation).
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import needs_envoy, wait_for

from meshctl.bootstrap import BootstrapOptions, build_bootstrap
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.backends import Backend, send
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port, static_resources, with_static_secrets
from meshctl.testing.serve_process import ServeProcess
from meshctl.xds.generate import generate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_envoy,
]

NS = "e2e-boot"
CLIENT = f"sidecar~127.0.0.9~client.{NS}~{NS}.svc.cluster.local"
HOST = f"catalog.{NS}.mesh"
BACKEND = "127.0.0.33"
REGEX = "^/(alpha|beta|gamma|delta|epsilon){20,40}/[a-z0-9]{1,64}$"
MATCHING = "/" + "alpha" * 12 + "epsilon" * 10 + "/item42"


def mesh_yaml(port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: catalog, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: catalog}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: catalog-1, namespace: {NS}}}
spec: {{address: {BACKEND}, labels: {{app: catalog}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: catalog, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  http:
  - name: by-regex
    match:
    - uri:
        regex: '{REGEX}'
    route:
    - destination: {{host: {HOST}}}
"""


@dataclass(frozen=True)
class Mesh:
    server: ServeProcess
    envoy: EnvoyProcess
    service_port: int
    stats_port: int


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    directory = tmp_path_factory.mktemp("mesh")
    service_port, admin_port, stats_port = free_port(), free_port(), free_port()
    (directory / "catalog.yaml").write_text(mesh_yaml(service_port))
    with (
        Backend("catalog", BACKEND, service_port),
        ServeProcess([directory]) as server,
    ):
        try:
            flags = ["--admin-port", str(admin_port), "--stats-port", str(stats_port)]
            config = server.bootstrap(CLIENT, extra_args=flags)
            with EnvoyProcess(config, admin_port=admin_port) as envoy:
                yield Mesh(server, envoy, service_port, stats_port)
        finally:
            print(f"--- meshctl serve log:\n{server.log()[-4000:]}")


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    """One request to 127.0.0.1:`port`, the path sent as is (no normalizing on this side)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


# -- the runtime layer ------------------------------------------------------------------------------


def test_a_regex_istio_accepts_is_acked_and_routes(mesh: Mesh) -> None:
    port, envoy = mesh.service_port, mesh.envoy
    wait_for(lambda: send(port, HOST, path=MATCHING).backend == "catalog", "the regex route answering", envoy.log)
    # Envoy runs with Istio's limit, from the bootstrap's runtime layer.
    runtime = json.loads(envoy.admin("runtime"))["entries"]
    assert runtime["re2.max_program_size.error_level"]["final_value"] == "32768"

    # No NACK on either side: Envoy rejected no update, and meshctl saw every type ACKed.
    stats = envoy.stats()
    assert {name: n for name, n in stats.items() if name.endswith("update_rejected") and n} == {}
    (accepted,) = (n for name, n in stats.items() if name.endswith(f".rds.{port}.update_success"))
    assert accepted >= 1  # route config `PORT`, the one holding the regex
    (entry,) = (e for e in mesh.server.admin_json("/debug/syncz") if e["proxy"] == CLIENT)
    assert set(entry["types"]) == {"CDS", "EDS", "LDS", "RDS"}
    assert all(not t["nack"] and t["acked"] == t["sent"] for t in entry["types"].values()), entry

    # The regex is what routes: a path it does not match has no route.
    assert send(port, HOST, path="/alpha/item42").status == 404
    assert send(port, HOST, path="/" + "alpha" * 19 + "/item42").status == 404


def test_envoy_starts_without_warnings_about_the_bootstrap(mesh: Mesh) -> None:
    """No connection limit, said as Envoy 1.40 wants it: neither the warning that there is none nor
    the one about Istio's deprecated runtime key for it."""
    log = mesh.envoy.log()
    assert "no configured limit to the number of allowed active downstream connections" not in log
    assert "deprecated runtime key" not in log


def test_a_path_with_a_fragment_is_routed_without_it(mesh: Mesh) -> None:
    """Istio's `http_reject_path_with_fragment: false`: Envoy strips `#...` rather than answering 400."""
    reply = send(mesh.service_port, HOST, path=MATCHING + "#top")
    assert (reply.status, reply.backend) == (200, "catalog"), reply


# -- the Prometheus listener --------------------------------------------------------------------------


def test_stats_port_serves_prometheus_stats(mesh: Mesh) -> None:
    wait_for(lambda: get(mesh.stats_port, "/stats/prometheus")[0] == 200, "the stats port answering", mesh.envoy.log)
    status, body = get(mesh.stats_port, "/stats/prometheus")
    assert status == 200
    assert "# TYPE envoy_server_live gauge" in body
    assert "envoy_server_live{} 1" in body
    assert "envoy_cluster_manager_cds_update_success" in body
    # The query string reaches the admin API: its filters work as on the admin port.
    status, body = get(mesh.stats_port, "/stats/prometheus?filter=server\\.live")
    assert status == 200
    assert "envoy_server_live" in body
    assert "envoy_cluster_manager" not in body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/clusters"),
        ("GET", "/config_dump"),
        ("GET", "/stats"),
        ("GET", "/ready"),
        ("GET", "/"),
        ("GET", "/stats/prometheus/../config_dump"),
        ("GET", "/stats/prometheus/%2e%2e/config_dump"),
        ("GET", "//config_dump"),
        ("GET", "/stats/prometheusx"),
        ("POST", "/runtime_modify?re2.max_program_size.error_level=1"),
        ("POST", "/healthcheck/fail"),
        ("POST", "/quitquitquit"),
    ],
)
def test_stats_port_does_not_reach_the_rest_of_the_admin_api(mesh: Mesh, method: str, path: str) -> None:
    wait_for(lambda: get(mesh.stats_port, "/stats/prometheus")[0] == 200, "the stats port answering", mesh.envoy.log)
    status, _ = get(mesh.stats_port, path, method)
    assert status == 404
    # Nothing reached the admin API: Envoy runs, healthy, with its runtime as it was.
    assert mesh.envoy.running()
    assert mesh.envoy.admin("ready").strip() == "LIVE"
    runtime = json.loads(mesh.envoy.admin("runtime"))["entries"]
    assert runtime["re2.max_program_size.error_level"]["final_value"] == "32768"
    # The same request on the admin port does reach it (the 404 is the stats listener's).
    if method == "GET" and path in ("/clusters", "/config_dump"):
        assert "xds-grpc" in mesh.envoy.admin(path.lstrip("/"))


# -- Istio's stat names ---------------------------------------------------------------------------


def prometheus(port: int) -> list[str]:
    """The stats port's samples, comments left out."""
    status, body = get(port, "/stats/prometheus")
    assert status == 200
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def test_stats_port_labels_the_static_clusters_and_listeners(mesh: Mesh) -> None:
    wait_for(lambda: send(mesh.service_port, HOST, path=MATCHING).ok, "the catalog answering", mesh.envoy.log)
    samples = prometheus(mesh.stats_port)
    assert any(re.fullmatch(r'envoy_cluster_upstream_cx_total\{cluster_name="xds-grpc"\} [1-9]\d*', s) for s in samples)
    assert any(f'listener_address="127.0.0.1_{mesh.service_port}"' in s for s in samples)
    # The stats keep their plain names on the admin API, where tools filter them by name.
    assert "cluster.xds-grpc.upstream_cx_total: " in mesh.envoy.admin("stats?filter=upstream_cx_total")
    # Not split at the dash or read as part of the metric's name.
    assert not [s for s in samples if s.startswith("envoy_cluster_xds_grpc")]


def generated_cluster_label(port: int) -> str:
    return f'cluster_name="outbound|{port}||{HOST}"'


def test_stats_port_labels_a_generated_cluster_with_its_whole_name(mesh: Mesh) -> None:
    wait_for(lambda: send(mesh.service_port, HOST, path=MATCHING).ok, "the catalog answering", mesh.envoy.log)
    samples = prometheus(mesh.stats_port)
    label = generated_cluster_label(mesh.service_port)
    assert any(s.startswith("envoy_cluster_upstream_rq_total{") and label in s for s in samples)
    assert not [s for s in samples if "e2e_boot" in s.split("{")[0]]


UNUSED_HOST = f"unused.{NS}.mesh"


def unused_service_yaml(port: int) -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: unused, namespace: {NS}}}
spec:
  hosts: [{UNUSED_HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: unused}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: unused-1, namespace: {NS}}}
spec: {{address: 127.0.0.34, labels: {{app: unused}}}}
"""


def delimited(name: str) -> str:
    """`name` ended with Istio's `;` (once: meshctl/xds may already end it so)."""
    return name if name.endswith(";") else name + ";"


def named_as_istio(node: Any) -> Any:
    """Generated resources with Istio's stat names: every cluster's `alt_stat_name` and every HTTP
    connection manager's `stat_prefix` end with `;` (what meshctl/xds is asked to generate)."""
    if isinstance(node, dict):
        node = {k: named_as_istio(v) for k, v in node.items()}
        if str(node.get("@type", "")).endswith("HttpConnectionManager"):
            node["stat_prefix"] = delimited(node["stat_prefix"])
        return node
    if isinstance(node, list):
        return [named_as_istio(v) for v in node]
    return node


def test_istios_stat_names_become_whole_labels_and_unused_clusters_have_no_traffic_stats() -> None:
    """The bootstrap's stats settings, run by Envoy on the generated config named as Istio names
    it, static (no meshctl serve): the cluster and the connection manager are labels, whole."""
    service_port, admin_port, stats_port = free_port(), free_port(), free_port()
    snapshot = snapshot_from_yaml(mesh_yaml(service_port) + unused_service_yaml(free_port()), namespace=NS)
    generated = with_static_secrets(static_resources(generate(snapshot, proxy_for(snapshot, CLIENT))))
    for cluster in generated["clusters"]:
        cluster["alt_stat_name"] = delimited(cluster.get("alt_stat_name", cluster["name"]))
    options = BootstrapOptions("127.0.0.1", 1, admin_port=admin_port, stats_port=stats_port)
    config = build_bootstrap(parse_node_id(CLIENT), options)
    del config["dynamic_resources"]
    config["static_resources"]["clusters"] += generated["clusters"]
    config["static_resources"]["listeners"] += named_as_istio(generated["listeners"])
    config["static_resources"]["secrets"] = generated.get("secrets", [])

    with Backend("catalog", BACKEND, service_port), EnvoyProcess(config, admin_port=admin_port) as envoy:
        wait_for(lambda: send(service_port, HOST, path=MATCHING).ok, "the catalog answering", envoy.log)
        samples = prometheus(stats_port)
        label = generated_cluster_label(service_port)
        assert f"envoy_cluster_upstream_rq_total{{{label}}} 1" in samples
        assert any(
            s.startswith("envoy_http_downstream_rq_total{")
            and f'http_conn_manager_prefix="outbound_127.0.0.1_{service_port}"' in s
            for s in samples
        )
        assert not [s for s in samples if "e2e_boot" in s.split("{")[0]]
        # Deferred stat creation: the cluster that carried no request has its membership stats
        # and no traffic stats.
        unused = [line for line in envoy.admin("stats").splitlines() if f"||{UNUSED_HOST};." in line]
        assert any(".membership_total: 1" in line for line in unused), unused
        assert not [line for line in unused if ".upstream_rq_total" in line or ".upstream_cx_total" in line]
