"""End to end: inputs every Envoy would refuse, written into a served directory (or its
MeshConfig) anyway, change nothing for the proxies: the server refuses each at load time, names
its file, line, resource and field, keeps the last good config, and the Envoy's config and
traffic stay as they were.

One Envoy, `meshctl serve` as users run it (with workload keys sent, so mutual TLS and the trust
domain are in play), and the inputs one after the other, each undone before the next: a
MeshConfig trust domain, access-log format and connect timeout; a RequestAuthentication with a
jwksUri and an inline key set Envoy cannot read; an AuthorizationPolicy with a 33,000-character
namespace (a regex over Envoy's program size limit); a DestinationRule duration no Envoy can
hold; a WorkloadEntry service account with a slash. The VM calls its own service, so the
request goes through an outbound listener and cluster and back through the inbound listener the
policies apply to.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, send
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"reviews.{NS}.mesh"
VM_IP = "127.0.0.41"
NODE = f"sidecar~{VM_IP}~reviews-v1.{NS}~{NS}.svc.cluster.local"
GOOD_MESH_CONFIG = "rootNamespace: istio-system\nenableAutoMtls: true\n"


def mesh_yaml(service_port: int, ingress_port: int, app_port: int, service_account: str = "reviews") -> str:
    """One VM whose proxy takes its inbound traffic (a Sidecar ingress) and calls its own
    service through an outbound listener."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: {NS}}}
spec:
  hosts: [{HOST}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {service_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v1, namespace: {NS}}}
spec:
  address: {VM_IP}
  serviceAccount: {service_account}
  ports: {{http: {ingress_port}}}
  labels: {{app: reviews, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: reviews, namespace: {NS}}}
spec:
  workloadSelector: {{labels: {{app: reviews}}}}
  ingress:
  - port: {{number: {ingress_port}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:{app_port}
  egress:
  - hosts: ["./*"]
"""


def resource(kind: str, name: str, spec: dict[str, object], api: str = "security.istio.io/v1") -> str:
    return json.dumps({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec})


RSA_EVEN_MODULUS = {"kty": "RSA", "n": "A" * 341 + "E", "e": "AQAB"}
BAD_JWKS = resource(
    "RequestAuthentication",
    "keys",
    {
        "selector": {"matchLabels": {"app": "reviews"}},
        "jwtRules": [
            {"issuer": "uri.example", "jwksUri": "http://a|b:80/keys"},
            {"issuer": "inline.example", "jwks": json.dumps({"keys": [RSA_EVEN_MODULUS]})},
        ],
    },
)
HUGE_POLICY = resource(
    "AuthorizationPolicy",
    "huge",
    {
        "selector": {"matchLabels": {"app": "reviews"}},
        "action": "ALLOW",
        "rules": [{"from": [{"source": {"namespaces": [NS, "n" * 33000]}}]}],
    },
)
ENDLESS_TIMEOUT = resource(
    "DestinationRule",
    "endless",
    {"host": HOST, "trafficPolicy": {"connectionPool": {"tcp": {"connectTimeout": "99999999999999h"}}}},
    api="networking.istio.io/v1",
)


class Vm:
    """The served directory, its MeshConfig, `meshctl serve`, the app and the VM's Envoy."""

    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.dir = root / "mesh"
        self.dir.mkdir()
        self.mesh_config = root / "meshconfig.yaml"
        self.mesh_config.write_text(GOOD_MESH_CONFIG)
        self.service_port, self.ingress_port = free_port(), free_port(VM_IP)
        self.app = stack.enter_context(Backend("reviews", "127.0.0.1"))
        self.write("mesh.yaml", self.mesh_yaml())
        args = ["--insecure-send-keys", "--mesh-config", str(self.mesh_config)]
        self.server = stack.enter_context(ServeProcess([self.dir], extra_args=args))
        stack.callback(lambda: print(f"--- meshctl serve log:\n{self.server.log()[-8000:]}"))
        self.envoy = stack.enter_context(EnvoyProcess(self.server.bootstrap(NODE)))
        stack.callback(lambda: print(f"--- envoy log:\n{self.envoy.log()[-4000:]}"))

    def mesh_yaml(self, service_account: str = "reviews") -> str:
        return mesh_yaml(self.service_port, self.ingress_port, self.app.port, service_account)

    def write(self, name: str, text: str) -> Path:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)
        return self.dir / name

    def traffic_flows(self) -> bool:
        """A request through the outbound listener, the cluster (mutual TLS) and the inbound
        listener reaches the app."""
        return all(send(self.service_port, HOST).ok for _ in range(3))

    def config(self) -> dict[str, str]:
        """Every dynamic resource Envoy holds, by type and name, with its version and update time."""
        dump = json.loads(self.envoy.admin("config_dump?include_eds"))
        out: dict[str, str] = {}
        for section in dump["configs"]:
            for key, value in section.items():
                if key.startswith("dynamic_") and isinstance(value, list):
                    for item in value:
                        out[f"{key}/{_name(item)}"] = json.dumps(item, sort_keys=True)
        return out

    def rejected(self) -> dict[str, int]:
        """Envoy's count of refused xDS updates, by counter."""
        stats = (line.split(": ", 1) for line in self.envoy.admin("stats").splitlines() if ": " in line)
        return {name: int(value) for name, value in stats if name.endswith("update_rejected") and value.isdigit()}

    def logged(self, *texts: str) -> Callable[[], bool]:
        return lambda: all(text in self.server.log() for text in texts)


def _name(item: dict[str, object]) -> str:
    """The name of one entry of a config dump section (a cluster, listener, route config, ...)."""
    if isinstance(item.get("name"), str):
        return str(item["name"])
    for inner in item.values():
        if isinstance(inner, dict):
            for field in ("name", "cluster_name"):
                if isinstance(inner.get(field), str):
                    return str(inner[field])
    return json.dumps(item, sort_keys=True)[:80]


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[Vm]:
    with ExitStack() as stack:
        yield Vm(tmp_path, stack)


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def test_inputs_envoy_would_refuse_leave_every_proxy_on_its_last_good_config(vm: Vm) -> None:
    wait_for(vm.traffic_flows, "traffic through the VM's proxy")
    good = vm.config()
    inbound = f"{VM_IP}_{vm.ingress_port}"
    assert any(inbound in key for key in good) and any("outbound|" in key for key in good), sorted(good)
    assert not any(vm.rejected().values())

    def stays_as_it_was(what: str) -> None:
        assert vm.config() == good, f"{what}: Envoy's config changed"
        assert not any(vm.rejected().values()), f"{what}: Envoy refused an update: {vm.rejected()}"
        assert vm.traffic_flows(), f"{what}: traffic stopped"

    mesh_configs = {
        "trustDomain": ("trustDomain: Cluster.Local\n", 'trustDomain "Cluster.Local" is invalid'),
        "accessLogFormat": (
            "accessLogFile: /dev/stdout\naccessLogFormat: '%FOO% %REQ(:path)%'\n",
            "FOO is not one of Envoy's access log commands",
        ),
        "connectTimeout": ("connectTimeout: 99999999999999h\n", "longer than Envoy can hold"),
    }
    for field, (text, message) in mesh_configs.items():
        vm.mesh_config.write_text(GOOD_MESH_CONFIG + text)
        wait_for(vm.logged(f"{vm.mesh_config}:", field, message), f"the server refusing MeshConfig {field}")
        stays_as_it_was(f"MeshConfig {field}")
        vm.mesh_config.write_text(GOOD_MESH_CONFIG)

    files = {
        "keys.yaml": (BAD_JWKS, "RequestAuthentication e2e/keys spec.jwtRules[0].jwksUri", "not a valid URL"),
        "huge.yaml": (
            HUGE_POLICY,
            "AuthorizationPolicy e2e/huge spec.rules[0].from[0].source.namespaces[1]",
            "too long",
        ),
        "endless.yaml": (
            ENDLESS_TIMEOUT,
            "DestinationRule e2e/endless spec.trafficPolicy",
            "longer than Envoy can hold",
        ),
    }
    for name, (text, where, message) in files.items():
        path = vm.write(name, text)
        wait_for(vm.logged(f"{path}:1:", where, message), f"the server refusing {name}")
        stays_as_it_was(name)
        path.unlink()
    wait_for(lambda: vm.server.log().count("RSA modulus n") >= 1, "the inline key set refused too (the same file)")

    path = vm.write("mesh.yaml", vm.mesh_yaml(service_account="payments/admin"))
    wait_for(
        vm.logged(f"{path}:", "WorkloadEntry e2e/reviews-v1 spec.serviceAccount", "not a valid service account"),
        "the server refusing the service account",
    )
    stays_as_it_was("serviceAccount")
