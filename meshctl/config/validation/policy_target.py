"""What a security policy applies to, checked as Istio checks it for AuthorizationPolicy and
RequestAuthentication (`validateOneOfSelectorType`, `validateWorkloadSelector`,
`validatePolicyTargetReference`): a workload `selector`, or `targetRef`/`targetRefs`, never both.

A target reference names a Service, a ServiceEntry, a Kubernetes Gateway or a GatewayClass in the
policy's own namespace. Such a policy attaches only to Kubernetes Gateway API gateways and
waypoints; meshctl serves neither, so it applies to no proxy meshctl serves, which is worth a
warning: it looks like policy and enforces nothing.
"""

from __future__ import annotations

from typing import Any, Final

from meshctl.config.findings import FieldPath
from meshctl.config.validation.common import Report, check_selector

#: (group, kind) a targetRef may name; the core group is spelled "" or "core".
_TARGET_KINDS: Final = frozenset(
    {
        ("core", "Service"),
        ("networking.istio.io", "ServiceEntry"),
        ("gateway.networking.k8s.io", "Gateway"),
        ("gateway.networking.k8s.io", "GatewayClass"),
    }
)
_TARGET_NAMES: Final = "Service, networking.istio.io/ServiceEntry, gateway.networking.k8s.io/Gateway or GatewayClass"


def check_policy_target(report: Report, policy: Any, what: str) -> None:
    """The `selector`, `targetRef` and `targetRefs` of `policy` (what: "the AuthorizationPolicy")."""
    has_selector = policy.HasField("selector")
    if has_selector:
        check_selector(report, ("spec", "selector", "matchLabels"), policy.selector.match_labels, what)
    refs: list[tuple[FieldPath, Any]] = []
    if policy.HasField("targetRef"):
        refs.append((("spec", "targetRef"), policy.targetRef))
    refs.extend((("spec", "targetRefs", i), ref) for i, ref in enumerate(policy.targetRefs))
    kinds_set = has_selector + policy.HasField("targetRef") + bool(policy.targetRefs)
    if kinds_set > 1:
        at: FieldPath = ("spec", "targetRefs") if policy.targetRefs else ("spec", "targetRef")
        report.error(at, "only one of targetRefs or workloadSelector can be set")
    for path, ref in refs:
        _check_reference(report, path, ref)
    if refs:
        report.warn(
            refs[0][0],
            f"{what} names a targetRef: it attaches only to Kubernetes Gateway API gateways and waypoints, "
            "which meshctl does not serve, so it applies to no proxy here (use a selector)",
        )


def _check_reference(report: Report, path: FieldPath, ref: Any) -> None:
    if not ref.name:
        report.error((*path, "name"), "targetRef name must be set")
    if ref.namespace:
        report.error(
            (*path, "namespace"), "targetRef namespace must not be set; cross namespace referencing is not supported"
        )
    group = ref.group or "core"
    if (group, ref.kind) not in _TARGET_KINDS:
        report.error((*path, "kind"), f"targetRef must be to one of {_TARGET_NAMES} but was {ref.group}/{ref.kind}")
