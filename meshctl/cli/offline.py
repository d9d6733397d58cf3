"""A config tree as the server would see it, and a proxy named in it: what `dump` and `diff` share.

The offline commands promise to show what the server sends, so they take the server's path from
files to a snapshot: the same loader, the same duplicate rule (`merge_files`), the same file
registry, the same merge with Consul (files win a hostname both define), the same
`build_snapshot`. Nothing is re-implemented here.

One difference is deliberate. The server keeps the last good contents of a file that fails to
load; a command run on a directory has no last good contents, and output built from part of the
input would be trusted as the whole of it. So a tree with any error is refused: `OfflineError`
carries its findings, which the CLI's edge (`meshctl.cli.exits`) prints before its one line (exit 2).

A proxy is named by its full Envoy node id, or by its WorkloadEntry (`NAME.NAMESPACE`, or `NAME`
in the `-n` namespace). The node id is then built as the VM's bootstrap would have it:
`sidecar~IP~NAME.NAMESPACE~NAMESPACE.svc.cluster.local`, or `router~...` when a Gateway selects
the workload's labels (the VM runs a gateway, not a sidecar).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshctl.errors import MeshctlError, OfflineError
from meshctl.snapshot.interception import DEFAULT_DNS_PORT, InterceptionMode

if TYPE_CHECKING:
    from meshctl.config.findings import Finding
    from meshctl.config.model import Config
    from meshctl.registry.model import ServiceModel
    from meshctl.snapshot.model import MeshSettings, Snapshot
    from meshctl.snapshot.proxy import Proxy

MESH_CONFIG_HELP = "Istio's MeshConfig YAML, as serve --mesh-config reads it."


def mesh_from(path: Path | None) -> MeshSettings | None:
    """The settings of a MeshConfig file (None without one); OfflineError when it does not load."""
    if path is None:
        return None
    from meshctl.config.findings import Severity
    from meshctl.config.mesh import load_mesh_config

    settings, findings = load_mesh_config(path)
    errors = [str(f) for f in findings if f.severity is Severity.ERROR]
    if settings is None:
        raise OfflineError("; ".join(errors) or f"{path}: not a MeshConfig")
    return settings


INTERCEPTION_HELP = "NONE (no iptables, the VM default), REDIRECT or TPROXY: what the proxy's bootstrap says."


@dataclass(frozen=True, slots=True)
class LoadedTree:
    """A snapshot built from one directory (and Consul), with what a person should hear about it."""

    path: Path
    snapshot: Snapshot
    warnings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()


def load_tree(
    config_dir: Path,
    *,
    consul: str | None = None,
    namespace: str = "default",
    mesh: MeshSettings | None = None,
) -> LoadedTree:
    """Load `config_dir` (and Consul's catalog, read once) into a snapshot as the server would;
    raises OfflineError for a missing path, a file that fails to load, or an unreadable Consul."""
    from meshctl.config.loader import LoadOptions
    from meshctl.ingest import load_files
    from meshctl.registry.aggregate import merge_models
    from meshctl.snapshot.model import build_snapshot

    if not config_dir.exists():
        raise OfflineError(f"no such file or directory: {config_dir}")
    loaded = load_files([config_dir], LoadOptions(default_namespace=namespace))
    errors = loaded.errors
    if errors:
        raise OfflineError(
            f"{len(errors)} error(s) in {config_dir}: meshctl does not build config from broken input", errors
        )
    members: list[tuple[str, ServiceModel]] = [("files", loaded.services())]
    if consul is not None:
        members.append(("consul", _read_consul(consul)))
    model = merge_models(members)
    snapshot = build_snapshot(loaded.configs, model, mesh)
    return LoadedTree(config_dir, snapshot, tuple(loaded.warnings), tuple(model.notes))


def _read_consul(address: str) -> ServiceModel:
    """Consul's catalog, read once, with Consul's own environment variables (token, TLS) for
    everything but the address, as `meshctl services --consul` reads it."""
    from meshctl.registry.consul import read_consul_once
    from meshctl.registry.consul_http import ConsulOptions

    try:
        options = ConsulOptions.from_env(address=address)
    except (MeshctlError, OSError) as exc:
        raise OfflineError(str(exc)) from exc
    try:
        return read_consul_once(options)
    except (MeshctlError, OSError) as exc:  # its message names the address and what failed
        raise OfflineError(str(exc)) from exc


def workload_entries(snapshot: Snapshot) -> tuple[Config, ...]:
    """Every WorkloadEntry, in (namespace, name) order: the proxies a tree describes."""
    return snapshot.of_kind("WorkloadEntry")


def find_workload_entry(snapshot: Snapshot, ref: str, namespace: str = "default") -> Config | None:
    """The WorkloadEntry `NAME.NAMESPACE` (names may hold dots, so the whole reference is
    compared), else the one named `ref` in `namespace`."""
    entries = workload_entries(snapshot)
    for entry in entries:
        if f"{entry.name}.{entry.namespace}" == ref:
            return entry
    for entry in entries:
        if entry.name == ref and entry.namespace == namespace:
            return entry
    return None


def node_id_for(snapshot: Snapshot, entry: Config) -> str:
    """The node id the workload's Envoy would send: a router when a Gateway selects its labels."""
    from meshctl.config.labels import labels_match
    from meshctl.snapshot.model import spec

    labels = {**entry.labels, **spec(entry).labels}  # as `bind_proxy` layers them
    router = any(spec(gw).selector and labels_match(spec(gw).selector, labels) for gw in snapshot.of_kind("Gateway"))
    kind = "router" if router else "sidecar"
    return f"{kind}~{spec(entry).address}~{entry.name}.{entry.namespace}~{entry.namespace}.svc.cluster.local"


def is_node_id(ref: str) -> bool:
    return "~" in ref


#: The node metadata `meshctl bootstrap` writes by default for the DNS listener: offline commands
#: show the proxy as that bootstrap runs it.
DEFAULT_DNS = {"DNS_PORT": str(DEFAULT_DNS_PORT), "DNS_FORWARD": "true"}


def find_proxy(
    snapshot: Snapshot, ref: str, namespace: str = "default", interception: str = "NONE", *, grpc: bool = False
) -> Proxy | None:
    """The proxy `ref` names in `snapshot`: a full node id always names one (the server serves any
    node), a WorkloadEntry reference only when the entry exists. `interception` is what the
    proxy's node metadata says (`INTERCEPTION_MODE`, as `meshctl bootstrap --interception` writes
    it); `grpc`, that it is a proxyless gRPC node (`GENERATOR: grpc`). Raises OfflineError for
    a node id that is not Istio's format."""
    from meshctl.errors import NodeIdError
    from meshctl.snapshot.binding import bind_proxy
    from meshctl.snapshot.node import GRPC_GENERATOR, parse_node_id

    if is_node_id(ref):
        node_id = ref
    else:
        entry = find_workload_entry(snapshot, ref, namespace)
        if entry is None:
            return None
        node_id = node_id_for(snapshot, entry)
    try:
        metadata = {"INTERCEPTION_MODE": interception, **DEFAULT_DNS}
        if grpc:
            metadata["GENERATOR"] = GRPC_GENERATOR
        return bind_proxy(parse_node_id(node_id, metadata), snapshot)
    except NodeIdError as exc:
        raise OfflineError(str(exc)) from exc


def resolve_proxy(
    tree: LoadedTree, ref: str, namespace: str = "default", interception: str = "NONE", *, grpc: bool = False
) -> Proxy:
    """`find_proxy`, or an OfflineError that lists the proxies the tree does describe."""
    proxy = find_proxy(tree.snapshot, ref, namespace, interception, grpc=grpc)
    if proxy is None:
        raise OfflineError(f"--proxy {ref!r} names no WorkloadEntry in {tree.path}; {known_proxies(tree.snapshot)}")
    return proxy


def known_proxies(snapshot: Snapshot) -> str:
    names = [f"{e.name}.{e.namespace}" for e in workload_entries(snapshot)]
    if not names:
        return "it has none: give a full node id (TYPE~IP~NAME.NAMESPACE~DOMAIN)"
    return "known: " + ", ".join(names)


def hidden_port_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """Why the proxy has no outbound listener on a port its own app listens on, for each such
    port of a service it may call: the words `meshctl validate` says (MC0001)."""
    from meshctl.config.analysis import hidden_port_message
    from meshctl.snapshot.node import ProxyType
    from meshctl.snapshot.scope import ProxyScope

    if proxy.type is not ProxyType.SIDECAR or proxy.interception is not InterceptionMode.NONE:
        return []
    scope = ProxyScope(snapshot, proxy)
    own = {i.service.hostname for i in proxy.instances}
    notes = []
    for port in sorted(scope.proxy.app_ports):
        called = sorted(
            s.hostname for s in scope.services if s.hostname not in own and any(p.number == port for p in s.ports)
        )
        if called:
            served = next(
                (i.service.hostname for i in proxy.instances if port in i.endpoint.ports.values()), "a Sidecar ingress"
            )
            notes.append(hidden_port_message(proxy.workload or proxy.id, port, served, called))
    return notes


def bypassed_port_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """The workload's service ports no Sidecar ingress listener takes, on a proxy without
    iptables: clients reach the app there directly, where Istio (which redirects them) would
    apply the port's mutual TLS mode and the workload's policies."""
    from meshctl.snapshot.model import spec
    from meshctl.snapshot.node import ProxyType
    from meshctl.snapshot.scope import ProxyScope

    if proxy.type is not ProxyType.SIDECAR or proxy.interception is not InterceptionMode.NONE:
        return []
    sidecar = ProxyScope(snapshot, proxy).sidecar
    taken = {ing.port.number for ing in spec(sidecar).ingress} if sidecar is not None else set()
    ports = sorted({p for i in proxy.instances for p in i.endpoint.ports.values() if p and p not in taken})
    if not ports:
        return []
    listed = ", ".join(str(p) for p in ports)
    return [
        f"{proxy.workload or proxy.id} takes no inbound traffic on port(s) {listed} of its services: without "
        "iptables (INTERCEPTION_MODE NONE) clients reach the app there directly, so no PeerAuthentication, "
        "AuthorizationPolicy or RequestAuthentication applies (Istio, which redirects them, would); add a "
        "Sidecar ingress listener for the port, or run with INTERCEPTION_MODE REDIRECT"
    ]


def gateway_target_port_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """Gateway server ports that a service of the gateway's own workload maps to another port
    (`targetPort`, or the WorkloadEntry's port): Istio binds that target port (its
    `resolvePorts`, for a Kubernetes Service in front of the gateway); meshctl binds the server
    port, so mesh clients of that service, sent to the target port, find no listener."""
    from meshctl.snapshot.model import spec
    from meshctl.snapshot.node import ProxyType
    from meshctl.snapshot.scope import ProxyScope

    if proxy.type is not ProxyType.ROUTER:
        return []
    targets: dict[int, int] = {}
    for instance in proxy.instances:
        for port in instance.service.ports:
            target = instance.endpoint.ports.get(port.number)
            if target and target != port.number:
                targets.setdefault(port.number, target)
    notes = []
    for gateway in ProxyScope(snapshot, proxy).gateways:
        for server in spec(gateway).servers:
            number = server.port.number
            if number in targets:
                notes.append(
                    f"Gateway {gateway.namespace}/{gateway.name} server port {number} is bound as written; Istio "
                    f"binds {targets[number]}, the port the gateway's service maps it to, and mesh clients of that "
                    f"service connect to {targets[number]}: serve port {targets[number]} in the Gateway, or drop the "
                    "targetPort"
                )
    return notes


def proxy_note(proxy: Proxy) -> str:
    """One line for stderr saying which proxy the output is for, and what it was bound to."""
    bound = f"workload {proxy.workload}" if proxy.workload else "no workload (the id matches no WorkloadEntry)"
    return f"proxy {proxy.id}: {bound}"


def report(tree: LoadedTree) -> None:
    """Warnings and registry notes about a tree, on stderr, so stdout stays machine-readable."""
    from meshctl.cli import output as out

    if tree.warnings:
        out.print_findings(tree.warnings, "text", sys.stderr)
    for note in tree.notes:
        out.stderr_console().print(f"note: {note}", markup=False, soft_wrap=True)


def yaml_text(data: Any) -> str:
    """Plain data as block YAML, keys in the order given and long strings never folded, so that
    equal data gives equal text and a diff of two dumps shows only what changed."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.width = 1 << 16
    yaml.representer.sort_base_mapping_type_on_output = False  # keep the message's field order
    buffer = io.StringIO()
    yaml.dump(_plain(data), buffer)
    return buffer.getvalue()


def _plain(data: Any) -> Any:
    """Mappings as plain dicts: protobuf's JSON gives OrderedDicts for Any payloads, which a YAML
    dumper would tag `!!omap` where Envoy and kubectl users expect plain mappings."""
    if isinstance(data, Mapping):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    return data


def gateway_api_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """For a router bound to Gateway API Gateways: which routes attached to each listener (what
    Istio writes in the listener's `attachedRoutes` and the routes' parents), one line a listener."""
    from meshctl.config.gateway_api import is_synthetic
    from meshctl.config.model import ConfigKey
    from meshctl.snapshot.model import spec
    from meshctl.snapshot.node import ProxyType
    from meshctl.snapshot.scope import ProxyScope

    if proxy.type is not ProxyType.ROUTER:
        return []
    attached: dict[tuple[ConfigKey, str], list[str]] = {}
    for a in snapshot.gateway_api.attachments:
        if a.gateway is not None and a.listener is not None:
            attached.setdefault((a.gateway, a.listener), []).append(
                f"{a.route.kind} {a.route.namespace}/{a.route.name} ({', '.join(a.hosts)})"
            )
    notes = []
    for gateway in ProxyScope(snapshot, proxy).gateways:
        if not is_synthetic(gateway):
            continue
        owner, _, listener = gateway.annotations["internal.istio.io/parents"].partition("/")[2].rpartition("/")
        key = ConfigKey("KubernetesGateway", gateway.namespace, owner)
        listener = listener.rsplit(".", 1)[0]
        port = spec(gateway).servers[0].port.number
        routes = attached.get((key, listener), [])
        taken = ", ".join(routes) if routes else "no route"
        notes.append(
            f"Gateway API: Gateway {gateway.namespace}/{owner} listener {listener} (port {port}) takes {taken}"
        )
    return notes
