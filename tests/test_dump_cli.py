"""`meshctl dump`: Envoy's /config_dump for a proxy of a directory, as the server would send it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, GATEWAY, REVIEWS_V1, SLEEP, SLEEP_VM, runner, subcommand_app
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import json_format
from ruamel.yaml import YAML

from meshctl.cli.dump import dump
from meshctl.cli.offline import load_tree, resolve_proxy
from meshctl.server.cache import ResourceCache
from meshctl.testing.fake_consul import FakeConsul
from meshctl.xds import types

app = subcommand_app("dump", dump)


@pytest.fixture(scope="module")
def with_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bookinfo example plus a client VM."""
    tree = tmp_path_factory.mktemp("with-client")
    for f in sorted(EXAMPLES.glob("*/*.yaml")):
        (tree / f.name).write_text(f.read_text())
    (tree / "sleep.yaml").write_text(SLEEP_VM)
    return tree


def run(*args: str, config_dir: Path = EXAMPLES) -> Any:
    return runner.invoke(app, ["dump", "--config-dir", str(config_dir), *args])


def dumped(*args: str, config_dir: Path = EXAMPLES) -> Any:
    result = run(*args, config_dir=config_dir)
    assert result.exit_code == 0, result.output
    return result


SECTIONS = [
    (config_dump_shared_pb2.ClustersConfigDump, "clusters"),
    (config_dump_shared_pb2.EndpointsConfigDump, "endpoints"),
    (config_dump_shared_pb2.ListenersConfigDump, "listeners"),
    (config_dump_shared_pb2.RoutesConfigDump, "routes"),
    (config_dump_pb2.SecretsConfigDump, "secrets"),
]


def parse(text: str) -> dict[str, Any]:
    """The dump read back as istioctl reads it: a ConfigDump whose every Any unpacks."""
    dump_message = json_format.ParseDict(json.loads(text), config_dump_pb2.ConfigDump())
    out: dict[str, Any] = {}
    for packed, (section_type, key) in zip(dump_message.configs, SECTIONS, strict=True):
        section = section_type()
        assert packed.Unpack(section), packed.type_url
        out[key] = section
    return out


def names_and_versions(section: Any, key: str) -> dict[str, str]:
    """name -> version_info of every resource in a section, each resource unpacked."""
    out = {}
    if key == "clusters":
        for c in section.dynamic_active_clusters:
            cluster = cluster_pb2.Cluster()
            assert c.cluster.Unpack(cluster)
            out[cluster.name] = c.version_info
    elif key == "endpoints":
        for e in section.dynamic_endpoint_configs:
            cla = endpoint_pb2.ClusterLoadAssignment()
            assert e.endpoint_config.Unpack(cla)
            out[cla.cluster_name] = e.version_info
    elif key == "listeners":
        for entry in section.dynamic_listeners:
            listener = listener_pb2.Listener()
            assert entry.active_state.listener.Unpack(listener)
            assert listener.name == entry.name
            out[listener.name] = entry.active_state.version_info
    else:
        for r in section.dynamic_route_configs:
            rc = route_pb2.RouteConfiguration()
            assert r.route_config.Unpack(rc)
            out[rc.name] = r.version_info
    return out


def test_json_is_envoys_config_dump_with_istio_names() -> None:
    sections = parse(dumped("--proxy", "reviews-v1-vm.bookinfo", "-o", "json").stdout)
    clusters = names_and_versions(sections["clusters"], "clusters")
    assert {
        "outbound|9080|v1|reviews.bookinfo.mesh",
        "outbound|9080|v3|reviews.bookinfo.mesh",
        "outbound|9080||ratings.bookinfo.mesh",
        "outbound|9080|v1|ratings.bookinfo.mesh",
        "outbound|443||www.googleapis.com",
        "inbound|8080||",
        "BlackHoleCluster",
    } <= set(clusters)
    endpoints = names_and_versions(sections["endpoints"], "endpoints")
    assert "outbound|9080|v1|reviews.bookinfo.mesh" in endpoints
    # Without iptables the app keeps its own port; the proxy binds outbound ports on 127.0.0.1,
    # and a TLS host's on a loopback address of its own (127.240.0.0/16 by default).
    # Plus the DNS listener `meshctl bootstrap` asks for by default (--dns-port 15053).
    listeners = set(names_and_versions(sections["listeners"], "listeners"))
    (tls,) = listeners - {"127.0.0.1_9080", "dns_15053"}
    assert "dns_15053" in listeners
    assert tls.startswith("127.240.") and tls.endswith("_443"), listeners


def test_a_client_gets_its_outbound_listener_and_the_route_config_it_names(with_client: Path) -> None:
    sections = parse(dumped("-o", "json", "--proxy", "sleep-vm.bookinfo", config_dir=with_client).stdout)
    assert "127.0.0.1_9080" in names_and_versions(sections["listeners"], "listeners")
    assert set(names_and_versions(sections["routes"], "routes")) == {"9080"}


def test_route_configs_no_listener_names_are_left_out_as_envoy_never_asks(tmp_path: Path) -> None:
    """When reviews-v1's app listens on 9080 itself, it gets no outbound 9080 listener, and Envoy
    would never request the 9080 route config."""
    for f in sorted(EXAMPLES.glob("*/*.yaml")):
        (tmp_path / f.name).write_text(f.read_text())
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text(
        workloads.read_text().replace("  address: 10.10.0.41\n", "  address: 10.10.0.41\n  ports: {http: 9080}\n")
    )
    result = dumped("-o", "json", "--proxy", REVIEWS_V1, config_dir=tmp_path)
    assert names_and_versions(parse(result.stdout)["routes"], "routes") == {}
    assert "route config(s) 9080 left out" in result.stderr


def test_versions_are_the_ones_the_server_sends(with_client: Path) -> None:
    sections = parse(dumped("-o", "json", "--proxy", SLEEP, config_dir=with_client).stdout)
    tree = load_tree(with_client)
    served = ResourceCache().resources(tree.snapshot, resolve_proxy(tree, SLEEP))
    for type_url, (_, key) in zip(
        (types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE), SECTIONS[:4], strict=True
    ):
        expected = {name: r.version for name, r in served.of(type_url).items()}
        shown = {n: v for n, v in names_and_versions(sections[key], key).items() if v}
        assert shown == expected, key
    assert sections["clusters"].version_info and sections["listeners"].version_info


def test_inline_endpoints_of_dns_clusters_are_listed_without_a_version() -> None:
    sections = parse(dumped("-o", "json", "--proxy", REVIEWS_V1).stdout)
    endpoints = names_and_versions(sections["endpoints"], "endpoints")
    assert endpoints["outbound|443||www.googleapis.com"] == ""


def test_json_matches_envoys_field_names() -> None:
    data = json.loads(dumped("-o", "json", "--proxy", REVIEWS_V1, "--type", "clusters").stdout)
    (section,) = data["configs"]
    assert section["@type"] == "type.googleapis.com/envoy.admin.v3.ClustersConfigDump"
    first = section["dynamic_active_clusters"][0]
    assert set(first) == {"version_info", "cluster"}
    assert first["cluster"]["@type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster"


@pytest.mark.parametrize("section", ["clusters", "endpoints", "listeners", "routes"])
def test_type_selects_one_section(section: str) -> None:
    data = json.loads(dumped("-o", "json", "--proxy", REVIEWS_V1, "--type", section).stdout)
    (config,) = data["configs"]
    assert config["@type"].lower().endswith(f".{section}configdump")


def test_yaml_has_the_same_content_as_json() -> None:
    as_json = json.loads(dumped("-o", "json", "--proxy", REVIEWS_V1).stdout)
    text = dumped("--proxy", REVIEWS_V1, "-o", "yaml").stdout
    assert "!!" not in text  # plain mappings, no Python-specific tags
    assert YAML(typ="safe", pure=True).load(io.StringIO(text)) == as_json


def test_a_workload_name_and_its_node_id_give_the_same_output() -> None:
    by_name = dumped("--proxy", "reviews-v1-vm.bookinfo")
    by_id = dumped("--proxy", REVIEWS_V1)
    bare = dumped("--proxy", "reviews-v1-vm", "-n", "bookinfo")
    assert by_name.stdout == by_id.stdout == bare.stdout
    assert REVIEWS_V1 in by_name.stderr and "workload bookinfo/reviews-v1-vm" in by_name.stderr


def test_a_workload_selected_by_a_gateway_is_a_router() -> None:
    result = dumped("-o", "json", "--proxy", "ingressgateway-vm.bookinfo", "--type", "routes")
    assert GATEWAY in result.stderr
    assert result.stdout == dumped("-o", "json", "--proxy", GATEWAY, "--type", "routes").stdout
    routes = names_and_versions(parse_section(result.stdout, config_dump_shared_pb2.RoutesConfigDump), "routes")
    assert "http.8080" in routes


def parse_section(text: str, section_type: Any) -> Any:
    dump_message = json_format.ParseDict(json.loads(text), config_dump_pb2.ConfigDump())
    (packed,) = dump_message.configs
    section = section_type()
    assert packed.Unpack(section)
    return section


def table(text: str, header: str) -> list[str]:
    """The lines of the plain table that starts with `header` (up to the blank line after it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def columns(line: str) -> list[str]:
    """The cells of a plain table line: columns are at least three spaces apart."""
    return re.split(r" {3,}", line.strip())


def test_short_prints_istioctls_tables(with_client: Path) -> None:
    out = dumped("--proxy", SLEEP, "-o", "short", config_dir=with_client).stdout
    clusters = table(out, "SERVICE FQDN")
    assert columns(clusters[0]) == [*["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"]]
    assert ["reviews.bookinfo.mesh", "9080", "v1", "outbound", "EDS", "reviews.bookinfo"] in [
        line.split() for line in clusters
    ]
    assert ["BlackHoleCluster", "-", "-", "-", "STATIC"] in [line.split() for line in clusters]
    assert not any(line.split()[2:4] == ["-", "inbound"] for line in clusters[1:])  # sleep serves nothing
    endpoints = table(out, "ENDPOINT")
    assert columns(endpoints[0]) == ["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"]
    assert ["10.10.0.43:8081", "HEALTHY", "OK", "outbound|9080|v3|reviews.bookinfo.mesh"] in [
        line.split() for line in endpoints
    ]
    listeners = table(out, "ADDRESSES")
    assert columns(listeners[0]) == ["ADDRESSES", "PORT", "MATCH", "DESTINATION"]
    assert ["127.0.0.1", "9080", "ALL", "Route: 9080"] in [columns(line) for line in listeners]
    routes = table(out, "NAME")
    assert columns(routes[0]) == ["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"]
    reviews = [line for line in routes if "reviews.bookinfo.mesh" in line and line.startswith("9080")]
    assert reviews and all(line.split()[-1] == "reviews.bookinfo" for line in reviews)
    assert any("[headers: end-user]" in line for line in reviews)  # the canary route


def test_short_one_type() -> None:
    out = dumped("--proxy", REVIEWS_V1, "-o", "short", "--type", "clusters").stdout
    assert out.startswith("SERVICE FQDN") and "ENDPOINT" not in out and "VHOST NAME" not in out


@pytest.mark.consul
def test_consul_services_are_dumped_beside_the_files() -> None:
    with FakeConsul() as consul:
        consul.register(
            {
                "Node": "node-1",
                "Address": "10.2.0.2",
                "Service": {"Service": "payments", "ID": "payments-1", "Port": 9000},
            }
        )
        result = dumped("-o", "json", "--proxy", GATEWAY, "--consul", consul.address, "--type", "clusters")
    clusters = names_and_versions(parse_section(result.stdout, config_dump_shared_pb2.ClustersConfigDump), "clusters")
    assert "outbound|9000||payments.service.consul" in clusters
    assert "outbound|9080||reviews.bookinfo.mesh" in clusters


BROKEN = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\nspec: {hosts: 3}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--proxy", "nobody.bookinfo"], "known: details-v1-vm.bookinfo"),
        (["--proxy", "sidecar~10.0.0.1~x"], "TYPE~IP~NAME.NAMESPACE~DOMAIN"),
        (["--proxy", "gateway~10.0.0.1~x.y~y.svc"], "type must be sidecar or router"),
        (["--proxy", REVIEWS_V1, "--consul", "ftp://consul:1"], "invalid consul address"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_a_missing_directory_exits_2(tmp_path: Path) -> None:
    result = run("--proxy", REVIEWS_V1, config_dir=tmp_path / "nope")
    assert (result.exit_code, result.stdout) == (2, "")
    assert "no such file or directory" in result.stderr


def test_broken_input_is_refused_with_its_findings(tmp_path: Path) -> None:
    for f in EXAMPLES.glob("*/*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "zz-broken.yaml").write_text(BROKEN)
    result = run("--proxy", REVIEWS_V1, config_dir=tmp_path)
    assert (result.exit_code, result.stdout) == (2, "")
    assert "zz-broken.yaml:4" in result.stderr
    assert "does not build config from broken input" in result.stderr


def test_a_node_id_that_matches_no_workload_is_dumped_with_a_note() -> None:
    client = "sidecar~10.99.0.1~client.bookinfo~bookinfo.svc.cluster.local"
    result = dumped("-o", "json", "--proxy", client, "--type", "clusters")
    assert "no workload" in result.stderr
    assert "outbound|9080|v1|reviews.bookinfo.mesh" in result.stdout


def test_output_does_not_depend_on_hash_seeds() -> None:
    script = "import typer; from meshctl.cli.dump import dump; typer.run(dump)"
    outputs = set()
    for seed in ("1", "2", "3"):
        proc = subprocess.run(
            [sys.executable, "-c", script, "--config-dir", str(EXAMPLES), "--proxy", REVIEWS_V1],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        outputs.add(proc.stdout)
    assert len(outputs) == 1


def test_short_names_dns_clusters_by_their_resolution() -> None:
    """DNS clusters travel as Envoy's DNS cluster extension; the table still says how they resolve."""
    out = dumped("--proxy", REVIEWS_V1, "-o", "short", "--type", "clusters").stdout
    assert ["www.googleapis.com", "443", "-", "outbound", "STRICT_DNS"] in [line.split() for line in out.splitlines()]
