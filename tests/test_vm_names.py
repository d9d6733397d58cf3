"""Names on VMs: a loopback address per TCP-level host, and the sidecar's DNS table.

Generator-level tests on small snapshots; the traffic itself is in tests/test_e2e_vm_names.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import pytest
from conftest import needs_envoy

from meshctl.config.findings import Severity
from meshctl.config.mesh import mesh_settings
from meshctl.errors import NodeIdError
from meshctl.snapshot.loopback import allocate
from meshctl.snapshot.model import MeshSettings
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import proxy_for, snapshot_from_yaml
from meshctl.testing.envoy import validate_resources
from meshctl.xds import types
from meshctl.xds.generate import generate

CLIENT = "sidecar~10.0.0.99~client.shop~shop.svc.cluster.local"
DNS = {"DNS_PORT": "15053"}


def entry(name: str, namespace: str, host: str, port: int, protocol: str, *, extra: str = "") -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  hosts: [{host}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: p, protocol: {protocol}}}]
  endpoints: [{{address: 10.1.0.{len(name)}}}]
{extra}---
"""


MESH = (
    entry("pg-a", "db", "pg-a.db.mesh", 5432, "TCP")
    + entry("pg-b", "db", "pg-b.db.mesh", 5432, "TCP")
    + entry("web", "shop", "web.shop.svc.cluster.local", 9080, "HTTP")
    + entry("cart", "shop", "cart.shop.mesh", 9080, "HTTP")
    + entry("api", "shop", "api.shop.mesh", 7000, "TLS", extra="  addresses: [240.0.0.7]\n")
)


def listeners(text: str, node_id: str = CLIENT, metadata: Mapping[str, Any] | None = DNS, **mesh: Any) -> Any:
    snapshot = snapshot_from_yaml(text, mesh=MeshSettings(**mesh))
    resources = generate(snapshot, proxy_for(snapshot, node_id, metadata))
    return snapshot, resources, {str(lis.name): lis for lis in resources[types.LISTENER]}


def table(listener: Any) -> dict[str, list[str]]:
    """name -> addresses of a DNS listener's inline table."""
    from envoy.extensions.filters.udp.dns_filter.v3 import dns_filter_pb2

    (listener_filter,) = listener.listener_filters
    config = dns_filter_pb2.DnsFilterConfig()
    listener_filter.typed_config.Unpack(config)
    domains = config.server_config.inline_dns_table.virtual_domains
    return {d.name: list(d.endpoint.address_list.address) for d in domains}


def dns_config(listener: Any) -> Any:
    from envoy.extensions.filters.udp.dns_filter.v3 import dns_filter_pb2

    config = dns_filter_pb2.DnsFilterConfig()
    listener.listener_filters[0].typed_config.Unpack(config)
    return config


# -- the allocation -----------------------------------------------------------------------------


def test_allocation_is_a_pure_function_of_the_hosts() -> None:
    hosts = [f"svc-{i}.ns.mesh" for i in range(300)]
    first = allocate(hosts)
    assert dict(first) == dict(allocate(list(reversed(hosts))))  # any order, any replica, any run
    assert len(set(first.values())) == len(hosts)  # no two hosts share an address
    network = ipaddress.ip_network("127.240.0.0/16")
    assert all(ipaddress.ip_address(a) in network for a in first.values())


def test_collisions_are_settled_and_127_0_0_1_is_never_handed_out() -> None:
    hosts = [f"h{i}" for i in range(10)]
    small = allocate(hosts, "127.0.0.0/29")  # six usable addresses, one of them 127.0.0.1
    assert len(small) == 5 and len(set(small.values())) == 5
    assert "127.0.0.1" not in small.values()
    assert set(small) == set(sorted(hosts)[:5])  # the full range leaves the rest on 127.0.0.1
    assert allocate(hosts, "") == {}


def test_mesh_config_sets_the_range_and_refuses_one_outside_loopback() -> None:
    settings, findings = mesh_settings({"loopbackRange": "127.50.0.0/24"})
    assert settings is not None and settings.loopback_range == "127.50.0.0/24" and not findings
    settings, findings = mesh_settings({"loopbackRange": "10.0.0.0/16"})
    assert settings is None
    (finding,) = findings
    assert finding.severity is Severity.ERROR and finding.field == "loopbackRange"
    assert "127.0.0.0/8" in finding.message
    snapshot, _, by_name = listeners(MESH, loopback_range="127.50.0.0/24")
    own = snapshot.index.loopback
    assert own["pg-a.db.mesh"].startswith("127.50.0.")
    assert f"{own['pg-a.db.mesh']}_5432" in by_name


# -- listeners on their own addresses -----------------------------------------------------------


def test_two_tcp_services_on_one_port_listen_apart_and_http_stays_on_127_0_0_1() -> None:
    snapshot, _, by_name = listeners(MESH)
    own = snapshot.index.loopback
    assert set(own) == {"pg-a.db.mesh", "pg-b.db.mesh", "api.shop.mesh"}
    assert "127.0.0.1_5432" not in by_name
    for host in ("pg-a.db.mesh", "pg-b.db.mesh"):
        listener = by_name[f"{own[host]}_5432"]
        assert listener.address.socket_address.address == own[host]
        assert f"outbound|5432||{host}" in str(listener.filter_chains)
    assert "127.0.0.1_9080" in by_name


def test_redirect_mode_keeps_listening_on_service_addresses() -> None:
    _, _, by_name = listeners(MESH, metadata={**DNS, "INTERCEPTION_MODE": "REDIRECT"})
    assert "240.0.0.7_7000" in by_name
    assert not any(name.startswith("127.240.") for name in by_name)


# -- the DNS table ------------------------------------------------------------------------------


def test_no_dns_listener_unless_the_node_asks() -> None:
    _, _, by_name = listeners(MESH, metadata=None)
    assert not [n for n in by_name if n.startswith("dns_")]
    _, _, by_name = listeners(MESH, metadata={"DNS_PORT": "15053", "DNS_CAPTURE": "false"})
    assert not [n for n in by_name if n.startswith("dns_")]
    _, _, by_name = listeners(MESH, metadata={"DNS_CAPTURE": "true"})
    assert "dns_15053" in by_name  # Istio's ISTIO_META_DNS_CAPTURE alone: Istio's port


def test_a_node_with_a_bad_dns_port_is_refused_with_the_key_named() -> None:
    with pytest.raises(NodeIdError, match="DNS_PORT"):
        parse_node_id(CLIENT, {"DNS_PORT": "seventy"})


def test_table_answers_where_the_proxy_listens_with_istios_short_names() -> None:
    snapshot, _, by_name = listeners(MESH, metadata={"DNS_PORT": "5353"})
    listener = by_name["dns_5353"]
    assert listener.address.socket_address.address == "127.0.0.1"
    assert listener.address.socket_address.port_value == 5353
    assert listener.address.socket_address.protocol == 1  # UDP
    own = snapshot.index.loopback
    assert table(listener) == {
        "pg-a.db.mesh": [own["pg-a.db.mesh"]],
        "pg-b.db.mesh": [own["pg-b.db.mesh"]],
        "api.shop.mesh": [own["api.shop.mesh"]],
        "cart.shop.mesh": ["127.0.0.1"],
        # A NAME.NS.svc.SUFFIX host: also as NAME.NS.svc, NAME.NS and, in its namespace, NAME.
        "web.shop.svc.cluster.local": ["127.0.0.1"],
        "web.shop.svc": ["127.0.0.1"],
        "web.shop": ["127.0.0.1"],
        "web": ["127.0.0.1"],
    }


def test_short_name_alone_is_for_the_proxys_own_namespace() -> None:
    _, _, by_name = listeners(MESH, node_id="sidecar~10.0.0.98~client.db~db.svc.cluster.local")
    names = table(by_name["dns_15053"])
    assert "web.shop" in names and "web" not in names


def test_redirect_mode_answers_the_service_address() -> None:
    _, _, by_name = listeners(MESH, metadata={**DNS, "INTERCEPTION_MODE": "REDIRECT"})
    names = table(by_name["dns_15053"])
    assert names["api.shop.mesh"] == ["240.0.0.7"]
    assert "pg-a.db.mesh" not in names  # no address under iptables: left to the VM's resolvers


def test_a_sidecar_limiting_egress_to_one_namespace_limits_the_table() -> None:
    sidecar = """apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress:
  - hosts: [db/*]
"""
    _, resources, by_name = listeners(MESH + sidecar)
    assert set(table(by_name["dns_15053"])) == {"pg-a.db.mesh", "pg-b.db.mesh"}
    clusters = {c.name for c in resources[types.CLUSTER]}
    assert "outbound|9080||cart.shop.mesh" not in clusters  # scoped alike


def test_export_to_scopes_the_table() -> None:
    private = entry("secret", "db", "secret.db.mesh", 6379, "Redis", extra="  exportTo: [.]\n")
    _, _, by_name = listeners(MESH + private)
    assert "secret.db.mesh" not in table(by_name["dns_15053"])
    _, _, by_name = listeners(MESH + private, node_id="sidecar~10.0.0.98~client.db~db.svc.cluster.local")
    assert "secret.db.mesh" in table(by_name["dns_15053"])


def test_other_names_are_forwarded_unless_the_node_says_not() -> None:
    _, _, by_name = listeners(MESH)
    assert dns_config(by_name["dns_15053"]).HasField("client_config")
    _, _, by_name = listeners(MESH, metadata={**DNS, "DNS_FORWARD": "false"})
    assert not dns_config(by_name["dns_15053"]).HasField("client_config")


@needs_envoy
def test_envoy_accepts_the_dns_listener() -> None:
    _, resources, _ = listeners(MESH)
    validate_resources(resources)


def test_a_wildcard_host_is_answered_for_the_names_under_it() -> None:
    wildcard = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cdn, namespace: shop}
spec:
  hosts: ["*.cdn.example.com"]
  location: MESH_EXTERNAL
  resolution: NONE
  ports: [{number: 443, name: tls, protocol: TLS}]
"""
    snapshot, _, by_name = listeners(MESH + wildcard)
    assert "*.cdn.example.com" not in snapshot.index.loopback  # no one address for many names
    assert table(by_name["dns_15053"])["*.cdn.example.com"] == ["127.0.0.1"]


def test_under_iptables_the_answer_is_of_the_proxys_family() -> None:
    dual = entry("dual", "shop", "dual.shop.mesh", 8000, "TCP", extra="  addresses: [240.0.0.8, 2001:db8::8]\n")
    redirect = {**DNS, "INTERCEPTION_MODE": "REDIRECT"}
    _, _, v4 = listeners(MESH + dual, metadata=redirect)
    assert table(v4["dns_15053"])["dual.shop.mesh"] == ["240.0.0.8"]
    v6_node = "sidecar~2001:db8::99~client.shop~shop.svc.cluster.local"
    _, _, v6 = listeners(MESH + dual, node_id=v6_node, metadata=redirect)
    assert table(v6["dns_15053"])["dual.shop.mesh"] == ["2001:db8::8"]
