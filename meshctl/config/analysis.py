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

Analysis reads only configs (and hosts a registry vouches for, passed in as `known_hosts`); it is
what `meshctl validate` runs after every file has loaded. Each issue names the field path so the
caller can point at the line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.config.findings import FieldPath, Severity
from meshctl.config.hosts import host_matches, hosts_overlap
from meshctl.config.labels import labels_match, selector_labels
from meshctl.config.model import Config, ConfigKey

MESH_GATEWAY = "mesh"


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


class _Index:
    """What every check needs, computed once."""

    def __init__(self, configs: Sequence[Config], known_hosts: Collection[str]) -> None:
        self.by_kind: dict[str, list[Config]] = defaultdict(list)
        for c in configs:
            self.by_kind[c.kind].append(c)
        self.gateways = {(c.namespace, c.name): c for c in self.by_kind["Gateway"]}
        self.workloads = [
            _Workload(c.namespace, {**c.labels, **dict(c.spec.labels)})  # type: ignore[attr-defined]
            for c in self.by_kind["WorkloadEntry"]
        ]
        self.service_hosts: set[str] = set(known_hosts)
        # Endpoint label sets per host, for subset checks; a host missing here has unknown endpoints.
        self.endpoint_labels: dict[str, list[Mapping[str, str]]] = {}
        for se in self.by_kind["ServiceEntry"]:
            spec: Any = se.spec
            labels: list[Mapping[str, str]] = [dict(ep.labels) for ep in spec.endpoints]
            if spec.HasField("workload_selector"):
                selector = dict(spec.workload_selector.labels)
                labels = [
                    w.labels
                    for w in self.workloads
                    if w.namespace == se.namespace and labels_match(selector, w.labels)
                ]
            for host in spec.hosts:
                self.service_hosts.add(host)
                if labels or spec.endpoints or spec.HasField("workload_selector"):
                    self.endpoint_labels.setdefault(host, []).extend(labels)

    def resolve(self, host: str, namespace: str) -> list[str]:
        """Candidate FQDNs for a host as written in `namespace`: a short name may stand for
        `name.namespace.<domain>` as in Kubernetes."""
        if "." in host or host == "*":
            return [host]
        prefix = f"{host}.{namespace}."
        return [host, *(h for h in self.service_hosts if h.startswith(prefix))]

    def host_known(self, host: str, namespace: str) -> bool:
        for candidate in self.resolve(host, namespace):
            if any(
                host_matches(known, candidate) or host_matches(candidate, known)
                for known in self.service_hosts
            ):
                return True
        return False

    def destination_rules_for(self, host: str, namespace: str) -> list[Config]:
        candidates = self.resolve(host, namespace)
        out = []
        for dr in self.by_kind["DestinationRule"]:
            dr_hosts = self.resolve(dr.spec.host, dr.namespace)  # type: ignore[attr-defined]
            if any(host_matches(d, c) for d in dr_hosts for c in candidates):
                out.append(dr)
        return out


def analyze(configs: Sequence[Config], known_hosts: Collection[str] = ()) -> list[AnalysisIssue]:
    """Every cross-resource problem in `configs`, in a stable order."""
    index = _Index(configs, known_hosts)
    issues: list[AnalysisIssue] = []
    issues.extend(_virtual_service_references(index))
    issues.extend(_mesh_host_conflicts(index))
    issues.extend(_selectors(index))
    issues.extend(_gateway_hosts(index))
    issues.extend(_gateway_conflicts(index))
    issues.extend(_destination_rules(index))
    return issues


def _gateway_key(ref: str, namespace: str) -> tuple[str, str]:
    ns, _, name = ref.rpartition("/")
    return (ns or namespace, name)


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


def _selectors(index: _Index) -> Iterator[AnalysisIssue]:
    checks: Iterable[tuple[str, FieldPath, str]] = (
        ("Sidecar", ("spec", "workloadSelector"), "workload_selector"),
        ("DestinationRule", ("spec", "workloadSelector"), "workload_selector"),
        ("ServiceEntry", ("spec", "workloadSelector"), "workload_selector"),
    )
    for kind, path, field in checks:
        for config in index.by_kind[kind]:
            selector = selector_labels(config.spec, field)
            if not selector:
                continue
            if not any(
                w.namespace == config.namespace and labels_match(selector, w.labels) for w in index.workloads
            ):
                yield _no_workload(config, path, selector)
    for gw in index.by_kind["Gateway"]:
        selector = dict(gw.spec.selector)  # type: ignore[attr-defined]
        if selector and not any(labels_match(selector, w.labels) for w in index.workloads):
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


def _gateway_conflicts(index: _Index) -> Iterator[AnalysisIssue]:
    claims: list[tuple[Config, int, frozenset[tuple[str, str]], int, str]] = []
    for gw in index.by_kind["Gateway"]:
        spec: Any = gw.spec
        selector = frozenset(spec.selector.items())
        for s, server in enumerate(spec.servers):
            for host in server.hosts:
                name = host.partition("/")[2] if "/" in host else host
                claims.append((gw, s, selector, server.port.number, name))
    seen: set[tuple[ConfigKey, int]] = set()
    for a in claims:
        others = sorted(
            {
                f"{b[0].namespace}/{b[0].name}"
                for b in claims
                if b[0].key != a[0].key and b[2] == a[2] and b[3] == a[3] and hosts_overlap(a[4], b[4])
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
            for host, sets in index.endpoint_labels.items():
                if host_matches(candidate, host):
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
