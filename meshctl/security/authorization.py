"""Which AuthorizationPolicies apply to a workload, and what each asks for: Istio's selection
(`AuthorizationPolicies.ListAuthorizationPolicies`, `WorkloadPolicyMatcher.ShouldAttachPolicy`).

Policies add up: every policy that selects a workload takes part, each in the RBAC filter of its
action (`meshctl.xds.rbac`). A policy selects a workload when

- it is in the root namespace (MeshConfig's, `istio-system`) or in the workload's namespace, and
- it has no selector (mesh-wide in the root namespace, namespace-wide elsewhere), or every label
  of its selector is among the workload's: a root-namespace policy with a selector selects
  matching workloads of every namespace, as in Istio.

Principals (`principals`, `source.principal`) name the mesh's trust domain as Istio migrates them
(`with_trust_domain`): `cluster.local/ns/NS/sa/SA` is the mesh's own, whatever it is called.

A policy with `targetRef`/`targetRefs` attaches only to Kubernetes Gateway API gateways and
waypoints, which meshctl does not serve: Istio ignores such a policy for every other proxy, and
so does meshctl, with a warning (`ignored_policies` finds them for it).

Policies are listed root namespace first, then the workload's, each namespace in Istio's creation
order (`Config.istio_order`), as Istio lists them; the order names nothing Envoy evaluates (a
filter's policies are a map), but it keeps the generated config and the logs stable.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from meshctl.config.model import Config
from meshctl.snapshot.model import Snapshot, spec

KIND: Final = "AuthorizationPolicy"
#: Istio's annotation.IoIstioDryRun: a policy that is evaluated and logged but not enforced.
DRY_RUN_ANNOTATION: Final = "istio.io/dry-run"
#: Istio's default trust domain: a principal naming it names the mesh's own, whatever that is.
CLUSTER_LOCAL: Final = "cluster.local"
#: Go's strconv.ParseBool, which Istio parses the annotation with.
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class Action(enum.Enum):
    """istio.security.v1beta1.AuthorizationPolicy.Action, by the proto's numbers."""

    ALLOW = 0
    DENY = 1
    AUDIT = 2
    CUSTOM = 3


def action(policy: Config) -> Action:
    """The policy's action (ALLOW when it says none, the proto's default)."""
    return Action(int(spec(policy).action))


def dry_run(policy: Config) -> bool:
    """True when the policy carries `istio.io/dry-run` with a value Go's ParseBool reads as
    true; any other value (see `dry_run_problem`) counts as false, as in Istio."""
    return policy.annotations.get(DRY_RUN_ANNOTATION) in _TRUE


def dry_run_problem(policy: Config) -> str | None:
    """What is wrong with the policy's dry-run annotation, if anything: Istio logs a value it
    cannot parse and enforces the policy."""
    value = policy.annotations.get(DRY_RUN_ANNOTATION)
    if value is None or value in _TRUE or value in _FALSE:
        return None
    return f"annotation {DRY_RUN_ANNOTATION}={value!r} is not a boolean; the policy is enforced"


def policies_for_workload(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> tuple[Config, ...]:
    """The AuthorizationPolicies that apply to a workload of `namespace` with `labels`, in
    Istio's order."""
    return tuple(c for c in _candidates(snapshot, namespace) if _selects(spec(c), labels))


def ignored_policies(snapshot: Snapshot, namespace: str) -> tuple[Config, ...]:
    """The policies of the workload's namespaces that name a `targetRef`: Istio attaches them to
    Gateway API gateways and waypoints only, so they apply to no workload meshctl serves."""
    return tuple(c for c in _candidates(snapshot, namespace) if _has_target_ref(spec(c)))


def _candidates(snapshot: Snapshot, namespace: str) -> Iterator[Config]:
    policies = snapshot.of_kind(KIND)
    if not policies:
        return
    for ns in dict.fromkeys((snapshot.mesh.root_namespace, namespace)):
        yield from sorted((c for c in policies if c.namespace == ns), key=Config.istio_order)


def _has_target_ref(policy: Any) -> bool:
    return bool(policy.HasField("targetRef") or policy.targetRefs)


def _selects(policy: Any, labels: Mapping[str, str]) -> bool:
    if _has_target_ref(policy):
        return False
    if not policy.HasField("selector"):
        return True
    return all(labels.get(key) == value for key, value in policy.selector.match_labels.items())


def with_trust_domain(values: Sequence[str], trust_domain: str) -> list[str]:
    """Istio's trustdomain.Bundle.ReplaceTrustDomainAliases with no aliases: a principal
    `TD/ns/NS/sa/SA` whose TD is the mesh's (Istio's wildcard matching either way) or
    `cluster.local` names the mesh's trust domain; `*/ns/...`, other shapes and foreign trust
    domains stay as written."""
    out: list[str] = []
    for value in values:
        parts = value.split("/")
        if len(parts) != 5 or parts[0] == "*":
            out.append(value)
            continue
        domain = parts[0]
        if domain == CLUSTER_LOCAL or _wildcard_either_way(domain, trust_domain):
            kept = domain.startswith("*") and trust_domain.endswith(domain[1:])
            replaced = value if kept else "/".join([trust_domain, *parts[1:]])
            if replaced not in out:
                out.append(replaced)
        else:
            out.append(value)
    return out


def _wildcard_either_way(a: str, b: str) -> bool:
    """Istio's trustdomain.stringMatch for one pattern: either side may carry the wildcard."""

    def one_way(text: str, pattern: str) -> bool:
        if pattern in ("*", text):
            return True
        if pattern.endswith("*") and text.startswith(pattern[:-1]):
            return True
        return pattern.startswith("*") and text.endswith(pattern[1:])

    return one_way(a, b) or one_way(b, a)
