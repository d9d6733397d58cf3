"""Mutual TLS on VMs without iptables: the ports where a workload's proxy never sees its traffic.

Without iptables (INTERCEPTION_MODE NONE, the VM default) inbound traffic reaches a proxy only on
the ports its Sidecar's `ingress` listeners declare: Envoy binds them on the VM's address and
hands the traffic to the app (`defaultEndpoint`). On every other endpoint port clients reach the
app itself. Two things then go wrong silently, and `meshctl validate` warns about them:

- MC0002: a STRICT PeerAuthentication applies to the workload, but the app takes plaintext on
  such a port: the policy is not enforced there. One warning per policy and workload, on the
  field that makes the port STRICT, listing the ports.
- MC0003: the WorkloadEntry is labelled `security.istio.io/tlsMode: istio`, so clients use auto
  mTLS towards it, and on such a port they open mutual TLS to an app that cannot take it. One
  warning per workload, on the label, listing the ports.

`meshctl validate` does not know each proxy's interception mode, so both assume the VM default
and say so; with REDIRECT or TPROXY every port goes through the proxy and neither applies. Each
rule is the one the server applies, read from configs instead of a snapshot:

- the Sidecar of a workload: a selector match in its namespace, else that namespace's default,
  else the root namespace's (`ProxyScope.sidecar`); an ingress listener with IPTABLES capture
  binds nothing without iptables, so it covers no port;
- the mode of each port: `security.peer_authentication.workload_mtls`, remembering the policy and
  field that decided it;
- endpoint ports: per ServiceEntry that selects the workload, the WorkloadEntry's `ports[name]`,
  else `targetPort`, else the port's number (the registry's rule; a `unix://` address has none, a
  hostname is an endpoint of DNS services only, UDP ports have no listener either way);
- auto mTLS towards a port: its ServiceEntry is MESH_INTERNAL and its namespace's mode is not
  DISABLE (`xds.clusters`); a DestinationRule's `tls` (which depends on the client) is not read.

Out of scope: Consul instances (not files), and WorkloadEntries of a WorkloadGroup (annotated
`istio.io/autoRegistrationGroup`), whose labels and ports come partly from the group's template.

Every lookup goes through an index (by namespace, or by namespace and one selector label), so a
mesh of thousands of workloads, each with its own Sidecar and policy, costs time linear in its size.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from meshctl.api.networking.v1alpha3 import service_entry_pb2, sidecar_pb2
from meshctl.api.security.v1beta1 import peer_authentication_pb2
from meshctl.config.findings import FieldPath
from meshctl.config.hosts import is_ip
from meshctl.config.labels import GROUP_ANNOTATION, TLS_MODE_LABEL, labels_match, selector_labels
from meshctl.config.model import Config, ConfigKey

_MTLS = peer_authentication_pb2.PeerAuthentication.MutualTLS
UNSET: Final = int(_MTLS.UNSET)
DISABLE: Final = int(_MTLS.DISABLE)
PERMISSIVE: Final = int(_MTLS.PERMISSIVE)
STRICT: Final = int(_MTLS.STRICT)
_SE = service_entry_pb2.ServiceEntry
_DNS: Final = frozenset({int(_SE.DNS), int(_SE.DNS_ROUND_ROBIN)})
_UNIX_PREFIX: Final = "unix://"
_MODE_PATH: Final[FieldPath] = ("spec", "mtls", "mode")

_NO_IPTABLES: Final = "on a VM without iptables"
_REDIRECT: Final = "run the proxy with INTERCEPTION_MODE REDIRECT"


class MtlsIssue(NamedTuple):
    """A warning of this module; `analysis` turns it into an AnalysisIssue."""

    code: str
    key: ConfigKey
    path: FieldPath
    message: str


@dataclass(frozen=True, slots=True)
class PortMode:
    """The mode in force on a port (PeerAuthentication.MutualTLS.Mode, never UNSET) and what
    decided it: a policy and its field, or nothing (Istio's default, PERMISSIVE)."""

    mode: int
    policy: Config | None = None
    path: FieldPath = ()


_DEFAULT: Final = PortMode(PERMISSIVE)


@dataclass(frozen=True, slots=True)
class WorkloadModes:
    """The modes of one workload: `default` on every port but those in `ports`."""

    default: PortMode = _DEFAULT
    ports: Mapping[int, PortMode] = field(default_factory=dict)

    def for_port(self, port: int) -> PortMode:
        return self.ports.get(port, self.default)


def _spec(config: Config) -> Any:
    """A config's spec, whose fields protobuf types only at run time."""
    return config.spec


def _oldest(configs: Iterable[Config]) -> Config | None:
    """The tie-break of `security.peer_authentication` between policies at one level."""
    return min(configs, key=lambda c: (c.created if c.created is not None else float("inf"), c.name), default=None)


class _BySelector:
    """Configs of one kind with a workload selector, found from a workload's labels: each is kept
    under one label of its selector, which every workload it selects carries, so a lookup costs the
    configs sharing a label with the workload rather than every config of its namespace."""

    def __init__(self) -> None:
        self._by_label: dict[tuple[str, str, str], list[tuple[Mapping[str, str], Config]]] = defaultdict(list)

    def add(self, selector: Mapping[str, str], config: Config) -> None:
        key, value = min(selector.items())
        self._by_label[config.namespace, key, value].append((selector, config))

    def matching(self, namespace: str, labels: Mapping[str, str]) -> list[Config]:
        """Every config of `namespace` whose selector matches `labels`, by name (each is kept
        under one label, so found once)."""
        found = [
            config
            for key, value in labels.items()
            for selector, config in self._by_label.get((namespace, key, value), ())
            if labels_match(selector, labels)
        ]
        return sorted(found, key=lambda c: c.key)


class PeerAuthentications:
    """A mesh's PeerAuthentications, by the level they apply at, with Istio's precedence
    (`security.peer_authentication`): mesh-wide, then namespace-wide, then workload."""

    def __init__(self, policies: Iterable[Config], root_namespace: str) -> None:
        self.root_namespace = root_namespace
        wide: dict[str, list[Config]] = defaultdict(list)
        self._selecting = _BySelector()
        self.any_strict = False
        for policy in policies:
            spec: Any = policy.spec
            selector = selector_labels(spec, "selector")
            if selector:
                self._selecting.add(selector, policy)
            else:
                wide[policy.namespace].append(policy)
            modes = [spec.mtls.mode, *(p.mode for p in spec.port_level_mtls.values())]
            self.any_strict = self.any_strict or STRICT in modes
        self._wide = {ns: _oldest(found) for ns, found in wide.items()}

    def modes(self, namespace: str, labels: Mapping[str, str]) -> WorkloadModes:
        """The modes that apply to a workload of `namespace` with `labels`."""
        levels = (
            self._wide.get(self.root_namespace),
            self._wide.get(namespace),
            selected := _oldest(self._selecting.matching(namespace, labels)),
        )
        decided = _DEFAULT
        for policy in levels:
            mode = _spec(policy).mtls.mode if policy is not None else UNSET
            if mode != UNSET:
                decided = PortMode(mode, policy, _MODE_PATH)
        ports: dict[int, PortMode] = {}
        if selected is not None:
            for number, setting in _spec(selected).port_level_mtls.items():
                path = ("spec", "portLevelMtls", str(number), "mode")
                ports[int(number)] = PortMode(setting.mode, selected, path) if setting.mode != UNSET else decided
        return WorkloadModes(decided, ports)

    def namespace_mode(self, namespace: str) -> int:
        """What a client assumes of a service in `namespace` when choosing auto mTLS: the
        namespace's own mode, else the mesh's, else PERMISSIVE."""
        for policy in (self._wide.get(namespace), self._wide.get(self.root_namespace)):
            if policy is not None and (mode := _spec(policy).mtls.mode) != UNSET:
                return int(mode)
        return PERMISSIVE


class Sidecars:
    """A mesh's Sidecars, for finding the one that applies to a workload."""

    def __init__(self, sidecars: Iterable[Config], root_namespace: str) -> None:
        self.root_namespace = root_namespace
        self._selecting = _BySelector()
        self._defaults: dict[str, Config] = {}
        for sidecar in sorted(sidecars, key=lambda c: c.key):
            selector = selector_labels(sidecar.spec)
            if selector:
                self._selecting.add(selector, sidecar)
            else:
                self._defaults.setdefault(sidecar.namespace, sidecar)

    def applying_to(self, namespace: str, labels: Mapping[str, str]) -> Config | None:
        """A selector match in `namespace` (the first by name), else the namespace's default,
        else the root namespace's default."""
        selected = self._selecting.matching(namespace, labels)
        if selected:
            return selected[0]
        return self._defaults.get(namespace) or self._defaults.get(self.root_namespace)

    def ingress_ports(self, namespace: str, labels: Mapping[str, str]) -> frozenset[int]:
        """The ports the Sidecar's ingress listeners bind on a VM without iptables."""
        sidecar = self.applying_to(namespace, labels)
        if sidecar is None:
            return frozenset()
        spec: Any = sidecar.spec
        return frozenset(i.port.number for i in spec.ingress if i.capture_mode != sidecar_pb2.IPTABLES)


def workload_labels(entry: Config) -> dict[str, str]:
    """A WorkloadEntry's labels as selectors see them: the spec's, overridden by the metadata's."""
    return {**dict(_spec(entry).labels), **entry.labels}


class ServiceEntries:
    """The ServiceEntries that select WorkloadEntries, for the ports clients reach a workload on."""

    def __init__(self, entries: Iterable[Config]) -> None:
        self._selecting = _BySelector()
        self._all: dict[str, list[Config]] = defaultdict(list)  # `workloadSelector: {}`: every workload
        for entry in entries:
            spec: Any = entry.spec
            if not spec.HasField("workload_selector"):
                continue
            selector = selector_labels(spec)
            if selector:
                self._selecting.add(selector, entry)
            else:
                self._all[entry.namespace].append(entry)

    def endpoint_ports(self, workload: Config, labels: Mapping[str, str]) -> dict[int, list[Config]]:
        """Each port clients reach `workload` on, with the ServiceEntries it is an endpoint of there."""
        spec: Any = workload.spec
        address: str = spec.address
        if address.startswith(_UNIX_PREFIX):
            return {}
        ip = is_ip(address)
        ports: dict[int, list[Config]] = defaultdict(list)
        selecting = [*self._all.get(workload.namespace, ()), *self._selecting.matching(workload.namespace, labels)]
        for entry in sorted(selecting, key=lambda c: c.key):
            entry_spec: Any = entry.spec
            if not ip and entry_spec.resolution not in _DNS:
                continue
            for port in entry_spec.ports:
                if port.protocol.upper() == "UDP":
                    continue
                number = spec.ports.get(port.name) or port.target_port or port.number
                if entry not in ports[number]:
                    ports[number].append(entry)
        return dict(ports)


def _ports_text(ports: Sequence[int]) -> str:
    listed = ", ".join(str(p) for p in ports)
    return f"port {listed} reaches" if len(ports) == 1 else f"ports {listed} reach"


def _fix(ports: Sequence[int]) -> str:
    if len(ports) == 1:
        return "add a Sidecar ingress listener for the port (and point the WorkloadEntry's port at it)"
    return "add a Sidecar ingress listener for each port (and point the WorkloadEntry's ports at them)"


def strict_bypassed_message(policy: str, workload: str, ports: Sequence[int]) -> str:
    """MC0002's words: the policy, the workload, the ports and the fixes."""
    return (
        f"PeerAuthentication {policy} requires mutual TLS for WorkloadEntry {workload}, but its "
        f"{_ports_text(ports)} the app directly {_NO_IPTABLES}: STRICT is not enforced there; "
        f"{_fix(ports)}, or {_REDIRECT}"
    )


def mtls_to_app_message(workload: str, ports: Sequence[int], proxied: bool) -> str:
    """MC0003's words; removing the label is a fix only when no port goes through the proxy."""
    fixes = f"{_fix(ports)}, remove the label, or {_REDIRECT}" if not proxied else f"{_fix(ports)}, or {_REDIRECT}"
    return (
        f"WorkloadEntry {workload} is labelled {TLS_MODE_LABEL}: istio, so clients open mutual TLS to it, but its "
        f"{_ports_text(ports)} the app directly {_NO_IPTABLES}, which does not take mutual TLS; {fixes}"
    )


def vm_mtls_issues(by_kind: Mapping[str, Sequence[Config]], root_namespace: str) -> Iterator[MtlsIssue]:
    """MC0002 and MC0003 for every WorkloadEntry of `by_kind`, in the order the entries come."""
    policies = PeerAuthentications(by_kind.get("PeerAuthentication", ()), root_namespace)
    sidecars = Sidecars(by_kind.get("Sidecar", ()), root_namespace)
    services = ServiceEntries(by_kind.get("ServiceEntry", ()))
    for entry in by_kind.get("WorkloadEntry", ()):
        if GROUP_ANNOTATION in entry.annotations:
            continue
        labels = workload_labels(entry)
        labelled = labels.get(TLS_MODE_LABEL) == "istio"
        if not labelled and not policies.any_strict:
            continue  # the common case, at the cost of one lookup
        ports = services.endpoint_ports(entry, labels)
        if not ports:
            continue
        covered = sidecars.ingress_ports(entry.namespace, labels)
        bypassing = sorted(p for p in ports if p not in covered)
        if not bypassing:
            continue
        if policies.any_strict:
            yield from _strict_bypassed(entry, labels, bypassing, policies)
        if labelled:
            issue = _mtls_to_app(entry, ports, bypassing, proxied=len(bypassing) < len(ports), policies=policies)
            if issue is not None:
                yield issue


def _strict_bypassed(
    entry: Config, labels: Mapping[str, str], bypassing: Sequence[int], policies: PeerAuthentications
) -> Iterator[MtlsIssue]:
    modes = policies.modes(entry.namespace, labels)
    by_policy: dict[ConfigKey, list[tuple[int, PortMode]]] = defaultdict(list)
    for port in bypassing:
        decided = modes.for_port(port)
        if decided.mode == STRICT and decided.policy is not None:
            by_policy[decided.policy.key].append((port, decided))
    for found in by_policy.values():
        policy, path = found[0][1].policy, found[0][1].path
        assert policy is not None
        message = strict_bypassed_message(
            f"{policy.namespace}/{policy.name}", f"{entry.namespace}/{entry.name}", [p for p, _ in found]
        )
        yield MtlsIssue("MC0002", policy.key, path, message)


def _mtls_to_app(
    entry: Config,
    ports: Mapping[int, Sequence[Config]],
    bypassing: Sequence[int],
    *,
    proxied: bool,
    policies: PeerAuthentications,
) -> MtlsIssue | None:
    def auto_mtls(service: Config) -> bool:
        spec: Any = service.spec
        return bool(spec.location == _SE.MESH_INTERNAL) and policies.namespace_mode(service.namespace) != DISABLE

    broken = [p for p in bypassing if any(auto_mtls(s) for s in ports[p])]
    if not broken:
        return None
    # Where the label is written: the metadata's wins over the spec's.
    path: FieldPath = (
        ("metadata", "labels", TLS_MODE_LABEL) if TLS_MODE_LABEL in entry.labels else ("spec", "labels", TLS_MODE_LABEL)
    )
    message = mtls_to_app_message(f"{entry.namespace}/{entry.name}", broken, proxied)
    return MtlsIssue("MC0003", entry.key, path, message)
