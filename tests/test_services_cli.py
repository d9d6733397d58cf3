"""`meshctl services`: what a person (table) and a tool (json, yaml) see for a config directory."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, ROOT, runner, subcommand_app
from ruamel.yaml import YAML

from meshctl.cli.services import services
from meshctl.testing.fake_consul import FakeConsul

app = subcommand_app("services", services)

BOOKINFO_HOSTS = [
    "details.bookinfo.mesh",
    "productpage.bookinfo.mesh",
    "ratings.bookinfo.mesh",
    "reviews.bookinfo.mesh",
    "www.googleapis.com",
]


def listing(*args: str) -> Any:
    result = runner.invoke(app, ["services", *args])
    assert result.exit_code == 0, result.output
    return result


def test_table_lists_the_examples_services_with_their_endpoints() -> None:
    lines = listing("--config-dir", str(EXAMPLES)).stdout.splitlines()
    assert lines[0].split() == ["SERVICE", "NAMESPACE", "PORTS", "RESOLUTION", "REGISTRY", "ENDPOINTS"]
    reviews = [line.split() for line in lines if line.startswith("reviews.bookinfo.mesh")]
    assert reviews == [
        ["reviews.bookinfo.mesh", "bookinfo", "http/9080/HTTP", "STATIC", "files", *endpoint]
        for endpoint in (
            ["10.10.0.41:8080", "app=reviews,version=v1", "HEALTHY"],
            ["10.10.0.42:8080", "app=reviews,version=v2", "HEALTHY"],
            ["10.10.0.43:8081", "app=reviews,version=v3", "HEALTHY"],
        )
    ]
    (books,) = [line.split() for line in lines if line.startswith("www.googleapis.com")]
    assert books == [
        *["www.googleapis.com", "bookinfo", "tls/443/TLS", "DNS", "files"],
        *["www.googleapis.com:443", "HEALTHY"],
    ]
    assert sorted({line.split()[0] for line in lines[1:]}) == BOOKINFO_HOSTS
    assert "10.10.0.2:" not in "\n".join(lines)  # the gateway's VM serves no ServiceEntry


def test_json_for_tools() -> None:
    data = json.loads(listing("--config-dir", str(EXAMPLES), "-o", "json").stdout)
    assert data["notes"] == []
    assert [s["hostname"] for s in data["services"]] == BOOKINFO_HOSTS
    reviews = next(s for s in data["services"] if s["hostname"] == "reviews.bookinfo.mesh")
    assert {k: reviews[k] for k in ("namespace", "registry", "origin", "resolution", "location", "exportTo")} == {
        "namespace": "bookinfo",
        "registry": "files",
        "origin": "ServiceEntry bookinfo/reviews",
        "resolution": "STATIC",
        "location": "MESH_INTERNAL",
        "exportTo": ["*"],
    }
    assert reviews["ports"] == [{"name": "http", "number": 9080, "protocol": "HTTP"}]
    v3 = next(e for e in reviews["endpoints"] if e["name"] == "reviews-v3-vm")
    assert v3 == {
        "address": "10.10.0.43",
        "ports": [{"servicePort": 9080, "port": 8081}],
        "labels": {"app": "reviews", "version": "v3"},
        "locality": "eu-west/zone-b",
        "weight": 0,
        "health": "HEALTHY",
        "healthReason": "",
        "serviceAccount": "bookinfo-reviews",
        "tlsMode": "disabled",
        "network": "",
        "name": "reviews-v3-vm",
        "namespace": "bookinfo",
    }
    assert [e["address"] for e in reviews["endpoints"]] == ["10.10.0.41", "10.10.0.42", "10.10.0.43"]


def test_yaml_has_the_same_content_as_json() -> None:
    as_json = json.loads(listing("--config-dir", str(EXAMPLES), "-o", "json").stdout)
    as_yaml = YAML(typ="safe", pure=True).load(io.StringIO(listing("--config-dir", str(EXAMPLES), "-o", "yaml").stdout))
    assert as_yaml == as_json


def test_namespace_filter() -> None:
    def hosts(namespace: str) -> list[str]:
        data = json.loads(listing("--config-dir", str(EXAMPLES), "-n", namespace, "-o", "json").stdout)
        return [s["hostname"] for s in data["services"]]

    assert hosts("bookinfo") == BOOKINFO_HOSTS
    assert hosts("shop") == []


SE_TEMPLATE = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  hosts: [{host}]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: DNS
"""


def test_a_host_defined_twice_is_noted_on_stderr_and_in_json(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SE_TEMPLATE.format(name="a", host="api.example.com"))
    (tmp_path / "b.yaml").write_text(SE_TEMPLATE.format(name="b", host="api.example.com"))
    result = listing("--config-dir", str(tmp_path), "-o", "json")
    (note,) = json.loads(result.stdout)["notes"]
    assert "ServiceEntry shop/a" in note and "ServiceEntry shop/b" in note
    assert "api.example.com" in result.stderr


def test_a_file_that_fails_to_load_is_reported_and_the_rest_listed(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(SE_TEMPLATE.format(name="a", host="api.example.com"))
    (tmp_path / "broken.yaml").write_text("kind: [\n")
    result = runner.invoke(app, ["services", "--config-dir", str(tmp_path), "-o", "json"])
    assert result.exit_code == 1
    assert [s["hostname"] for s in json.loads(result.stdout)["services"]] == ["api.example.com"]
    assert "broken.yaml" in result.stderr


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["services", "--config-dir", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such file or directory" in result.stderr
    assert result.stdout == ""


def test_no_source_is_a_usage_error() -> None:
    result = runner.invoke(app, ["services"])
    assert result.exit_code == 2
    assert "--config-dir" in result.stderr


@pytest.mark.parametrize("watch", [[], ["--watch"]])
def test_an_invalid_consul_address_is_a_usage_error(watch: list[str]) -> None:
    result = runner.invoke(app, ["services", "--consul", "ftp://consul:8500", *watch])
    assert result.exit_code == 2
    assert "invalid consul address" in result.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("watch", [[], ["--watch"]])
def test_an_unreachable_consul_is_an_error_not_an_empty_list(watch: list[str]) -> None:
    address = f"127.0.0.1:{closed_port()}"
    result = runner.invoke(app, ["services", "--consul", address, "-o", "json", *watch])
    assert result.exit_code == 2
    assert f"cannot read consul at http://{address}" in result.stderr
    assert result.stdout == ""


def register(consul: FakeConsul, service: str, instance: str, address: str, port: int) -> None:
    consul.register(
        {
            "Node": f"node-{instance}",
            "Address": address,
            "Service": {"Service": service, "ID": instance, "Port": port, "Meta": {"version": "v1"}},
        }
    )


WEB_IN_FILES = SE_TEMPLATE.format(name="web", host="web.service.consul")


@pytest.mark.consul
def test_files_and_consul_together_files_win_a_shared_host(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(WEB_IN_FILES)
    with FakeConsul() as consul:
        register(consul, "web", "web-1", "10.2.0.1", 8080)
        register(consul, "payments", "payments-1", "10.2.0.2", 9000)
        result = listing("--config-dir", str(tmp_path), "--consul", consul.address, "-o", "json")
    data = json.loads(result.stdout)
    by_host = {s["hostname"]: s for s in data["services"]}
    assert sorted(by_host) == ["payments.service.consul", "web.service.consul"]
    assert (by_host["web.service.consul"]["registry"], by_host["web.service.consul"]["resolution"]) == ("files", "DNS")
    payments = by_host["payments.service.consul"]
    assert payments["registry"] == "consul"
    assert [(e["address"], e["ports"], e["labels"]) for e in payments["endpoints"]] == [
        ("10.2.0.2", [{"servicePort": 9000, "port": 9000}], {"version": "v1"})
    ]
    (note,) = data["notes"]
    assert "ServiceEntry shop/web (files)" in note and "consul service web" in note


@pytest.mark.consul
def test_consul_alone_in_a_table() -> None:
    with FakeConsul() as consul:
        register(consul, "payments", "payments-1", "10.2.0.2", 9000)
        lines = listing("--consul", consul.url).stdout.splitlines()
    assert [line.split() for line in lines[1:]] == [
        [
            *["payments.service.consul", "default", "tcp-9000/9000/TCP", "STATIC", "consul"],
            *["10.2.0.2:9000", "version=v1", "HEALTHY"],
        ]
    ]


WATCH_SCRIPT = """
import typer
from meshctl.cli.services import services
app = typer.Typer()
app.command()(services)
app()
"""

WORKLOADS = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.mesh]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: reviews}}
"""

VM = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  address: {address}
  labels: {{app: reviews}}
"""


class Watching:
    """`meshctl services --watch -o json` in a process of its own, read one listing at a time."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WATCH_SCRIPT, *args, "-o", "json", "--watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.deadline = time.monotonic() + 20

    def next_listing(self) -> Any:
        assert self.process.stdout is not None
        while time.monotonic() < self.deadline:
            line = self.process.stdout.readline()
            if line.strip():
                return json.loads(line)
        raise AssertionError("no listing before the deadline")

    def __enter__(self) -> Watching:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def endpoint_addresses(listing: Any, host: str) -> list[str]:
    service = next(s for s in listing["services"] if s["hostname"] == host)
    return [e["address"] for e in service["endpoints"]]


@pytest.mark.timeout(30)
def test_watch_lists_again_after_a_file_change(tmp_path: Path) -> None:
    (tmp_path / "reviews.yaml").write_text(WORKLOADS + VM.format(name="vm-1", address="10.0.0.1"))
    with Watching("--config-dir", str(tmp_path)) as watching:
        assert endpoint_addresses(watching.next_listing(), "reviews.shop.mesh") == ["10.0.0.1"]
        (tmp_path / "vm2.yaml").write_text(VM.format(name="vm-2", address="10.0.0.2"))
        assert endpoint_addresses(watching.next_listing(), "reviews.shop.mesh") == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.consul
@pytest.mark.timeout(30)
def test_watch_follows_consul(tmp_path: Path) -> None:
    (tmp_path / "reviews.yaml").write_text(WORKLOADS)
    with FakeConsul() as consul, Watching("--config-dir", str(tmp_path), "--consul", consul.address) as watching:
        register(consul, "payments", "payments-1", "10.2.0.2", 9000)  # before or after the first read
        listing = watching.next_listing()
        while "payments.service.consul" not in {s["hostname"] for s in listing["services"]}:
            listing = watching.next_listing()
        assert endpoint_addresses(listing, "payments.service.consul") == ["10.2.0.2"]
        register(consul, "payments", "payments-2", "10.2.0.3", 9000)
        assert endpoint_addresses(watching.next_listing(), "payments.service.consul") == ["10.2.0.2", "10.2.0.3"]
