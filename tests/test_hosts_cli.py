"""`meshctl hosts`: a proxy's DNS table as /etc/hosts lines, and as a systemd-resolved drop-in."""

from __future__ import annotations

import configparser
from pathlib import Path

from conftest import runner

from meshctl.cli.app import app
from meshctl.snapshot.interception import DEFAULT_DNS_PORT

ROOT = Path(__file__).resolve().parent.parent


def service(name: str, namespace: str, port: int, protocol: str, export: str = "") -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  hosts: [{name}.{namespace}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: p, protocol: {protocol}}}]
  endpoints: [{{address: 10.2.0.{len(name)}}}]
{export}---
"""


MESH = (
    service("pg-a", "db", 5432, "TCP")
    + service("pg-b", "db", 5432, "TCP")
    + service("inventory", "shop", 9080, "HTTP")
    + service("orders", "shop", 9080, "HTTP")
    + service("private", "ops", 9090, "HTTP", "  exportTo: [.]\n")
    + """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: orders-vm, namespace: shop}
spec: {address: 10.2.0.41}
"""
)


def hosts(tmp_path: Path, *args: str) -> str:
    (tmp_path / "mesh.yaml").write_text(MESH)
    result = runner.invoke(app, ["hosts", "--config-dir", str(tmp_path), "--proxy", "orders-vm.shop", *args])
    assert result.exit_code == 0, result.output
    return str(result.stdout)


def test_hosts_lines_name_every_reachable_service_at_the_address_envoy_answers(tmp_path: Path) -> None:
    lines = [line.split() for line in hosts(tmp_path).splitlines() if not line.startswith("#")]
    by_name = {name: fields[0] for fields in lines for name in fields[1:]}
    assert by_name["inventory.shop.mesh"] == by_name["orders.shop.mesh"] == "127.0.0.1"
    pg_a, pg_b = by_name["pg-a.db.mesh"], by_name["pg-b.db.mesh"]
    assert pg_a != pg_b and pg_a.startswith("127.240.") and pg_b.startswith("127.240.")
    assert "private.ops.mesh" not in by_name  # exported to its own namespace alone
    # The same answers the Envoy's DNS listener gives: the dump's listeners are where they point.
    dump = runner.invoke(
        app, ["dump", "--config-dir", str(tmp_path), "--proxy", "orders-vm.shop", "--type", "listeners"]
    )
    assert pg_a in dump.stdout and pg_b in dump.stdout


def test_resolved_drop_in_routes_the_proxys_domains_to_its_dns_listener(tmp_path: Path) -> None:
    text = hosts(tmp_path, "--resolved", "--dns-port", "5353")
    config = configparser.ConfigParser()
    config.read_string(text)
    assert config["Resolve"]["DNS"] == "127.0.0.1:5353"
    assert config["Resolve"]["Domains"].split() == ["~db.mesh", "~shop.mesh", "~svc.cluster.local"]


def test_the_shipped_drop_in_points_at_the_bootstraps_dns_port() -> None:
    config = configparser.ConfigParser()
    config.read_string((ROOT / "systemd" / "meshctl-resolved.conf").read_text())
    assert config["Resolve"]["DNS"] == f"127.0.0.1:{DEFAULT_DNS_PORT}"
    assert all(d.startswith("~") for d in config["Resolve"]["Domains"].split())


def test_a_proxy_that_names_nothing_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(MESH)
    result = runner.invoke(app, ["hosts", "--config-dir", str(tmp_path), "--proxy", "nobody.shop"])
    assert result.exit_code == 2
    assert "orders-vm.shop" in result.output


def test_services_the_table_cannot_tell_apart_are_warned_about(tmp_path: Path) -> None:
    """With the loopback range turned off, two TCP services on 5432 both answer 127.0.0.1."""
    (tmp_path / "mesh").mkdir()
    (tmp_path / "mesh" / "mesh.yaml").write_text(MESH)
    (tmp_path / "meshconfig.yaml").write_text('loopbackRange: ""\n')
    args = ["hosts", "--config-dir", str(tmp_path / "mesh"), "--proxy", "orders-vm.shop"]
    shared = runner.invoke(app, [*args, "--mesh-config", str(tmp_path / "meshconfig.yaml")])
    assert shared.exit_code == 0, shared.output
    assert "pg-a.db.mesh, pg-b.db.mesh resolve to 127.0.0.1 and share port 5432" in shared.stderr
    apart = runner.invoke(app, args)
    assert apart.exit_code == 0 and "share port" not in apart.stderr


def test_wildcard_names_are_left_out_of_etc_hosts_and_routed_by_resolved(tmp_path: Path) -> None:
    wildcard = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cdn, namespace: shop}
spec:
  hosts: ["*.cdn.example.com"]
  location: MESH_EXTERNAL
  resolution: NONE
  ports: [{number: 443, name: tls, protocol: TLS}]
"""
    (tmp_path / "mesh.yaml").write_text(MESH + wildcard)
    args = ["hosts", "--config-dir", str(tmp_path), "--proxy", "orders-vm.shop"]
    lines = runner.invoke(app, args)
    assert lines.exit_code == 0, lines.output
    assert "*" not in lines.stdout and "left out: *.cdn.example.com" in lines.stderr
    drop_in = runner.invoke(app, [*args, "--resolved"])
    assert "~cdn.example.com" in drop_in.stdout.split("Domains=")[1].split()
