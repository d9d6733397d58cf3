"""EnvoyFilter rules, as pilot's validation has them, plus what meshctl cannot apply.

Istio refuses a patch without `applyTo`, operation or (but for REMOVE) value, a match of the
wrong class for the applyTo (a cluster match on an HTTP_FILTER), a sub-filter match outside
`HTTP_FILTER` or not under the HTTP connection manager, a `proxyVersion` that is no regular
expression, and a value that does not parse into the Envoy type of its applyTo: so does meshctl.
Istio accepts operations that do nothing for their applyTo (ADD on a ROUTE_CONFIGURATION):
meshctl accepts them too, with a warning. `EXTENSION_CONFIG` needs ECDS, which meshctl
does not serve: an error, not a patch silently dropped. `BOOTSTRAP` patches are applied by
`meshctl bootstrap --config` (`meshctl/bootstrap_patches.py`), never by `serve`: a warning says
so. `targetRefs` are checked against what meshctl resolves (`snapshot/target_refs.py`).
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.message import Message

from meshctl.api.networking.v1alpha3 import envoy_filter_pb2
from meshctl.config.envoy_types import deprecated_fields, parse_value
from meshctl.config.findings import FieldPath
from meshctl.config.references import POLICY_TARGET_KINDS, POLICY_TARGET_NAMES
from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report, check_selector, enum_name

EF = envoy_filter_pb2.EnvoyFilter
HCM_NAMES = frozenset({"envoy.filters.network.http_connection_manager", "envoy.http_connection_manager"})

_HCM = "envoy.filters.network.http_connection_manager"
_LISTENER_CLASS = frozenset({EF.LISTENER, EF.FILTER_CHAIN, EF.NETWORK_FILTER, EF.HTTP_FILTER, EF.LISTENER_FILTER})
_ROUTE_CLASS = frozenset({EF.ROUTE_CONFIGURATION, EF.VIRTUAL_HOST, EF.HTTP_ROUTE})
_INSERTS = frozenset({EF.Patch.INSERT_BEFORE, EF.Patch.INSERT_AFTER, EF.Patch.INSERT_FIRST})

#: The operations that change something, per applyTo (the patcher implements exactly these).
EFFECTIVE: dict[int, frozenset[int]] = {
    EF.LISTENER: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE}),
    EF.FILTER_CHAIN: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE}),
    EF.NETWORK_FILTER: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE, EF.Patch.REPLACE, *_INSERTS}),
    EF.HTTP_FILTER: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE, EF.Patch.REPLACE, *_INSERTS}),
    EF.LISTENER_FILTER: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE, EF.Patch.REPLACE, *_INSERTS}),
    EF.ROUTE_CONFIGURATION: frozenset({EF.Patch.MERGE}),
    EF.VIRTUAL_HOST: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE, EF.Patch.REPLACE}),
    EF.HTTP_ROUTE: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE, *_INSERTS}),
    EF.CLUSTER: frozenset({EF.Patch.MERGE, EF.Patch.ADD, EF.Patch.REMOVE}),
    EF.BOOTSTRAP: frozenset({EF.Patch.MERGE}),
}


def validate(spec: Message) -> list[Issue]:
    ef: Any = spec
    report = Report()
    if ef.HasField("workload_selector"):
        check_selector(report, ("spec", "workloadSelector", "labels"), ef.workload_selector.labels, "the EnvoyFilter")
        if ef.target_refs:
            report.error(("spec", "targetRefs"), "workloadSelector and targetRefs cannot both be set")
    for i, ref in enumerate(ef.target_refs):
        _target_ref(report, ("spec", "targetRefs", i), ref)
    for i, patch in enumerate(ef.config_patches):
        _patch(report, ("spec", "configPatches", i), patch)
    return report.issues


def _target_ref(report: Report, path: FieldPath, ref: Any) -> None:
    """A target reference meshctl can resolve (`snapshot/target_refs.py`), in the filter's namespace."""
    if not ref.name:
        report.error((*path, "name"), "targetRef name must be set")
    if ref.namespace:
        report.error((*path, "namespace"), "targetRef namespace must not be set: it names the EnvoyFilter's own")
    group = ref.group or "core"
    if (group, ref.kind) == ("gateway.networking.k8s.io", "GatewayClass"):
        report.error((*path, "kind"), "a GatewayClass names gateways of a class, which meshctl does not have")
    elif (group, ref.kind) not in POLICY_TARGET_KINDS:
        report.error((*path, "kind"), f"targetRef must be to a {POLICY_TARGET_NAMES}, not {group}/{ref.kind}")


def _patch(report: Report, path: FieldPath, cp: Any) -> None:
    apply_to = cp.apply_to
    if apply_to == EF.INVALID:
        report.error((*path, "applyTo"), "missing applyTo")
        return
    if apply_to == EF.EXTENSION_CONFIG:
        report.error(
            (*path, "applyTo"),
            "applyTo EXTENSION_CONFIG patches ECDS resources, which meshctl does not serve: WasmPlugins are "
            "written inline in the listeners, patch them with HTTP_FILTER (subFilter name NAMESPACE.NAME)",
        )
        return
    if apply_to == EF.BOOTSTRAP:
        if cp.HasField("match") and cp.match.WhichOneof("object_types") is not None:
            report.error((*path, "match"), "applyTo BOOTSTRAP takes no listener, route configuration or cluster match")
            return
        report.warn(
            (*path, "applyTo"),
            "applyTo BOOTSTRAP is applied by `meshctl bootstrap --config` when it writes the bootstrap, never by "
            "`serve`: write the proxy's bootstrap again and restart its Envoy for the patch to take effect",
        )
    if not cp.HasField("patch"):
        report.error((*path, "patch"), "missing patch")
        return
    operation = cp.patch.operation
    if operation == EF.Patch.INVALID:
        report.error((*path, "patch", "operation"), "missing patch operation")
        return
    if operation != EF.Patch.REMOVE and not cp.patch.HasField("value"):
        report.error((*path, "patch", "value"), "missing patch value for non-remove operation")
        return
    if operation not in EFFECTIVE[apply_to]:
        report.warn(
            (*path, "patch", "operation"),
            f"operation {enum_name(cp.patch, 'operation')} has no effect on {enum_name(cp, 'apply_to')}",
        )
    if cp.HasField("match") and not _match(report, (*path, "match"), cp.match, apply_to):
        return
    if cp.patch.HasField("value"):
        try:
            value = parse_value(enum_name(cp, "apply_to"), cp.patch.value)
        except ValueError as exc:
            report.error((*path, "patch", "value"), str(exc))
            return
        for name in deprecated_fields(value):
            report.warn((*path, "patch", "value"), f"{name} is deprecated: Envoy warns of it and will remove it")


def _match(report: Report, path: FieldPath, match: Any, apply_to: int) -> bool:
    """Check a patch's match; False when the patch is wrong enough that its value is moot."""
    if match.HasField("proxy") and match.proxy.proxy_version:
        try:
            re.compile(match.proxy.proxy_version)
        except re.error as exc:
            report.error((*path, "proxy", "proxyVersion"), f"invalid regex for proxy version: {exc}")
    kind = match.WhichOneof("object_types")
    if kind is None:
        return True
    if apply_to in _LISTENER_CLASS and kind != "listener":
        report.error(path, "applyTo for listener class objects cannot have non listener match")
        return False
    if apply_to in _ROUTE_CLASS and kind != "route_configuration":
        report.error(path, "applyTo for http route class objects cannot have non route configuration match")
        return False
    if apply_to == EF.CLUSTER and kind != "cluster":
        report.error(path, "applyTo for cluster class objects cannot have non cluster match")
        return False
    if kind != "listener" or not match.listener.HasField("filter_chain"):
        return True
    chain = match.listener.filter_chain
    if not chain.HasField("filter"):
        return True
    fpath = (*path, "listener", "filterChain", "filter")
    if apply_to in (EF.LISTENER, EF.FILTER_CHAIN):
        report.warn(fpath, f"filter match has no effect when used with {EF.ApplyTo.Name(apply_to)}")
    if not chain.filter.name:
        report.error((*fpath, "name"), "filter match has no name to match on")
        return False
    if chain.filter.HasField("sub_filter"):
        if apply_to != EF.HTTP_FILTER:
            report.error((*fpath, "subFilter"), "subfilter match can be used with applyTo HTTP_FILTER only")
            return False
        if chain.filter.name not in HCM_NAMES:
            report.error((*fpath, "subFilter"), f"subfilter match requires filter match with {_HCM}")
            return False
        if not chain.filter.sub_filter.name:
            report.error((*fpath, "subFilter", "name"), "subfilter match has no name to match on")
            return False
    return True
