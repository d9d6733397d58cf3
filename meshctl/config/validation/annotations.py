"""Annotations Istio's validation reads (`checkDryRunAnnotation`, run before every kind's rules).

`istio.io/dry-run` belongs to AuthorizationPolicy alone, and there only to ALLOW and DENY (the
actions whose RBAC filter has shadow rules), with a value Go's `strconv.ParseBool` reads. Istio
refuses the resource otherwise; meshctl used to keep such a policy and enforce it, which is the
opposite of what a user asking for a dry run meant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.validation import Issue
from meshctl.config.validation.common import enum_name

DRY_RUN: Final = "istio.io/dry-run"
#: What Go's strconv.ParseBool takes.
GO_BOOLEANS: Final = frozenset({"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"})


def validate_annotations(
    kind: str, namespace: str, name: str, annotations: Mapping[str, str], spec: Message
) -> list[Issue]:
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
