"""Cross-resource analysis with Istio's message codes, so `istioctl analyze` users read them at once.

| code    | severity | meaning                                                              |
|---------|----------|----------------------------------------------------------------------|
| IST0101 | error    | a referenced host, subset or gateway does not exist                  |
| IST0109 | error    | two VirtualServices bound to the mesh define the same host           |
| IST0127 | warning  | a workload selector matches no WorkloadEntry                         |
| IST0132 | warning  | a VirtualService host is not exposed by the gateway it is bound to   |
| IST0145 | error    | two Gateways select the same workload and claim one port and host    |
| IST0173 | warning  | a DestinationRule subset selects no endpoint of its host             |
| IST0174 | warning  | a DestinationRule host matches no service                            |
| MC0001  | warning  | a VM's app listens on a port of a service it may call (no iptables)  |
| MC0002  | warning  | a STRICT PeerAuthentication is not enforced on a port (no iptables)  |
| MC0003  | warning  | clients use mutual TLS to a port the app serves itself (no iptables) |

The MC codes are meshctl's own, about VMs without iptables (INTERCEPTION_MODE NONE, the VM
default), which `meshctl validate` assumes since it does not know each proxy's mode. MC0001: a
proxy serves outbound traffic on 127.0.0.1:PORT, which it cannot bind where the workload's own app
listens (bookinfo as Istio writes it: every app on 9080, calling the others on 9080). MC0002 and
MC0003: inbound traffic reaches the proxy only on its Sidecar's ingress ports, so on other
endpoint ports a STRICT policy is not enforced, and clients' auto mTLS reaches the app itself
(`analysis_mtls`).

Analysis reads only configs (and hosts a registry vouches for, passed in as `known_hosts`); it is
what `meshctl validate` runs after every file has loaded. Each issue names the field path so the
caller can point at the line.

Meshes run to tens of thousands of resources, so no check scans the mesh per reference: selectors
find workloads through an index by label, and hosts are looked up by name, by suffix (wildcards)
and by (name, namespace) (short names).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.config.analysis_authz import identity_without_mtls, policies_bypassed
from meshctl.config.analysis_grpc import REFUSED, grpc_issues
from meshctl.config.analysis_mtls import Sidecars, vm_mtls_issues, workload_labels
from meshctl.config.findings import FieldPath, Severity
from meshctl.config.hosts import host_matches, hosts_overlap
from meshctl.config.labels import labels_match, selector_labels
from meshctl.config.mesh import DEFAULT_ROOT_NAMESPACE
from meshctl.config.model import Config, ConfigKey
from meshctl.config.references import MESH_GATEWAY, is_exported, resolve_gateway_name


@dataclass(frozen=True, slots=True)
class AnalysisIssue:
    key: ConfigKey
    path: FieldPath
    message: str
    severity: Severity
    code: str


@dataclass(frozen=True, slots=True)
class _Workload:
    namespace: str
    labels: Mapping[str, str]


class _Workloads:
    """Workloads by label, so a selector costs the workloads that share one of its labels rather
    than a scan of the whole mesh (selectors x workloads is the quadratic term of a big mesh)."""

    def __init__(self, workloads: Sequence[_Workload]) -> None:
        self.all = workloads
        self._by_namespace: dict[str, list[_Workload]] = defaultdict(list)
        self._by_label: dict[tuple[str, str], list[_Workload]] = defaultdict(list)
        for w in workloads:
            self._by_namespace[w.namespace].append(w)
            for item in w.labels.items():
                self._by_label[item].append(w)

    def selected(self, selector: Mapping[str, str], namespace: str | None = None) -> list[_Workload]:
        """The workloads `selector` matches (in `namespace` when given), in the order they loaded."""
        if not selector:
            return list(self.all if namespace is None else self._by_namespace.get(namespace, ()))
        # Every match carries every label of the selector: the rarest one bounds the candidates.
        candidates = min((self._by_label.get(item, ()) for item in selector.items()), key=len)
        return [
            w
            for w in candidates
            if (namespace is None or w.namespace == namespace) and labels_match(selector, w.labels)
        ]

    def any_selected(self, selector: Mapping[str, str], namespace: str | None = None) -> bool:
        return bool(self.selected(selector, namespace))


class _Hosts:
    """Service hosts with the lookups analysis makes per reference, each without a scan of every
    host: exact names in a set, wildcard patterns by suffix, and short names by (name, namespace)."""

    def __init__(self, hosts: set[str]) -> None:
        self.hosts = hosts
        self._wildcard_suffixes = {h[1:] for h in hosts if h.startswith("*")}
        # Reversed names, sorted: the hosts ending in a suffix are one run of this list.
        self._reversed = sorted(h[::-1] for h in hosts)
        # Built by iterating the set, so each list keeps the set's order, as a scan of it would.
        self._by_short: dict[tuple[str, str], list[str]] = defaultdict(list)
        for h in hosts:
            parts = h.split(".", 2)
            if len(parts) == 3:
                self._by_short[parts[0], parts[1]].append(h)

    def starting_with(self, name: str, namespace: str) -> list[str]:
        """The hosts that start with `name.namespace.`, sorted, so messages that name one are the
        same from run to run (`name` has no dot)."""
        if "." in namespace:
            prefix = f"{name}.{namespace}."
            return sorted(h for h in self.hosts if h.startswith(prefix))
        return sorted(self._by_short.get((name, namespace), []))

    def covered_by_known(self, host: str) -> bool:
        """True when some known host, as a pattern, covers `host` (`host_matches(known, host)`)."""
        if host in self.hosts or "*" in self.hosts:
            return True
        suffixes = self._wildcard_suffixes
        return bool(suffixes) and any(host[i:] in suffixes for i in range(1, len(host) + 1))

    def covering_known(self, pattern: str) -> bool:
        """True when `pattern` covers some known host (`host_matches(pattern, known)`)."""
        if pattern == "*":
            return bool(self.hosts)
        if pattern in self.hosts:
            return True
        if not pattern.startswith("*"):
            return False
        suffix = pattern[1:][::-1]
        at = bisect_left(self._reversed, suffix)
        for reversed_host in self._reversed[at:]:
            if not reversed_host.startswith(suffix):
                return False
            if len(reversed_host) > len(suffix):
                return True
        return False


class _Index:
    """What every check needs, computed once."""

    def __init__(self, configs: Sequence[Config], known_hosts: Collection[str]) -> None:
        self.by_kind: dict[str, list[Config]] = defaultdict(list)
        for c in configs:
            self.by_kind[c.kind].append(c)
        self.gateways = {(c.namespace, c.name): c for c in self.by_kind["Gateway"]}
        self.workloads = _Workloads([_Workload(c.namespace, workload_labels(c)) for c in self.by_kind["WorkloadEntry"]])
        self.service_hosts: set[str] = set(known_hosts)
        # Endpoint label sets per host, for subset checks; a host missing here has unknown endpoints.
        self.endpoint_labels: dict[str, list[Mapping[str, str]]] = {}
        for se in self.by_kind["ServiceEntry"]:
            spec: Any = se.spec
            labels: list[Mapping[str, str]] = [dict(ep.labels) for ep in spec.endpoints]
            if spec.HasField("workload_selector"):
                selector = dict(spec.workload_selector.labels)
                labels = [w.labels for w in self.workloads.selected(selector, se.namespace)]
            for host in spec.hosts:
                self.service_hosts.add(host)
                if labels or spec.endpoints or spec.HasField("workload_selector"):
                    self.endpoint_labels.setdefault(host, []).extend(labels)
        self.hosts = _Hosts(self.service_hosts)
        # DestinationRules by the hosts they apply to: exact ones by name, wildcards in a list.
        self._rules = self.by_kind["DestinationRule"]
        self._rules_by_host: dict[str, list[int]] = defaultdict(list)
        self._wildcard_rules: list[tuple[str, int]] = []
        for i, dr in enumerate(self._rules):
            for d in self.resolve(dr.spec.host, dr.namespace):  # type: ignore[attr-defined]
                if d.startswith("*"):
                    self._wildcard_rules.append((d, i))
                else:
                    self._rules_by_host[d].append(i)

    def resolve(self, host: str, namespace: str) -> list[str]:
        """Candidate FQDNs for a host as written in `namespace`: a short name may stand for
        `name.namespace.<domain>` as in Kubernetes."""
        if "." in host or host == "*":
            return [host]
        return [host, *self.hosts.starting_with(host, namespace)]

    def host_known(self, host: str, namespace: str) -> bool:
        hosts = self.hosts
        return any(
            hosts.covered_by_known(candidate) or hosts.covering_known(candidate)
            for candidate in self.resolve(host, namespace)
        )

    def destination_rules_for(self, host: str, namespace: str) -> list[Config]:
        found: set[int] = set()
        for candidate in self.resolve(host, namespace):
            found.update(self._rules_by_host.get(candidate, ()))
            found.update(i for d, i in self._wildcard_rules if host_matches(d, candidate))
        return [self._rules[i] for i in sorted(found)]

    def endpoint_label_sets(self, host: str) -> list[Mapping[str, str]] | None:
        """The endpoint label sets of every service `host` covers; None when none has known endpoints."""
        label_sets: list[Mapping[str, str]] | None = None
        if host.startswith("*"):
            for known, sets in self.endpoint_labels.items():
                if host_matches(host, known):
                    label_sets = (label_sets or []) + sets
            return label_sets
        exact = self.endpoint_labels.get(host)
        return None if exact is None else list(exact)


def analyze(
    configs: Sequence[Config], known_hosts: Collection[str] = (), root_namespace: str = DEFAULT_ROOT_NAMESPACE
) -> list[AnalysisIssue]:
    """Every cross-resource problem in `configs`, in a stable order; policies and Sidecars in
    `root_namespace` (MeshConfig's) apply mesh-wide."""
    index = _Index(configs, known_hosts)
    issues: list[AnalysisIssue] = []
    issues.extend(_virtual_service_references(index))
    issues.extend(_mesh_host_conflicts(index))
    issues.extend(_selectors(index, root_namespace))
    issues.extend(_gateway_hosts(index))
    issues.extend(_gateway_conflicts(index))
    issues.extend(_destination_rules(index))
    issues.extend(_app_ports_hiding_calls(index, Sidecars(index.by_kind["Sidecar"], root_namespace)))
    issues.extend(
        AnalysisIssue(found.key, found.path, found.message, Severity.WARNING, found.code)
        for found in (
            *vm_mtls_issues(index.by_kind, root_namespace),
            *identity_without_mtls(index.by_kind, root_namespace),
            *policies_bypassed(index.by_kind, root_namespace),
        )
    )
    issues.extend(
        AnalysisIssue(f.key, f.path, f.message, Severity.ERROR if f.code == REFUSED else Severity.WARNING, f.code)
        for f in grpc_issues(index.by_kind, root_namespace)
    )
    issues.extend(_gateway_api_status(configs, known_hosts))
    return issues


def _gateway_api_status(configs: Sequence[Config], known_hosts: Collection[str]) -> list[AnalysisIssue]:
    """The status conditions Istio would write on the Gateway API resources (`gateway_api.status`)."""
    from meshctl.config.gateway_api import translate

    known = frozenset(known_hosts)
    translation = translate(configs, known.__contains__)
    return [AnalysisIssue(c.key, c.path, c.text(), c.severity, c.code) for c in translation.conditions]


def hidden_port_message(workload: str, port: int, served: str, called: Sequence[str]) -> str:
    """Why a proxy without iptables gets no outbound listener on `port`, and the two fixes; the
    words `meshctl validate` and `meshctl dump` both say."""
    shown = ", ".join(called[:3]) + (f" and {len(called) - 3} more" if len(called) > 3 else "")
    return (
        f"without iptables the proxy of workload {workload} binds no outbound listener on 127.0.0.1:{port} "
        f"(nor on a TCP service's own loopback address: an app on every address holds the port there too): "
        f"its app listens on port {port} (as an endpoint of {served}), so its calls to {shown} on port {port} "
        "cannot go through the proxy; give the ServiceEntry port a targetPort so the app listens on another port, or "
        "give its Sidecar an egress listener with a port and bind of its own"
    )


def _visible_from(config: Config, namespace: str) -> bool:
    """A ServiceEntry's exportTo, as Istio reads it (`is_exported`)."""
    spec: Any = config.spec
    return is_exported(spec.export_to, config.namespace, namespace)


def _app_ports_hiding_calls(index: _Index, sidecars: Sidecars) -> Iterator[AnalysisIssue]:
    """MC0001: a WorkloadEntry whose app port is the port of another service it may call. An
    endpoint port a Sidecar ingress listener takes is Envoy's (bound on the VM's address, the app
    behind it on its defaultEndpoint), not the app's; a workload whose Sidecar lets it call
    nothing (`~/*`) has no outbound listener to lose."""
    specs: dict[ConfigKey, Any] = {se.key: se.spec for se in index.by_kind["ServiceEntry"]}
    by_port: dict[int, list[Config]] = defaultdict(list)
    # ServiceEntries that select workloads, by (namespace, one label of their selector): a
    # workload can only match those filed under one of its own labels (or selecting everything),
    # so each workload is compared with a few candidates, not its namespace's every entry.
    selecting: dict[tuple[str, str, str], list[Config]] = defaultdict(list)
    selecting_all: dict[str, list[Config]] = defaultdict(list)
    for se in index.by_kind["ServiceEntry"]:
        se_spec = specs[se.key]
        for port in se_spec.ports:
            by_port[port.number].append(se)
        if se_spec.HasField("workload_selector"):
            selector = dict(se_spec.workload_selector.labels)
            if selector:
                key, value = min(selector.items())
                selecting[(se.namespace, key, value)].append(se)
            else:
                selecting_all[se.namespace].append(se)
    for we in index.by_kind["WorkloadEntry"]:
        spec: Any = we.spec
        labels = workload_labels(we)
        sidecar = sidecars.applying_to(we.namespace, labels)
        if sidecar is not None and _calls_nothing(sidecar):
            continue
        proxied = sidecars.ingress_ports(we.namespace, labels)
        candidates = {se.key: se for k, v in labels.items() for se in selecting.get((we.namespace, k, v), ())}
        mine = [
            se
            for se in [*selecting_all[we.namespace], *sorted(candidates.values(), key=lambda c: c.key)]
            if labels_match(dict(specs[se.key].workload_selector.labels), labels)
        ]
        mine.sort(key=lambda c: c.key)
        own_hosts = {h for se in mine for h in specs[se.key].hosts}
        reported: set[int] = set()
        for se in mine:
            for port in specs[se.key].ports:
                app = spec.ports.get(port.name) or port.target_port or port.number
                if app in proxied:
                    continue
                called = sorted(
                    {
                        h
                        for other in by_port.get(app, ())
                        if _visible_from(other, we.namespace)
                        for h in specs[other.key].hosts
                        if h not in own_hosts
                    }
                )
                if called and app not in reported:
                    reported.add(app)
                    message = hidden_port_message(f"{we.namespace}/{we.name}", app, specs[se.key].hosts[0], called)
                    yield AnalysisIssue(we.key, ("spec",), message, Severity.WARNING, "MC0001")


def _calls_nothing(sidecar: Config) -> bool:
    """A Sidecar whose egress lets its workloads see no service (every listener `~/*`)."""
    egress = list(sidecar.spec.egress)  # type: ignore[attr-defined]
    return bool(egress) and all(list(e.hosts) and all(h.startswith("~/") for h in e.hosts) for e in egress)


def _gateway_key(ref: str, namespace: str) -> tuple[str, str]:
    ns, _, name = resolve_gateway_name(ref, namespace).partition("/")
    return (ns, name)


def _destinations(spec: Any) -> Iterator[tuple[FieldPath, Any]]:
    for i, http in enumerate(spec.http):
        for j, route in enumerate(http.route):
            yield ("spec", "http", i, "route", j, "destination"), route.destination
        if http.HasField("mirror"):
            yield ("spec", "http", i, "mirror"), http.mirror
        for j, mirror in enumerate(http.mirrors):
            yield ("spec", "http", i, "mirrors", j, "destination"), mirror.destination
    for field in ("tcp", "tls"):
        for i, rule in enumerate(getattr(spec, field)):
            for j, route in enumerate(rule.route):
                yield ("spec", field, i, "route", j, "destination"), route.destination


def _virtual_service_references(index: _Index) -> Iterator[AnalysisIssue]:
    for vs in index.by_kind["VirtualService"]:
        spec: Any = vs.spec
        for i, ref in enumerate(spec.gateways):
            if ref != MESH_GATEWAY and _gateway_key(ref, vs.namespace) not in index.gateways:
                yield AnalysisIssue(
                    vs.key,
                    ("spec", "gateways", i),
                    f'Referenced gateway not found: "{ref}"',
                    Severity.ERROR,
                    "IST0101",
                )
        for path, dest in _destinations(spec):
            host = dest.host
            if not host:
                continue
            if not index.host_known(host, vs.namespace):
                yield AnalysisIssue(
                    vs.key, (*path, "host"), f'Referenced host not found: "{host}"', Severity.ERROR, "IST0101"
                )
                continue
            if dest.subset:
                rules = index.destination_rules_for(host, vs.namespace)
                if not any(s.name == dest.subset for dr in rules for s in dr.spec.subsets):  # type: ignore[attr-defined]
                    yield AnalysisIssue(
                        vs.key,
                        (*path, "subset"),
                        f'Referenced host+subset in destinationrule not found: "{host}+{dest.subset}"',
                        Severity.ERROR,
                        "IST0101",
                    )


def _mesh_host_conflicts(index: _Index) -> Iterator[AnalysisIssue]:
    owners: dict[str, list[tuple[Config, int]]] = defaultdict(list)
    for vs in index.by_kind["VirtualService"]:
        spec: Any = vs.spec
        gateways = list(spec.gateways) or [MESH_GATEWAY]
        if MESH_GATEWAY not in gateways:
            continue
        for i, host in enumerate(spec.hosts):
            fqdn = index.resolve(host, vs.namespace)[-1]
            owners[fqdn].append((vs, i))
    for host, entries in sorted(owners.items()):
        if len(entries) < 2:
            continue
        names = ",".join(sorted(f"{vs.namespace}/{vs.name}" for vs, _ in entries))
        for vs, i in entries:
            yield AnalysisIssue(
                vs.key,
                ("spec", "hosts", i),
                f'The VirtualServices {names} associated with mesh gateway define the same host "{host}" '
                "which can lead to undefined behavior. This can be fixed by merging the conflicting "
                "VirtualServices into a single resource.",
                Severity.ERROR,
                "IST0109",
            )


def _selectors(index: _Index, root_namespace: str) -> Iterator[AnalysisIssue]:
    """IST0127: a workload selector that selects no WorkloadEntry. The security policies',
    EnvoyFilters' and WasmPlugins' selectors reach every namespace from the root namespace, as in
    Istio."""
    checks: Iterable[tuple[str, FieldPath, str]] = (
        ("Sidecar", ("spec", "workloadSelector"), "workload_selector"),
        ("DestinationRule", ("spec", "workloadSelector"), "workload_selector"),
        ("ServiceEntry", ("spec", "workloadSelector"), "workload_selector"),
        ("EnvoyFilter", ("spec", "workloadSelector"), "workload_selector"),
        ("AuthorizationPolicy", ("spec", "selector"), "selector"),
        ("RequestAuthentication", ("spec", "selector"), "selector"),
        ("PeerAuthentication", ("spec", "selector"), "selector"),
        ("Telemetry", ("spec", "selector"), "selector"),
        ("WasmPlugin", ("spec", "selector"), "selector"),
    )
    policies = {"AuthorizationPolicy", "RequestAuthentication", "PeerAuthentication", "EnvoyFilter", "WasmPlugin"}
    for kind, path, field in checks:
        for config in index.by_kind[kind]:
            selector = selector_labels(config.spec, field)
            if not selector:
                continue
            mesh_wide = kind in policies and config.namespace == root_namespace
            namespace = None if mesh_wide else config.namespace
            if not index.workloads.any_selected(selector, namespace):
                yield _no_workload(config, path, selector)
    for gw in index.by_kind["Gateway"]:
        selector = dict(gw.spec.selector)  # type: ignore[attr-defined]
        if selector and not index.workloads.any_selected(selector):
            yield _no_workload(gw, ("spec", "selector"), selector)


def _no_workload(config: Config, path: FieldPath, selector: Mapping[str, str]) -> AnalysisIssue:
    text = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    return AnalysisIssue(
        config.key,
        path,
        f"No matching workloads for this resource with the following labels: {text}",
        Severity.WARNING,
        "IST0127",
    )


def _server_hosts(gateway: Config) -> list[str]:
    hosts = []
    for server in gateway.spec.servers:  # type: ignore[attr-defined]
        for host in server.hosts:
            _, sep, name = host.partition("/")
            hosts.append(name if sep else host)
    return hosts


def _gateway_hosts(index: _Index) -> Iterator[AnalysisIssue]:
    for vs in index.by_kind["VirtualService"]:
        spec: Any = vs.spec
        for g, ref in enumerate(spec.gateways):
            gw = index.gateways.get(_gateway_key(ref, vs.namespace))
            if ref == MESH_GATEWAY or gw is None:
                continue
            exposed = _server_hosts(gw)
            for i, host in enumerate(spec.hosts):
                if not any(
                    host_matches(pattern, candidate)
                    for pattern in exposed
                    for candidate in index.resolve(host, vs.namespace)
                ):
                    yield AnalysisIssue(
                        vs.key,
                        ("spec", "hosts", i),
                        f"one or more host [{host}] defined in VirtualService {vs.namespace}/{vs.name} "
                        f"not found in Gateway {gw.namespace}/{gw.name} (spec.gateways[{g}]).",
                        Severity.WARNING,
                        "IST0132",
                    )


#: A gateway server's claim: (gateway, server index, selector, port, host).
_Claim = tuple[Config, int, frozenset[tuple[str, str]], int, str]


def _gateway_conflicts(index: _Index) -> Iterator[AnalysisIssue]:
    claims: list[_Claim] = []
    for gw in index.by_kind["Gateway"]:
        spec: Any = gw.spec
        selector = frozenset(spec.selector.items())
        for s, server in enumerate(spec.servers):
            for host in server.hosts:
                name = host.partition("/")[2] if "/" in host else host
                claims.append((gw, s, selector, server.port.number, name))
    # Only claims with the same selector and port can conflict: compare within those groups.
    groups: dict[tuple[frozenset[tuple[str, str]], int], list[_Claim]] = defaultdict(list)
    for claim in claims:
        groups[claim[2], claim[3]].append(claim)
    seen: set[tuple[ConfigKey, int]] = set()
    for a in claims:
        others = sorted(
            {
                f"{b[0].namespace}/{b[0].name}"
                for b in groups[a[2], a[3]]
                if b[0].key != a[0].key and hosts_overlap(a[4], b[4])
            }
        )
        if not others or (a[0].key, a[1]) in seen:
            continue
        seen.add((a[0].key, a[1]))
        selector_text = ",".join(f"{k}={v}" for k, v in sorted(a[2]))
        yield AnalysisIssue(
            a[0].key,
            ("spec", "servers", a[1]),
            f"Conflict with gateways {','.join(others)} (workload selector {selector_text}, port {a[3]}, "
            f"hosts {a[4]}).",
            Severity.ERROR,
            "IST0145",
        )


def _destination_rules(index: _Index) -> Iterator[AnalysisIssue]:
    for dr in index.by_kind["DestinationRule"]:
        spec: Any = dr.spec
        if not spec.host:
            continue
        if not index.host_known(spec.host, dr.namespace):
            yield AnalysisIssue(
                dr.key,
                ("spec", "host"),
                f"The host {spec.host} defined in the DestinationRule does not match any services in the mesh.",
                Severity.WARNING,
                "IST0174",
            )
            continue
        label_sets: list[Mapping[str, str]] | None = None
        for candidate in index.resolve(spec.host, dr.namespace):
            sets = index.endpoint_label_sets(candidate)
            if sets is not None:
                label_sets = (label_sets or []) + sets
        if label_sets is None:
            continue  # endpoints come from elsewhere (DNS, a registry): nothing to check against
        for i, subset in enumerate(spec.subsets):
            selector = dict(subset.labels)
            if selector and not any(labels_match(selector, labels) for labels in label_sets):
                yield AnalysisIssue(
                    dr.key,
                    ("spec", "subsets", i),
                    f"The Subset {subset.name} defined in the DestinationRule does not select any pods.",
                    Severity.WARNING,
                    "IST0173",
                )
