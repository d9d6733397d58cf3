"""Rules that need the resource's own namespace, which the per-kind rules (they see the spec
alone) cannot apply. Istio's validation has the namespace at hand and puts it in for `.`:

- `exportTo` naming both `.` and the namespace itself names it twice (Istio's
  `validateExportTo` refuses duplicates after that substitution);
- a DestinationRule with a `workloadSelector` applies to workloads of its own namespace only,
  so it may be exported to that namespace alone (`.` or its name);
- a Sidecar egress host written both as `./host` and `NAMESPACE/host` imports the same host
  twice (Istio warns, as for any duplicate egress host).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report

#: Kinds with an `exportTo` list.
_EXPORTED = ("VirtualService", "DestinationRule", "ServiceEntry")


def validate_own_namespace(kind: str, namespace: str, spec: Message) -> list[Issue]:
    report = Report()
    resource: Any = spec
    if kind in _EXPORTED:
        _export_to_self(report, namespace, list(resource.export_to))
    if kind == "DestinationRule" and resource.HasField("workload_selector"):
        _selected_rule_export(report, namespace, list(resource.export_to))
    if kind == "Sidecar":
        for i, listener in enumerate(resource.egress):
            _egress_self_duplicates(report, ("spec", "egress", i, "hosts"), namespace, list(listener.hosts))
    return report.issues


def _export_to_self(report: Report, namespace: str, export_to: list[str]) -> None:
    if "." in export_to and namespace in export_to:
        report.error(
            ("spec", "exportTo", export_to.index(namespace)),
            f'duplicate exportTo entry "{namespace}": "." already exports to this namespace',
        )


def _selected_rule_export(report: Report, namespace: str, export_to: list[str]) -> None:
    beyond = [entry for entry in export_to if entry not in (".", namespace)]
    if beyond:
        report.error(
            ("spec", "exportTo", export_to.index(beyond[0])),
            f'a DestinationRule with a workloadSelector can only be exported to its namespace, not "{beyond[0]}"',
        )


def _egress_self_duplicates(report: Report, path: FieldPath, namespace: str, hosts: list[str]) -> None:
    """Warn where a host repeats one written with the other spelling of this namespace (`.` or its
    name); repeats with the same spelling are the per-kind rule's warning already."""
    seen: dict[str, list[tuple[str, str]]] = defaultdict(list)  # namespace -> (name, as written)
    for j, host in enumerate(hosts):
        written, slash, name = host.partition("/")
        if not slash or written not in (".", namespace):
            continue
        earlier = seen[namespace]
        clashes = [w for n, w in earlier if name == "*" or n in (name, "*")]
        if clashes and written not in clashes:
            report.warn(
                (*path, j),
                f'duplicate egress host "{host}": "{clashes[0]}/" and "{written}/" are the same namespace here',
            )
        earlier.append((name, written))
