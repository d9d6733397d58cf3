"""Analysis of AuthorizationPolicies: against the mesh's mutual TLS (MC0004), and against VMs
whose traffic bypasses the proxy that would enforce them (MC0005).

MC0005: on a VM without iptables, a workload's traffic passes its proxy only on the ports of a
Sidecar ingress listener; on its other endpoint ports clients reach the app directly, so an
AuthorizationPolicy (or RequestAuthentication) selecting it is not enforced there, whatever it says.

A rule that matches on the peer's identity (`principals`, `namespaces`, their `not` forms, and
the `source.principal` / `source.namespace` / `source.serviceAccount` conditions) can only match
a connection that came over mutual TLS: a plaintext client presents no identity. When none of the
workloads a policy selects receives mutual TLS (no `security.istio.io/tlsMode: istio` label, so
clients never open it; or a PeerAuthentication that DISABLEs it), an ALLOW policy's rule never
lets anyone in and a DENY policy's never keeps anyone out. Istio reports nothing here; the policy
is valid, only useless where it lands, so this is a warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from meshctl.config.analysis_mtls import MtlsIssue, PeerAuthentications, ServiceEntries, Sidecars, workload_labels
from meshctl.config.findings import FieldPath
from meshctl.config.labels import TLS_MODE_LABEL, labels_match, selector_labels
from meshctl.config.model import Config

_IDENTITY_FIELDS: Final = ("principals", "not_principals", "namespaces", "not_namespaces", "service_accounts",
                           "not_service_accounts", "trust_domains", "not_trust_domains")  # fmt: skip
_IDENTITY_KEYS: Final = frozenset({"source.principal", "source.namespace", "source.serviceAccount"})
_JSON_NAMES: Final = {
    "principals": "principals",
    "not_principals": "notPrincipals",
    "namespaces": "namespaces",
    "not_namespaces": "notNamespaces",
    "service_accounts": "serviceAccounts",
    "not_service_accounts": "notServiceAccounts",
    "trust_domains": "trustDomains",
    "not_trust_domains": "notTrustDomains",
}
_DISABLE: Final = 1
_CUSTOM: Final = 3


def identity_path(spec: Any) -> FieldPath | None:
    """The first field of `spec`'s rules that reads the peer's identity, or None."""
    for i, rule in enumerate(spec.rules):
        for j, source in enumerate(getattr(rule, "from")):
            for name in _IDENTITY_FIELDS:
                if list(getattr(source.source, name)):
                    return ("spec", "rules", i, "from", j, "source", _JSON_NAMES[name])
        for k, condition in enumerate(rule.when):
            if condition.key in _IDENTITY_KEYS:
                return ("spec", "rules", i, "when", k, "key")
    return None


def _selected(policy: Config, entries: Sequence[Config], root_namespace: str) -> list[Config]:
    selector = selector_labels(policy.spec, "selector")
    mesh_wide = policy.namespace == root_namespace
    return [
        e
        for e in entries
        if (mesh_wide or e.namespace == policy.namespace)
        and (not selector or labels_match(selector, workload_labels(e)))
    ]


def _why_no_mtls(entry: Config, labels: Mapping[str, str], policies: PeerAuthentications) -> str | None:
    if labels.get(TLS_MODE_LABEL) != "istio":
        return f"not labelled {TLS_MODE_LABEL}: istio, so clients do not use mutual TLS to it"
    modes = policies.modes(entry.namespace, labels)
    if modes.default.mode == _DISABLE and all(m.mode == _DISABLE for m in modes.ports.values()):
        return "its PeerAuthentication DISABLEs mutual TLS"
    return None


def identity_without_mtls(by_kind: Mapping[str, Sequence[Config]], root_namespace: str) -> Iterator[MtlsIssue]:
    """MC0004 for every AuthorizationPolicy that reads the peer's identity where no selected
    workload gets mutual TLS (a policy selecting no WorkloadEntry is IST0127's)."""
    entries = by_kind.get("WorkloadEntry", ())
    peer = PeerAuthentications(by_kind.get("PeerAuthentication", ()), root_namespace)
    for policy in by_kind.get("AuthorizationPolicy", ()):
        spec: Any = policy.spec
        if spec.action == _CUSTOM:
            continue
        path = identity_path(spec)
        if path is None:
            continue
        selected = _selected(policy, entries, root_namespace)
        reasons = [(e, _why_no_mtls(e, workload_labels(e), peer)) for e in selected]
        if not selected or any(why is None for _, why in reasons):
            continue
        shown = ", ".join(f"{e.namespace}/{e.name} ({why})" for e, why in reasons[:3])
        more = f" and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        effect = "lets no one in" if spec.action == 0 else "never matches"
        message = (
            f"AuthorizationPolicy {policy.namespace}/{policy.name} matches on the peer's identity, but no "
            f"workload it selects receives mutual TLS: {shown}{more}; a plaintext client presents no identity, "
            f"so the rule {effect} there"
        )
        yield MtlsIssue("MC0004", policy.key, path, message)


def policies_bypassed(by_kind: Mapping[str, Sequence[Config]], root_namespace: str) -> Iterator[MtlsIssue]:
    """MC0005 for every AuthorizationPolicy and RequestAuthentication that selects a WorkloadEntry
    with endpoint ports no Sidecar ingress listener takes (one finding per policy)."""
    entries = by_kind.get("WorkloadEntry", ())
    policies = [*by_kind.get("AuthorizationPolicy", ()), *by_kind.get("RequestAuthentication", ())]
    if not entries or not policies:
        return
    sidecars = Sidecars(by_kind.get("Sidecar", ()), root_namespace)
    services = ServiceEntries(by_kind.get("ServiceEntry", ()))
    bypassing: dict[object, list[int]] = {}
    for entry in entries:
        labels = workload_labels(entry)
        covered = sidecars.ingress_ports(entry.namespace, labels)
        bypassing[entry.key] = sorted(p for p in services.endpoint_ports(entry, labels) if p not in covered)
    for policy in policies:
        spec: Any = policy.spec
        if spec.HasField("targetRef") or list(spec.targetRefs):
            continue
        hit = [e for e in _selected(policy, entries, root_namespace) if bypassing.get(e.key)]
        if not hit:
            continue
        shown = ", ".join(
            f"{e.namespace}/{e.name} (port{'s' if len(bypassing[e.key]) > 1 else ''} "
            f"{', '.join(str(p) for p in bypassing[e.key])})"
            for e in hit[:3]
        )
        more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
        message = (
            f"{policy.kind} {policy.namespace}/{policy.name} is not enforced where clients reach the app directly "
            f"on a VM without iptables: {shown}{more}; add Sidecar ingress listeners for those ports (and point the "
            "WorkloadEntry's ports at them), or run the proxies with INTERCEPTION_MODE REDIRECT"
        )
        yield MtlsIssue("MC0005", policy.key, ("spec",), message)
