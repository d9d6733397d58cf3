"""The fleet benchmark's mesh: services, their VMs, the proxies that connect, and the changes made.

A `Fleet` is the whole scenario as plain data, so the parent, the load-client workers and the
floor agree on it without talking: `services` ServiceEntries (or Consul services) with
`endpoints` WorkloadEntries (Consul instances) each, a DestinationRule and a VirtualService on a
share of them, and `proxies` sidecars, each the VM of one WorkloadEntry (spread so that every
service gets one before any gets two).

Scoping is what Istio operators do on large meshes: services are spread over namespaces and
each namespace's Sidecar imports `./*` plus a few shared services. With Consul, where every
service lives in one namespace, the same scopes are Sidecars selecting a `group` label that the
instances carry in their meta. Without scoping every proxy sees every service.

Each change the benchmark makes is written as an editor would (a temporary file renamed over
the target), and the fleet says exactly which proxies it affects: those whose scope imports the
host. That is what the load clients wait for, and what the floor pushes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from bench.meshgen import DR, SE, VS, WE, ip_for

PORT = 9080
#: The port the apps listen on: a sidecar without iptables binds 127.0.0.1:PORT for its app's
#: outbound calls, so the app itself must listen elsewhere.
TARGET_PORT = 8080
#: The route timeout and connection limit the generated VirtualServices and DestinationRules
#: start with; a change writes a different value.
BASE_TIMEOUT_S = 5
BASE_MAX_CONNECTIONS = 100
#: The address of the VM added and removed by the endpoint-churn phase: outside the generated
#: range (10.x.y.z from 1 up), so it can never collide with a generated WorkloadEntry.
CHURN_IP = "10.255.255.254"
#: The connect timeout the EnvoyFilter step sets, in seconds (generated clusters have others).
ENVOY_FILTER_TIMEOUT = 17

SIDECAR = """apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: {name}
  namespace: {ns}
spec:
{selector}  egress:
  - hosts:
{hosts}"""

CLIENT = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: {ns}
spec:
  address: {ip}
  labels:
    group: {group}
"""

CONSUL_DOMAIN = "service.consul"
CONSUL_NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The size and shape of a scenario."""

    services: int
    endpoints: int
    proxies: int
    namespaces: int = 10
    scoped: bool = True
    #: Services every scope imports, besides its own namespace (or group).
    shared: int = 5
    #: One service in `1 / routed_share` has a DestinationRule and a VirtualService.
    routed_share: float = 0.2
    consul: bool = False

    def __post_init__(self) -> None:
        if self.services < 2 or self.endpoints < 1 or self.proxies < 1:
            raise ValueError("a fleet needs at least 2 services, 1 endpoint each and 1 proxy")
        if self.proxies > self.services * self.endpoints:
            raise ValueError(f"{self.proxies} proxies but only {self.services * self.endpoints} VMs")


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    index: int
    name: str
    #: The Istio namespace (WorkloadEntry mode) or the scope group (Consul mode).
    group: str
    host: str
    routed: bool


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    node_id: str
    ip: str
    service: int
    group: str


@dataclass(frozen=True, slots=True)
class Change:
    """One change the benchmark makes, and what it should produce: `check` is evaluated by the
    load clients on what each affected proxy holds (see `bench.loadclient.holds`)."""

    name: str
    host: str
    check: tuple[Any, ...]
    affected: frozenset[str]
    kind: str  # "config" or "endpoint"


@dataclass(frozen=True, slots=True)
class Step:
    """A change as something to do: write or delete a file (relative to the mesh root), or
    register or deregister a Consul instance."""

    change: Change
    action: str
    path: str = ""
    text: str = ""
    body: dict[str, Any] | None = None


@dataclass
class Fleet:
    spec: FleetSpec
    root: Path
    services: list[ServiceInfo] = field(default_factory=list)
    proxies: list[ProxyInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = self.spec
        every = self.routed_every
        for i in range(spec.services):
            group = f"ns-{i % spec.namespaces}"
            host = f"svc-{i}.{CONSUL_DOMAIN}" if spec.consul else f"svc-{i}.{group}.mesh"
            # Every namespace gets its share of routed services.
            routed = bool(every) and (i // spec.namespaces) % every == 0
            self.services.append(ServiceInfo(i, f"svc-{i}", group, host, routed))
        for p in range(spec.proxies):
            i, j = p % spec.services, p // spec.services
            svc = self.services[i]
            if spec.consul:
                ip, name, ns = f"10.200.{p >> 8}.{p & 255}", f"client-{p}", CONSUL_NAMESPACE
            else:
                ip, name, ns = self.ip(i, j), f"{svc.name}-{j}", svc.group
            node_id = f"sidecar~{ip}~{name}.{ns}~{ns}.svc.cluster.local"
            self.proxies.append(ProxyInfo(node_id, ip, i, svc.group))

    @property
    def routed_every(self) -> int:
        share = self.spec.routed_share
        return max(1, round(1 / share)) if share > 0 else 0

    def ip(self, service: int, endpoint: int) -> str:
        return ip_for(service * self.spec.endpoints + endpoint + 1)

    @cached_property
    def shared(self) -> tuple[ServiceInfo, ...]:
        """The services every scope imports: the first routed ones, so changes to them reach all."""
        routed = [s for s in self.services if s.routed] or self.services
        return tuple(routed[: self.spec.shared])

    def sees(self, proxy: ProxyInfo, host: str) -> bool:
        """Whether `host` is in the proxy's scope (its Sidecar imports it)."""
        if not self.spec.scoped:
            return True
        svc = self.by_host[host]
        return svc.group == proxy.group or svc in self.shared

    @cached_property
    def by_host(self) -> dict[str, ServiceInfo]:
        return {s.host: s for s in self.services}

    def importers(self, host: str) -> frozenset[str]:
        return frozenset(p.node_id for p in self.proxies if self.sees(p, host))

    # -- files -------------------------------------------------------------------------------

    def namespace_of(self, svc: ServiceInfo) -> str:
        return CONSUL_NAMESPACE if self.spec.consul else svc.group

    def write(self) -> int:
        """Write the mesh's YAML under `root`; returns the number of resources written. In Consul
        mode only routing and Sidecars are files; the services come from `consul_instances`."""
        self.root.mkdir(parents=True, exist_ok=True)
        count = 0
        for svc in self.services:
            ns = self.namespace_of(svc)
            directory = self.root / ns
            directory.mkdir(exist_ok=True)
            if not self.spec.consul:
                docs = [SE.format(name=svc.name, ns=ns, host=svc.host, port=PORT, target=TARGET_PORT)]
                for j in range(self.spec.endpoints):
                    docs.append(self.workload_entry(svc, j, self.ip(svc.index, j)))
                _write(directory / f"{svc.name}.yaml", "---\n".join(docs))
                count += len(docs)
            if svc.routed:
                _write(self.routing_path(svc), self.routing(svc))
                count += 2
        if self.spec.consul:
            # Consul registers an instance on the port its app serves, the port clients call; a
            # VM without iptables cannot bind that port for outbound calls while its app does. So
            # here the proxies are client VMs, WorkloadEntries in files, calling Consul services.
            (self.root / CONSUL_NAMESPACE).mkdir(exist_ok=True)
            clients = [
                CLIENT.format(name=p.node_id.split("~")[2].split(".")[0], ns=CONSUL_NAMESPACE, ip=p.ip, group=p.group)
                for p in self.proxies
            ]
            _write(self.root / CONSUL_NAMESPACE / "clients.yaml", "---\n".join(clients))
            count += len(clients)
        if self.spec.scoped:
            for group in sorted({s.group for s in self.services}):
                directory = self.root / (CONSUL_NAMESPACE if self.spec.consul else group)
                directory.mkdir(exist_ok=True)
                _write(directory / f"sidecar-{group}.yaml", self.sidecar(group))
                count += 1
        return count

    def routing_path(self, svc: ServiceInfo) -> Path:
        return self.root / self.namespace_of(svc) / f"{svc.name}-routing.yaml"

    def routing(
        self, svc: ServiceInfo, *, timeout: int = BASE_TIMEOUT_S, max_connections: int = BASE_MAX_CONNECTIONS
    ) -> str:
        ns = self.namespace_of(svc)
        dr = DR.format(name=svc.name, ns=ns, host=svc.host, max_connections=max_connections)
        vs = VS.format(name=svc.name, ns=ns, host=svc.host, timeout=timeout)
        return f"{dr}---\n{vs}"

    def workload_entry(self, svc: ServiceInfo, j: int | str, ip: str) -> str:
        version = 1 + j % 2 if isinstance(j, int) else 1
        return WE.format(name=f"{svc.name}-{j}", ns=self.namespace_of(svc), ip=ip, app=svc.name, v=version)

    def sidecar(self, group: str) -> str:
        """The Sidecar of one scope: its own services plus the shared ones."""
        if self.spec.consul:
            own = [f"./{s.host}" for s in self.services if s.group == group]
            selector = f"  workloadSelector:\n    labels:\n      group: {group}\n"
            name = f"scope-{group}"
            ns = CONSUL_NAMESPACE
        else:
            own = ["./*"]
            selector = ""
            name = "default"
            ns = group
        shared = [f"{self.namespace_of(s)}/{s.host}" for s in self.shared if s.group != group]
        hosts = "".join(f'    - "{h}"\n' for h in [*own, *shared])
        return SIDECAR.format(name=name, ns=ns, selector=selector, hosts=hosts)

    def consul_instances(self) -> list[dict[str, Any]]:
        """Every instance as Consul's `PUT /v1/catalog/register` body."""
        return [
            self.consul_instance(svc, j, self.ip(svc.index, j))
            for svc in self.services
            for j in range(self.spec.endpoints)
        ]

    def consul_instance(self, svc: ServiceInfo, j: int, ip: str) -> dict[str, Any]:
        meta = {"protocol": "http", "version": f"v{1 + j % 2}", "group": svc.group, "app": svc.name}
        return {
            "Node": f"vm-{ip}",
            "Address": ip,
            "Service": {"Service": svc.name, "ID": f"{svc.name}-{j}", "Port": PORT, "Meta": meta},
        }

    # -- changes -----------------------------------------------------------------------------

    def route_change(self, step: int) -> tuple[Change, Path, str]:
        """A new route timeout on a shared service's VirtualService: every proxy that imports it."""
        svc = self.shared[0]
        timeout = BASE_TIMEOUT_S + step
        check = ("route_timeout", svc.host, timeout)
        change = Change("VirtualService", svc.host, check, self.importers(svc.host), "config")
        return change, self.routing_path(svc), self.routing(svc, timeout=timeout)

    def policy_change(self, step: int) -> tuple[Change, Path, str]:
        """A new connection limit on a DestinationRule of a service that is not shared: only the
        proxies of its own scope are affected (everyone without scoping)."""
        shared = set(self.shared)
        svc = next((s for s in self.services if s.routed and s not in shared), self.shared[-1])
        limit = BASE_MAX_CONNECTIONS + step
        check = ("max_connections", cluster_name(svc.host), limit)
        change = Change("DestinationRule", svc.host, check, self.importers(svc.host), "config")
        return change, self.routing_path(svc), self.routing(svc, max_connections=limit)

    def envoy_filter_change(self) -> tuple[Change, Path, str]:
        """An EnvoyFilter of the first namespace, selecting all of its proxies, that merges a
        connect timeout into the cluster of a shared service (every proxy has it): only that
        namespace's proxies are affected, scoped or not (with Consul every proxy is in it)."""
        ns = self.namespace_of(self.services[0])
        svc = self.churn_service
        check = ("connect_timeout", cluster_name(svc.host), ENVOY_FILTER_TIMEOUT)
        affected = frozenset(p.node_id for p in self.proxies if self.spec.consul or p.group == ns)
        text = (
            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\n"
            f"metadata: {{name: bench-timeout, namespace: {ns}}}\nspec:\n  configPatches:\n"
            f"  - applyTo: CLUSTER\n    match: {{context: SIDECAR_OUTBOUND, cluster: {{service: {svc.host}}}}}\n"
            f"    patch: {{operation: MERGE, value: {{connect_timeout: {ENVOY_FILTER_TIMEOUT}s}}}}\n"
        )
        return (
            Change("EnvoyFilter", svc.host, check, affected, "config"),
            self.root / ns / "bench-envoy-filter.yaml",
            text,
        )

    @property
    def churn_service(self) -> ServiceInfo:
        return self.shared[0]

    def endpoint_change(self, present: bool) -> Change:
        svc = self.churn_service
        check = ("endpoint", cluster_name(svc.host), CHURN_IP, present)
        return Change("endpoint added" if present else "endpoint removed", svc.host, check,
                      self.importers(svc.host), "endpoint")  # fmt: skip

    def churn_path(self) -> Path:
        svc = self.churn_service
        return self.root / self.namespace_of(svc) / f"{svc.name}-churn.yaml"

    def churn_entry(self, step: int = 0) -> str:
        """The churn VM's WorkloadEntry; with `step`, a VM at another address of its own (just
        below CHURN_IP's), so each step adds one the server has never seen."""
        ip = CHURN_IP if not step else f"10.255.{254 - step // 250}.{step % 250 + 1}"
        return self.workload_entry(self.churn_service, "churn", ip)

    def steps(self) -> list[Step]:
        """The changes of one run, in order; each is undone by a later one or left harmless."""
        out = []
        for change, path, text in (self.route_change(1), self.policy_change(1), self.envoy_filter_change()):
            out.append(Step(change, "write", self.relative(path), text))
        added, removed = self.endpoint_change(True), self.endpoint_change(False)
        if self.spec.consul:
            body = self.consul_instance(self.churn_service, 0, CHURN_IP)
            body["Service"]["ID"] = f"{self.churn_service.name}-churn"
            out.append(Step(added, "register", body=body))
            out.append(Step(removed, "deregister", body={"Node": body["Node"]}))
        else:
            path = self.relative(self.churn_path())
            out.append(Step(added, "write", path, self.churn_entry()))
            out.append(Step(removed, "unlink", path))
        return out

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def apply(self, step: Step, consul: Any = None) -> None:
        """Make the change: files as an editor writes them, Consul through its catalog API."""
        if step.action == "write":
            write_atomically(self.root / step.path, step.text)
        elif step.action == "unlink":
            (self.root / step.path).unlink()
        elif step.action == "register":
            consul.register(step.body)
        elif step.action == "deregister":
            consul.deregister(step.body)
        else:
            raise ValueError(f"unknown action {step.action!r}")

    def describe(self) -> str:
        s = self.spec
        scope = f"scoped by {'group Sidecars' if s.consul else 'namespace Sidecars'}" if s.scoped else "unscoped"
        source = "Consul" if s.consul else "ServiceEntry + WorkloadEntry"
        return (
            f"{s.services:,} services x {s.endpoints} endpoints ({source}), {s.namespaces} namespaces, "
            f"{scope} (+{len(self.shared)} shared), {s.proxies:,} proxies"
        )


def cluster_name(host: str) -> str:
    return f"outbound|{PORT}||{host}"


def write_atomically(path: Path, text: str) -> None:
    """As an editor saves: a temporary file in the same directory, renamed over the target."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def parse_int_list(text: str) -> Sequence[int]:
    return [int(x) for x in text.split(",") if x.strip()]
