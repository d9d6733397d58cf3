"""`meshctl bootstrap`: Istio's runtime layer, CDS and LDS that wait for meshctl, the Prometheus and
health listeners, and the RE2 limit the runtime layer shares with `meshctl validate`.

Unit tests of the bootstrap's shape, the CLI's refusals, and Envoy's own verdict in validate mode
(`envoy --mode validate`, a tenth of a second): the generated bootstrap is accepted, and a regex is
accepted or refused by Envoy exactly where `meshctl validate` says so. tests/test_bootstrap_envoy.py
runs a real Envoy from this bootstrap.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import re2
from conftest import BOOTSTRAP_NODE, bootstrap, cli_bootstrap, needs_envoy, runner

from meshctl.bootstrap import (
    HEALTH_CLUSTER,
    HEALTH_PATH,
    HEALTH_PORT,
    READY_PATH,
    RUNTIME,
    STATS_CLUSTER,
    STATS_PATH,
    STATS_PORT,
    XDS_CLUSTER,
)
from meshctl.cli.app import app
from meshctl.config.validation.common import regex_problem
from meshctl.config.validation.regex_program import RE2_MAX_PROGRAM_SIZE, program_size_problem
from meshctl.testing.envoy import EnvoyError, validate_config

NODE6 = "sidecar~fd00::41~orders-vm.shop~shop.svc.cluster.local"
ROUTER = "router~10.10.0.2~edge-vm.shop~shop.svc.cluster.local"

#: Works under Istio (program size 1336), refused by Envoy's default limit of 100.
ISTIO_REGEX = "^/(alpha|beta|gamma|delta|epsilon){20,40}/[a-z0-9]{1,64}$"
#: Over Istio's limit too (program size 40504), though short and valid RE2.
HUGE_REGEX = "^/(alpha|beta|gamma|delta|epsilon|zeta|eta|theta){500,1000}$"

HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def static_layer(config: dict[str, Any]) -> dict[str, Any]:
    layers = config["layered_runtime"]["layers"]
    layer: dict[str, Any] = layers[0]["static_layer"]
    return layer


# -- the runtime layer ----------------------------------------------------------------------------


def test_runtime_layers_are_istios_values_then_the_admin_layer() -> None:
    layers = bootstrap()["layered_runtime"]["layers"]
    assert [layer["name"] for layer in layers] == ["global config", "admin"]
    assert layers[1] == {"name": "admin", "admin_layer": {}}
    assert layers[0]["static_layer"] == {
        "re2.max_program_size.error_level": 32768,
        "envoy.reloadable_features.http_reject_path_with_fragment": False,
    }


def test_validate_and_the_bootstrap_share_one_re2_limit() -> None:
    assert RE2_MAX_PROGRAM_SIZE == 32768  # Istio's pkg/bootstrap/config.go
    assert static_layer(bootstrap())["re2.max_program_size.error_level"] is RE2_MAX_PROGRAM_SIZE
    assert RUNTIME["re2.max_program_size.error_level"] is RE2_MAX_PROGRAM_SIZE


def test_no_limit_on_downstream_connections_as_envoy_140_takes_it() -> None:
    (monitor,) = bootstrap()["overload_manager"]["resource_monitors"]
    assert monitor["name"] == "envoy.resource_monitors.global_downstream_max_connections"
    assert monitor["typed_config"]["max_active_downstream_connections"] == 2147483647


def test_the_runtime_layer_is_a_copy_per_bootstrap() -> None:
    first = bootstrap()
    static_layer(first)["re2.max_program_size.error_level"] = 1
    assert static_layer(bootstrap())["re2.max_program_size.error_level"] == RE2_MAX_PROGRAM_SIZE


# -- waiting for the first config -------------------------------------------------------------------


def test_cds_and_lds_wait_for_meshctl_however_long_it_takes() -> None:
    """Istio's envoy_bootstrap.json `dynamic_resources`: initial_fetch_timeout 0s, over ADS, V3."""
    dynamic = bootstrap()["dynamic_resources"]
    for source in ("cds_config", "lds_config"):
        assert dynamic[source] == {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    assert dynamic["cds_config"] is not dynamic["lds_config"]  # no YAML anchors in the output
    assert "&id" not in runner.invoke(app, ["bootstrap", "--proxy", BOOTSTRAP_NODE]).stdout


def test_an_envoy_speaks_delta_xds_unless_told_state_of_the_world() -> None:
    """Istio's default since 1.22: a change reaches Envoy alone, not in a response naming every
    cluster and listener it holds (which Envoy then compares one by one on its main thread)."""
    assert cli_bootstrap()["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert cli_bootstrap("--delta")["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert cli_bootstrap("--sotw")["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"


# -- the health listener ------------------------------------------------------------------------------


def listeners(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {li["name"]: li for li in config["static_resources"].get("listeners", [])}


def clusters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def test_a_router_answers_health_checks_from_envoys_readiness() -> None:
    config = bootstrap(ROUTER, admin_port=15001)
    listener = listeners(config)[HEALTH_CLUSTER]
    assert listener["address"] == {"socket_address": {"address": "0.0.0.0", "port_value": HEALTH_PORT}}
    assert (HEALTH_PORT, HEALTH_PATH, READY_PATH) == (15021, "/healthz/ready", "/ready")
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["normalize_path"] is True
    assert manager["stat_prefix"] == "agent"  # Istio's, for this listener
    (vhost,) = manager["route_config"]["virtual_hosts"]
    assert vhost["routes"] == [
        {"match": {"path": HEALTH_PATH}, "route": {"cluster": HEALTH_CLUSTER, "prefix_rewrite": READY_PATH}}
    ]
    (endpoint,) = clusters(config)[HEALTH_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"] == {"socket_address": {"address": "127.0.0.1", "port_value": 15001}}
    # Istio's static listeners answer when a connection limit or overload turns traffic away.
    for name in (HEALTH_CLUSTER, STATS_CLUSTER):
        assert listeners(config)[name]["ignore_global_conn_limit"] is True
        assert listeners(config)[name]["bypass_overload_manager"] is True


def test_a_sidecar_has_no_health_listener_unless_given_a_port() -> None:
    assert HEALTH_CLUSTER not in listeners(bootstrap())
    assert HEALTH_CLUSTER not in clusters(bootstrap())
    config = bootstrap(health_port=16021)
    assert listeners(config)[HEALTH_CLUSTER]["address"]["socket_address"]["port_value"] == 16021


def test_health_port_zero_means_none_for_a_router_too() -> None:
    config = bootstrap(ROUTER, health_port=0)
    assert HEALTH_CLUSTER not in listeners(config)
    assert HEALTH_CLUSTER not in clusters(config)


def test_health_listener_on_ipv6_node_binds_the_ipv6_wildcard() -> None:
    config = bootstrap(NODE6, admin_address="::", health_port=16021)
    assert listeners(config)[HEALTH_CLUSTER]["address"]["socket_address"]["address"] == "::"
    address = clusters(config)[HEALTH_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert address["endpoint"]["address"]["socket_address"]["address"] == "::1"


@pytest.mark.parametrize(
    ("node_id", "options", "problem"),
    [
        (ROUTER, {"admin_port": 15021}, "the health port and the admin port are both 15021"),
        (ROUTER, {"stats_port": 15021}, "the health port and the stats port are both 15021"),
        (ROUTER, {"admin_port": 0, "stats_port": 0}, "the health listener forwards to the admin port"),
        (BOOTSTRAP_NODE, {"health_port": 70000}, "the health port 70000 is not a TCP port"),
    ],
)
def test_build_bootstrap_refuses_a_health_listener_it_cannot_build(
    node_id: str, options: dict[str, int], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        bootstrap(node_id, **options)


def test_cli_health_port() -> None:
    def health_ports(config: dict[str, Any]) -> list[int]:
        return [
            li["address"]["socket_address"]["port_value"]
            for li in listeners(config).values()
            if li["name"] == HEALTH_CLUSTER
        ]

    assert health_ports(cli_bootstrap()) == []
    assert health_ports(cli_bootstrap(node_id=ROUTER)) == [15021]
    assert health_ports(cli_bootstrap("--health-port", "0", node_id=ROUTER)) == []
    assert health_ports(cli_bootstrap("--health-port", "16021")) == [16021]
    result = runner.invoke(app, ["bootstrap", "--proxy", "edge-vm.shop", "--ip", "10.10.0.2", "--router"])
    assert result.exit_code == 0
    assert f"name: {HEALTH_CLUSTER}" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--health-port", "15000"], "--health-port 15000: the health port and the admin port are both 15000"),
        (["--health-port", "15090"], "the health port and the stats port are both 15090"),
        (["--health-port", "65536"], "--health-port"),
    ],
)
def test_cli_refuses_a_health_port_envoy_could_not_serve(args: list[str], says: str) -> None:
    result = runner.invoke(app, ["bootstrap", "--proxy", ROUTER, *args])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())


def test_cli_names_the_default_health_port_of_a_router_when_it_clashes() -> None:
    result = runner.invoke(app, ["bootstrap", "--proxy", ROUTER, "--admin-port", "15021"])
    assert result.exit_code == 2
    assert "--health-port 15021: the health port and the admin port are both 15021" in result.output
    assert "--health-port 0" in result.output


# -- the Prometheus listener ----------------------------------------------------------------------


def test_stats_listener_serves_only_prometheus_stats_from_the_admin_api() -> None:
    config = bootstrap(admin_port=15001)
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"] == {"socket_address": {"address": "0.0.0.0", "port_value": STATS_PORT}}
    assert STATS_PORT == 15090
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["normalize_path"] is True
    (vhost,) = manager["route_config"]["virtual_hosts"]
    assert vhost["routes"] == [{"match": {"path": STATS_PATH}, "route": {"cluster": STATS_CLUSTER}}]
    assert STATS_PATH == "/stats/prometheus"

    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    assert [c["name"] for c in config["static_resources"]["clusters"]] == [XDS_CLUSTER, STATS_CLUSTER]
    (endpoint,) = clusters[STATS_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"] == {"socket_address": {"address": "127.0.0.1", "port_value": 15001}}
    # The admin API itself stays on loopback.
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_stats_listener_on_ipv6_node_binds_the_ipv6_wildcard() -> None:
    config = bootstrap(NODE6, admin_address="::", stats_port=16090)
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "::", "port_value": 16090}
    stats = config["static_resources"]["clusters"][1]
    address = stats["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"]["address"] == "::1"  # an admin API on every address, reached on loopback


def test_stats_port_zero_means_no_listener_and_no_cluster() -> None:
    config = bootstrap(stats_port=0)
    assert "listeners" not in config["static_resources"]
    assert [c["name"] for c in config["static_resources"]["clusters"]] == [XDS_CLUSTER]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"stats_port": 15000}, "both 15000"),
        ({"admin_port": 0}, "not 0"),
        ({"stats_port": 70000}, "not a TCP port"),
    ],
)
def test_build_bootstrap_refuses_a_stats_listener_it_cannot_build(options: dict[str, int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        bootstrap(**options)


def test_cli_stats_port() -> None:
    def stats_ports(config: dict[str, Any]) -> list[int]:
        return [li["address"]["socket_address"]["port_value"] for li in config["static_resources"].get("listeners", [])]

    assert stats_ports(cli_bootstrap()) == [15090]
    assert stats_ports(cli_bootstrap("--stats-port", "16090")) == [16090]
    assert stats_ports(cli_bootstrap("--stats-port", "0")) == []
    assert stats_ports(cli_bootstrap("--stats-port", "0", "--admin-port", "0")) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--stats-port", "15000"], "the stats port and the admin port are both 15000"),
        (["--admin-port", "0"], "must then be a fixed port"),
        (["--stats-port", "65536"], "--stats-port"),
        (["--stats-port", "-1"], "--stats-port"),
    ],
)
def test_cli_refuses_a_stats_port_envoy_could_not_serve(args: list[str], says: str) -> None:
    result = runner.invoke(app, ["bootstrap", "--proxy", BOOTSTRAP_NODE, *args])
    assert result.exit_code == 2
    assert says in result.output


# -- Envoy's verdict --------------------------------------------------------------------------------


@needs_envoy
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--stats-port", "0"],
        ["--delta", "--admin-port", "15001", "--stats-port", "16090"],
        ["--health-port", "16021", "--stats-inclusion-prefix", "cluster.outbound"],
        ["--stats-inclusion-suffix", "rq_timeout", "--stats-inclusion-regex", r"vhost\..*\.route\..*_5xx"],
    ],
)
def test_envoy_accepts_the_bootstrap(args: list[str]) -> None:
    validate_config(cli_bootstrap(*args))


@needs_envoy
def test_envoy_accepts_the_router_bootstrap() -> None:
    validate_config(cli_bootstrap(node_id=ROUTER))


@needs_envoy
def test_envoy_accepts_the_ipv6_bootstrap() -> None:
    validate_config(bootstrap(NODE6))


def with_regex_route(config: dict[str, Any], regex: str) -> dict[str, Any]:
    """`config` with one more static listener whose only route matches `regex` (as the generated
    route for a VirtualService `uri.regex` does: `safe_regex`, Envoy's default engine, RE2)."""
    config = copy.deepcopy(config)
    manager = {
        "@type": f"type.googleapis.com/{HCM}",
        "stat_prefix": "regex",
        "route_config": {
            "name": "9080",
            "virtual_hosts": [
                {
                    "name": "catalog",
                    "domains": ["*"],
                    "routes": [{"match": {"safe_regex": {"regex": regex}}, "direct_response": {"status": 200}}],
                }
            ],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }
        ],
    }
    listener = {
        "name": "127.0.0.1_9080",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9080}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }
    config["static_resources"].setdefault("listeners", []).append(listener)
    return config


@needs_envoy
def test_envoy_needs_the_runtime_layer_for_a_regex_istio_accepts() -> None:
    config = bootstrap()
    assert regex_problem(ISTIO_REGEX) is None
    validate_config(with_regex_route(config, ISTIO_REGEX))
    without = {k: v for k, v in config.items() if k != "layered_runtime"}
    with pytest.raises(EnvoyError, match="RE2 program size of 1336 > max program size of 100"):
        validate_config(with_regex_route(without, ISTIO_REGEX))


@needs_envoy
def test_envoy_refuses_the_regex_validate_refuses() -> None:
    size = re2.compile(HUGE_REGEX).programsize
    assert size > RE2_MAX_PROGRAM_SIZE
    problem = regex_problem(HUGE_REGEX)
    assert problem is not None
    assert f"program of size {size}, over Envoy's limit of {RE2_MAX_PROGRAM_SIZE}" in problem
    with pytest.raises(EnvoyError, match=f"RE2 program size of {size} > max program size of {RE2_MAX_PROGRAM_SIZE}"):
        validate_config(with_regex_route(bootstrap(), HUGE_REGEX))


class _Sized:
    def __init__(self, size: int) -> None:
        self.programsize = size


def test_program_size_problem_at_the_limit() -> None:
    assert program_size_problem(_Sized(RE2_MAX_PROGRAM_SIZE)) is None
    assert program_size_problem(_Sized(RE2_MAX_PROGRAM_SIZE + 1)) is not None
    assert program_size_problem(_Sized(101), limit=100) is not None


# -- meshctl validate ---------------------------------------------------------------------------------

MESH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: catalog
  namespace: shop
spec:
  hosts: [catalog.shop.mesh]
  location: MESH_INTERNAL
  ports: [{{number: 9080, name: http, protocol: HTTP}}]
  resolution: STATIC
  workloadSelector: {{labels: {{app: catalog}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: catalog-1
  namespace: shop
spec: {{address: 10.10.0.51, labels: {{app: catalog}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: catalog
  namespace: shop
spec:
  hosts: [catalog.shop.mesh]
  http:
  - match:
    - uri:
        regex: '{uri}'
    corsPolicy:
      allowOrigins:
      - regex: '{origin}'
    route:
    - destination: {{host: catalog.shop.mesh}}
"""


def test_validate_accepts_the_regex_istio_accepts(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH.format(uri=ISTIO_REGEX, origin=ISTIO_REGEX))
    result = runner.invoke(app, ["validate", "--strict", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_validate_reports_a_regex_over_the_limit_where_it_is(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(MESH.format(uri=HUGE_REGEX, origin=HUGE_REGEX))
    result = runner.invoke(app, ["validate", "-o", "json", str(tmp_path)])
    assert result.exit_code == 1, result.output
    findings = json.loads(result.stdout)
    lines = path.read_text().splitlines()
    assert {(f["field"], f["severity"], f["kind"], f["name"]) for f in findings} == {
        ("spec.http[0].match[0].uri.regex", "error", "VirtualService", "catalog"),
        ("spec.http[0].corsPolicy.allowOrigins[0].regex", "error", "VirtualService", "catalog"),
    }
    for finding in findings:
        assert HUGE_REGEX in lines[finding["line"] - 1]
        assert "RE2 program of size 40504, over Envoy's limit of 32768" in finding["message"]


def test_a_group_bootstrap_without_ip_leaves_the_address_to_the_server() -> None:
    """`--group` without `--ip`: the node id's IP is 0.0.0.0, which the server reads as "the
    address this VM connects from" (`meshctl.server.node_address`)."""
    result = runner.invoke(app, ["bootstrap", "--group", "api.shop", "--xds-address", "10.10.0.1:15010", "-o", "json"])
    assert result.exit_code == 0, result.output
    node = json.loads(result.stdout)["node"]
    assert node["id"] == "sidecar~0.0.0.0~api.shop~shop.svc.cluster.local"
    assert node["metadata"]["AUTO_REGISTER_GROUP"] == "api"
    refused = runner.invoke(app, ["bootstrap", "--group", "api.shop", "--proxy", "api.shop"])
    assert refused.exit_code == 2 and "takes the place of --proxy" in refused.output
