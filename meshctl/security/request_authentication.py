"""Which RequestAuthentication policies, and so which JWT rules, apply to a workload: Istio's
selection (`AuthenticationPolicies.GetJwtPoliciesForWorkload`, `WorkloadPolicyMatcher`).

Unlike PeerAuthentication, where one policy per level wins, RequestAuthentication policies add
up: a workload accepts the tokens of every rule of every policy that applies to it.

- a policy in the workload's namespace applies when it has no selector, or when its selector's
  labels are all among the workload's;
- a policy in the root namespace (MeshConfig's, `istio-system`) applies by the same test to
  workloads of every namespace: without a selector it is mesh-wide, with one it selects matching
  workloads anywhere;
- a policy with `targetRef`/`targetRefs` attaches only to Kubernetes Gateway API gateways and
  waypoints, which meshctl does not serve, so it applies to no workload (Istio ignores such a
  policy for every other proxy).

Policies are taken namespace by namespace, the workload's first, each in Istio's creation order
(`Config.istio_order`); their rules are then sorted by issuer, as Istio sorts them so that the
generated filter is deterministic (a stable sort: rules of one issuer keep that order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from meshctl.config.model import Config
from meshctl.snapshot.model import Snapshot, spec

KIND: Final = "RequestAuthentication"


def policies_for_workload(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> tuple[Config, ...]:
    """The RequestAuthentication policies that apply to a workload of `namespace` with `labels`,
    in Istio's order."""
    policies = snapshot.of_kind(KIND)
    if not policies:
        return ()
    out: list[Config] = []
    for ns in dict.fromkeys((namespace, snapshot.mesh.root_namespace)):
        own = sorted((c for c in policies if c.namespace == ns), key=Config.istio_order)
        out.extend(c for c in own if _attaches(spec(c), labels))
    return tuple(out)


def jwt_rules_for_workload(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> tuple[Any, ...]:
    """Every JWT rule (`istio.security.v1beta1.JWTRule`) the workload's proxy validates tokens
    with, sorted by issuer: the input of `meshctl.xds.jwt_authn.build_jwt_authn`."""
    return sorted_jwt_rules(policies_for_workload(snapshot, namespace, labels))


def sorted_jwt_rules(policies: Iterable[Config]) -> tuple[Any, ...]:
    """The JWT rules of `policies` (in Istio's order), sorted by issuer."""
    rules = [rule for policy in policies for rule in spec(policy).jwt_rules]
    return tuple(sorted(rules, key=lambda rule: rule.issuer))


def _attaches(policy: Any, labels: Mapping[str, str]) -> bool:
    if policy.HasField("targetRef") or policy.targetRefs:
        return False
    if not policy.HasField("selector"):
        return True
    return all(labels.get(key) == value for key, value in policy.selector.match_labels.items())
