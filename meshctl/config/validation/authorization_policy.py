"""AuthorizationPolicy rules (Istio's `ValidateAuthorizationPolicy`), each at its field.

- What it applies to: a `selector` or `targetRef(s)`, not both (`policy_target`).
- The action: CUSTOM needs rules and a `provider.name`, and its rules cannot match on
  identities (namespaces, principals, request principals, and the `when` keys that read them),
  which Istio does not support with CUSTOM; `provider` goes with CUSTOM only; DENY without rules
  would never match (an empty rule `{}` matches every request).
- Each rule: a `from` entry needs a non-empty `source` (`serviceAccounts`, as `NAMESPACE/NAME`
  without wildcards, not beside principals or namespaces; `trustDomains` without `/`), a
  `to` entry a non-empty `operation`;
  no empty strings in any list; IP blocks are addresses or CIDR blocks; ports are numbers up to
  65535; path templates (`{*}`, `{**}`) are well formed; a `when` condition has a known key
  (`authz_values`) and at least one of `values` and `notValues`, each valid for its key.
- Values Envoy matches by a regex (namespaces, principals led by `*`) short enough for the
  regex to compile under Envoy's program size limit (`regex_program`).
- Istio's warning for a DENY rule made only of HTTP attributes: on a TCP port those cannot be
  checked, so the rule matches, and denies, every connection.

meshctl adds one warning: a `*` inside a value (`api-*-prod`) is matched literally, since
Istio's matchers take `*` as a wildcard only alone, first or last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.authz_values import (
    IP_KEYS,
    MAX_SERVICE_ACCOUNTS,
    PORT_KEY,
    SERVICE_ACCOUNT_KEY,
    condition_key_problem,
    condition_regex_problem,
    condition_value_problem,
    ip_block_problem,
    namespace_principal_regex,
    path_template_problem,
    port_value_problem,
    principal_regex,
    regex_size_problem,
    service_account_problem,
    trust_domain_problem,
    trust_domain_regex,
    wildcard_problem,
)
from meshctl.config.validation.common import Report, enum_name
from meshctl.config.validation.policy_target import check_policy_target

# Source and Operation fields as YAML spells them, with their protobuf names.
_SOURCE: Final = (
    ("principals", "principals"),
    ("notPrincipals", "not_principals"),
    ("requestPrincipals", "request_principals"),
    ("notRequestPrincipals", "not_request_principals"),
    ("namespaces", "namespaces"),
    ("notNamespaces", "not_namespaces"),
    ("ipBlocks", "ip_blocks"),
    ("notIpBlocks", "not_ip_blocks"),
    ("remoteIpBlocks", "remote_ip_blocks"),
    ("notRemoteIpBlocks", "not_remote_ip_blocks"),
    ("serviceAccounts", "service_accounts"),
    ("notServiceAccounts", "not_service_accounts"),
    ("trustDomains", "trust_domains"),
    ("notTrustDomains", "not_trust_domains"),
)
_OPERATION: Final = (
    ("hosts", "hosts"),
    ("notHosts", "not_hosts"),
    ("ports", "ports"),
    ("notPorts", "not_ports"),
    ("methods", "methods"),
    ("notMethods", "not_methods"),
    ("paths", "paths"),
    ("notPaths", "not_paths"),
)
#: The regex Envoy matches a value of these lists with (its size is bounded).
_REGEXES: Final[dict[str, Callable[[str], str | None]]] = {
    **dict.fromkeys(("namespaces", "notNamespaces"), namespace_principal_regex),
    **dict.fromkeys(("principals", "notPrincipals"), principal_regex),
    **dict.fromkeys(("trustDomains", "notTrustDomains"), trust_domain_regex),
}
_IP_FIELDS: Final = frozenset({"ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks"})
#: The check of each value of a list, for the lists whose values have a form.
_VALUE_PROBLEMS: Final[dict[str, Callable[[str], str | None]]] = {
    **dict.fromkeys(_IP_FIELDS, ip_block_problem),
    **dict.fromkeys(("ports", "notPorts"), port_value_problem),
    **dict.fromkeys(("paths", "notPaths"), path_template_problem),
    **dict.fromkeys(("serviceAccounts", "notServiceAccounts"), service_account_problem),
    **dict.fromkeys(("trustDomains", "notTrustDomains"), trust_domain_problem),
}
#: Source fields naming a peer identity that `serviceAccounts` may not be combined with.
_IDENTITY_FIELDS: Final = ("principals", "notPrincipals", "namespaces", "notNamespaces")
_SERVICE_ACCOUNT_FIELDS: Final = ("serviceAccounts", "notServiceAccounts")
# Source fields an L4 (TCP) rule can check; the others need HTTP (Istio's tcpRulesInFrom).
_TCP_SOURCE: Final = frozenset(
    {"principals", "notPrincipals", "namespaces", "notNamespaces", "serviceAccounts", "notServiceAccounts",
     "trustDomains", "notTrustDomains", *_IP_FIELDS}
)  # fmt: skip
_WILDCARD_FIELDS: Final = frozenset(
    {"principals", "notPrincipals", "requestPrincipals", "notRequestPrincipals", "namespaces", "notNamespaces",
     "hosts", "notHosts", "paths", "notPaths"}
)  # fmt: skip
# What CUSTOM cannot match on: identities, and the `when` keys that read them.
_CUSTOM_SOURCE: Final = ("namespaces", "notNamespaces", "serviceAccounts", "notServiceAccounts", "principals",
                         "notPrincipals", "requestPrincipals", "notRequestPrincipals", "trustDomains",
                         "notTrustDomains")  # fmt: skip
_CUSTOM_KEYS: Final = frozenset({"source.namespace", "source.serviceAccount", "source.principal"})

_DENY_HTTP_ONLY: Final = (
    "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the use of only "
    "HTTP attributes in a DENY rule; it is recommended to explicitly specify the port"
)
_NEVER_TRIGGERED: Final = (
    "{action} action without `rules` is meaningless as it will never be triggered, "
    "add an empty rule `{{}}` if you want it be triggered for every request"
)


def validate(spec: Message) -> list[Issue]:
    policy: Any = spec
    report = Report()
    check_policy_target(report, policy, "the AuthorizationPolicy")
    action = enum_name(policy, "action")
    if action == "CUSTOM":
        _custom(report, policy)
    if policy.HasField("provider") and action != "CUSTOM":
        report.error(("spec", "provider"), f"`provider` must not be with non CUSTOM action, found {action}")
    if action == "DENY" and not policy.rules:
        report.error(("spec", "action"), _NEVER_TRIGGERED.format(action="DENY"))
    for i, rule in enumerate(policy.rules):
        _rule(report, ("spec", "rules", i), rule, deny=action == "DENY")
    return report.issues


def _custom(report: Report, policy: Any) -> None:
    if not policy.rules:
        report.error(("spec", "action"), _NEVER_TRIGGERED.format(action="CUSTOM"))
    elif not policy.provider.name:
        at: FieldPath = ("spec", "provider", "name") if policy.HasField("provider") else ("spec", "action")
        report.error(at, "`provider.name` must not be empty")
    for i, rule in enumerate(policy.rules):
        for j, entry in enumerate(_sources(rule)):
            for name in _CUSTOM_SOURCE:
                if _values(entry.source, name):
                    at = ("spec", "rules", i, "from", j, "source", name)
                    report.error(at, f"From.{name[0].upper()}{name[1:]} is currently not supported with CUSTOM action")
        for k, condition in enumerate(rule.when):
            if condition.key in _CUSTOM_KEYS or condition.key.startswith("request.auth."):
                at = ("spec", "rules", i, "when", k, "key")
                report.error(at, f"{condition.key} is currently not supported with CUSTOM action")


def _rule(report: Report, path: FieldPath, rule: Any, *, deny: bool) -> None:
    from_exists = to_exists = tcp_in_from = tcp_in_to = False
    for j, entry in enumerate(_sources(rule)):
        at: FieldPath = (*path, "from", j)
        if not entry.HasField("source"):
            report.error(at, "`from.source` must not be nil")
            continue
        from_exists = True
        source = entry.source
        set_fields = [name for name, _ in _SOURCE if _values(source, name)]
        if not set_fields:
            report.error((*at, "source"), "`from.source` must not be empty")
        if any(name in set_fields for name in _IDENTITY_FIELDS):
            for name in _SERVICE_ACCOUNT_FIELDS:
                if name in set_fields:
                    report.error((*at, "source", name), "cannot set serviceAccounts with namespaces or principals")
        tcp_in_from = tcp_in_from or any(name in _TCP_SOURCE for name in set_fields)
        for name in set_fields:
            _check_values(report, (*at, "source", name), name, _values(source, name))
    for j, entry in enumerate(rule.to):
        at = (*path, "to", j)
        if not entry.HasField("operation"):
            report.error(at, "`to.operation` must not be nil")
            continue
        to_exists = True
        operation = entry.operation
        set_fields = [name for name, _ in _OPERATION if _values(operation, name)]
        if not set_fields:
            report.error((*at, "operation"), "`to.operation` must not be empty")
        tcp_in_to = tcp_in_to or "ports" in set_fields or "notPorts" in set_fields
        for name in set_fields:
            _check_values(report, (*at, "operation", name), name, _values(operation, name))
    for k, condition in enumerate(rule.when):
        _condition(report, (*path, "when", k), condition)
    if deny and ((from_exists and not to_exists and not tcp_in_from) or (to_exists and not tcp_in_to)):
        report.warn(path, _DENY_HTTP_ONLY)


def _condition(report: Report, path: FieldPath, condition: Any) -> None:
    key = condition.key
    if not key:
        report.error((*path, "key"), "`key` must not be empty")
        return
    if not condition.values and not condition.not_values:
        report.error(path, f"at least one of `values` or `notValues` must be set for key {key}")
        return
    report.error((*path, "key"), condition_key_problem(key))
    literal = key in IP_KEYS or key == PORT_KEY
    for field, values in (("values", condition.values), ("notValues", condition.not_values)):
        if key == SERVICE_ACCOUNT_KEY and len(values) > MAX_SERVICE_ACCOUNTS:
            report.error((*path, field), f"may not have more than {MAX_SERVICE_ACCOUNTS} values")
        for i, value in enumerate(values):
            problem = condition_value_problem(key, value) or condition_regex_problem(key, value)
            report.error((*path, field, i), problem)
            if problem is None and not literal:
                report.warn((*path, field, i), wildcard_problem(value))


def _check_values(report: Report, path: FieldPath, name: str, values: Iterable[str]) -> None:
    """One Source or Operation list: no empty value, and each value valid for its field."""
    problem = _VALUE_PROBLEMS.get(name)
    for i, value in enumerate(values):
        if not value:
            report.error((*path, i), f"empty value not allowed, found in {name[0].upper()}{name[1:]}")
            continue
        if problem is not None:
            report.error((*path, i), problem(value))
        if name in _SERVICE_ACCOUNT_FIELDS and i == MAX_SERVICE_ACCOUNTS:
            report.error(path, f"may not have more than {MAX_SERVICE_ACCOUNTS} values")
        regex = _REGEXES.get(name)
        if regex is not None:
            report.error((*path, i), regex_size_problem(regex(value)))
        if name in _WILDCARD_FIELDS and not (name in ("paths", "notPaths") and "{" in value):
            report.warn((*path, i), wildcard_problem(value))


def _sources(rule: Any) -> Any:
    """A rule's `from` entries (a Python keyword, so not an attribute to write)."""
    return getattr(rule, "from")


_FIELD_NAMES: Final = {**dict(_SOURCE), **dict(_OPERATION)}


def _values(message: Any, name: str) -> list[str]:
    """A Source or Operation list by its YAML name."""
    return list(getattr(message, _FIELD_NAMES[name]))
