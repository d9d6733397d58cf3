"""Metadata Istio's validation reads: annotations (`checkDryRunAnnotation`, run before every
kind's rules), the waypoint label of a DYNAMIC_DNS ServiceEntry, a ServiceEntry's traffic
distribution annotation (unknown values Istio takes as `Any` with a warning), and the resource's
namespace (`own_namespace.py`).

`istio.io/dry-run` belongs to AuthorizationPolicy alone, and there only to ALLOW and DENY (the
actions whose RBAC filter has shadow rules), with a value Go's `strconv.ParseBool` reads. Istio
refuses the resource otherwise; meshctl used to keep such a policy and enforce it, which is the
opposite of what a user asking for a dry run meant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import Severity
from meshctl.config.model import ConfigKey
from meshctl.config.validation import Issue
from meshctl.config.validation.common import enum_name
from meshctl.config.validation.own_namespace import validate_own_namespace

DRY_RUN: Final = "istio.io/dry-run"
USE_WAYPOINT: Final = "istio.io/use-waypoint"
TRAFFIC_DISTRIBUTION: Final = "networking.istio.io/traffic-distribution"
#: The values Istio knows for it, compared without case.
TRAFFIC_DISTRIBUTIONS: Final = ("Any", "PreferClose", "PreferSameZone", "PreferSameNode")
#: What Go's strconv.ParseBool takes.
GO_BOOLEANS: Final = frozenset({"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"})


def validate_metadata(
    key: ConfigKey, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Message
) -> list[Issue]:
    kind = key.kind
    issues = _dry_run(kind, key.namespace, key.name, annotations, spec)
    if kind == "ServiceEntry" and USE_WAYPOINT in labels:
        entry: Any = spec
        if enum_name(entry, "resolution") == "DYNAMIC_DNS" and enum_name(entry, "location") == "MESH_INTERNAL":
            message = "a MESH_INTERNAL ServiceEntry with resolution DYNAMIC_DNS cannot use a waypoint"
            issues.append(Issue(("metadata", "labels", USE_WAYPOINT), message))
    if kind == "ServiceEntry" and TRAFFIC_DISTRIBUTION in annotations:
        issues.extend(_traffic_distribution(annotations[TRAFFIC_DISTRIBUTION], spec))
    return issues + validate_own_namespace(kind, key.namespace, spec)


def _traffic_distribution(value: str, spec: Message) -> list[Issue]:
    at = ("metadata", "annotations", TRAFFIC_DISTRIBUTION)
    if value.strip().lower() not in {v.lower() for v in TRAFFIC_DISTRIBUTIONS}:
        known = ", ".join(TRAFFIC_DISTRIBUTIONS)
        return [Issue(at, f'unknown traffic distribution "{value}" (one of {known}): served as Any', Severity.WARNING)]
    entry: Any = spec
    if value.strip().lower() != "any" and enum_name(entry, "resolution") != "STATIC":
        message = (
            f"a traffic distribution only orders the endpoints of a STATIC entry; with resolution "
            f"{enum_name(entry, 'resolution')} it changes nothing (as in Istio)"
        )
        return [Issue(at, message, Severity.WARNING)]
    return []


def _dry_run(kind: str, namespace: str, name: str, annotations: Mapping[str, str], spec: Message) -> list[Issue]:
    value = annotations.get(DRY_RUN)
    if value is None:
        return []
    at = ("metadata", "annotations", DRY_RUN)
    if kind != "AuthorizationPolicy":
        return [Issue(at, f"{namespace}/{name} has unsupported annotation {DRY_RUN}, please remove the annotation")]
    policy: Any = spec
    action = enum_name(policy, "action")
    if action not in ("ALLOW", "DENY"):
        message = f"the annotation {DRY_RUN} currently only supports action ALLOW/DENY, found action {action}"
        return [Issue(at, f"{message} in {namespace}/{name}")]
    if value not in GO_BOOLEANS:
        return [
            Issue(
                at,
                f"{namespace}/{name} has annotation {DRY_RUN} with invalid value ({value}): "
                f'strconv.ParseBool: parsing "{value}": invalid syntax',
            )
        ]
    return []
