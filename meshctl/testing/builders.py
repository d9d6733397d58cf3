"""Build snapshots and proxies from Istio YAML text, the way the server does, for tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshctl.config.loader import load_text
from meshctl.config.model import Config
from meshctl.config.store import ConfigStore
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.files import FileRegistry
from meshctl.registry.serviceentry import build_file_model
from meshctl.server.discovery import Discovery
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import MeshSettings, Snapshot, build_snapshot
from meshctl.snapshot.node import parse_node_id
from meshctl.snapshot.proxy import Proxy


class InvalidFixture(Exception):
    """The YAML given to a builder does not load cleanly."""


def configs_from_yaml(text: str, *, namespace: str = "default") -> list[Config]:
    from meshctl.config.loader import LoadOptions

    result = load_text(text, "<fixture>", LoadOptions(default_namespace=namespace))
    if not result.ok:
        raise InvalidFixture("\n".join(str(f) for f in result.findings))
    return list(result.configs)


def snapshot_from_yaml(text: str, *, mesh: MeshSettings | None = None, namespace: str = "default") -> Snapshot:
    """A snapshot of the configs in `text`, with services from its ServiceEntries/WorkloadEntries."""
    configs = configs_from_yaml(text, namespace=namespace)
    return build_snapshot(configs, build_file_model(configs), mesh)


def proxy_for(
    snapshot: Snapshot,
    node_id: str = "sidecar~10.0.0.99~client.default~default.svc.cluster.local",
    metadata: Mapping[str, Any] | None = None,
) -> Proxy:
    return bind_proxy(parse_node_id(node_id, metadata), snapshot)


def gateway_mesh_yaml(
    *,
    namespace: str,
    service: str,
    backend_ip: str,
    gateway: str,
    gateway_ip: str,
    selector: str,
    host: str,
    service_port: int,
    gateway_port: int,
) -> str:
    """The smallest mesh with a gateway: one service (a ServiceEntry selecting one WorkloadEntry
    at `backend_ip`), a gateway VM (`gateway_ip`, label `istio: SELECTOR`), a Gateway serving
    `host` on `gateway_port`, and a VirtualService routing it to the service."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {service}, namespace: {namespace}}}
spec:
  hosts: [{service}.{namespace}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {service_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: {service}}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {service}-1, namespace: {namespace}}}
spec: {{address: {backend_ip}, labels: {{app: {service}}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {gateway}, namespace: {namespace}}}
spec: {{address: {gateway_ip}, labels: {{istio: {selector}}}}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {namespace}}}
spec:
  selector: {{istio: {selector}}}
  servers:
  - port: {{number: {gateway_port}, name: http, protocol: HTTP}}
    hosts: [{host}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {service}, namespace: {namespace}}}
spec:
  hosts: [{host}]
  gateways: [edge]
  http:
  - route:
    - destination: {{host: {service}.{namespace}.mesh, port: {{number: {service_port}}}}}
"""


def vm_behind_ingress_yaml(
    *,
    namespace: str,
    host: str,
    address: str,
    service_port: int,
    ingress_port: int,
    app_port: int,
    service_account: str = "reviews",
) -> str:
    """One service on one VM without iptables whose proxy takes its inbound traffic, as Istio
    has it on VMs: the ServiceEntry, the WorkloadEntry (its endpoint port is the proxy's ingress
    port; labelled as running a proxy, so clients use mutual TLS), and the Sidecar whose ingress
    listener binds that port on the VM's address and hands requests to the app on
    127.0.0.1:`app_port` (calling nothing itself, so it binds no outbound listener)."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: reviews, namespace: {namespace}}}
spec:
  hosts: [{host}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {service_port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: reviews}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v1, namespace: {namespace}}}
spec:
  address: {address}
  serviceAccount: {service_account}
  ports: {{http: {ingress_port}}}
  labels: {{app: reviews, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: reviews, namespace: {namespace}}}
spec:
  workloadSelector: {{labels: {{app: reviews}}}}
  ingress:
  - port: {{number: {ingress_port}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:{app_port}
  egress:
  - hosts: [./nothing.{namespace}.mesh]
"""


def file_discovery(mesh: MeshSettings | None = None) -> tuple[ConfigStore, Discovery]:
    """A config store, the file registry following it, and the server's snapshot builder over
    both, publishing nowhere: snapshots built from what is put in the store as `serve` builds
    them, one `build_next` at a time."""
    store = ConfigStore()
    files = FileRegistry()
    files.follow(store)

    async def publish(_snapshot: Snapshot, _seen: float) -> None:
        return None

    return store, Discovery(store, AggregateRegistry([files]), publish, mesh=mesh)
