"""PeerAuthentication rules (Istio's `ValidatePeerAuthentication`): the selector, and the ports of
`portLevelMtls`.

A policy without a selector (or with one that has no labels) covers a whole namespace, or the whole
mesh from the root namespace; Istio refuses port-level modes on such a policy, because the port
is a workload's own port and only means something for the workloads a selector names. The modes
themselves (UNSET, DISABLE, PERMISSIVE, STRICT) are enforced by the schema.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report, check_selector, port_problem


def validate(spec: Message) -> list[Issue]:
    policy: Any = spec
    report = Report()
    labels = {}
    if policy.HasField("selector"):
        labels = policy.selector.match_labels
        check_selector(report, ("spec", "selector", "matchLabels"), labels, "the PeerAuthentication")
    if policy.port_level_mtls and not labels:
        report.error(
            ("spec", "portLevelMtls"),
            "portLevelMtls requires a selector with matchLabels: "
            "a mesh- or namespace-wide PeerAuthentication cannot have port-level mTLS",
        )
    for port in sorted(policy.port_level_mtls):
        report.error(("spec", "portLevelMtls", str(port)), port_problem(port))
    return report.issues
