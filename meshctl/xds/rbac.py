"""AuthorizationPolicies as Envoy RBAC filters on a workload's inbound chains: Istio's
`security/authz/builder` (builder.go) for sidecars.

The policies that select the workload (`meshctl.security.authorization`) are split by action,
and each action with a policy becomes one RBAC filter, in Istio's order:

1. CUSTOM: Istio hands these to an external authorizer (`ext_authz`) named by a MeshConfig
   extension provider; meshctl configures none. Istio, when it cannot resolve the provider,
   denies what the CUSTOM rules match (a DENY filter of those rules, each named
   `istio-ext-authz-PROVIDER-ns[NS]-policy[NAME]-rule[N]-deny-due-to-bad-CUSTOM-action`); so does
   meshctl, and says so in a warning. Such a policy never fails open: what it would have sent to
   the authorizer is refused, on HTTP and TCP ports alike.
2. AUDIT: Envoy's action LOG (marks the request for the access log, never denies).
3. DENY.
4. ALLOW: with one, a request that no ALLOW rule matches is denied. Without an ALLOW policy
   there is no ALLOW filter and requests are allowed, Istio's default.

On an HTTP chain the filters (`envoy.filters.http.rbac`, the one name Istio gives them all) come
first in the HTTP connection manager, so a denied request never reaches the routes (403,
`RBAC: access denied`); on a TCP chain (`envoy.filters.network.rbac`, stat prefix `tcp.`) they
come before tcp_proxy and a denied connection is closed.

Each rule is one RBAC policy named `ns[NS]-policy[NAME]-rule[N]` (`rbac_match` translates it).
A policy without rules (`spec: {}`) is one that matches nothing, named for rule 0: an ALLOW one
so denies everything; a rule `{}` matches everything. A policy annotated `istio.io/dry-run:
"true"` goes to the filter's `shadow_rules` (evaluated, counted under Istio's stat prefixes
`istio_dry_run_allow_`/`istio_dry_run_deny_`, never enforced); a filter with only dry-run
policies enforces nothing.

A field a TCP chain cannot see (hosts, methods, paths, request principals, `request.*`
conditions) is handled as Istio does and logged with the policy and field: an ALLOW rule that
uses one matches nothing on TCP ports, a DENY or AUDIT rule is kept without it (it denies more).
Principals and namespaces need the client's certificate: on a plaintext chain no principal is
authenticated, so they match nothing there (an ALLOW of principals refuses plaintext clients).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2

from meshctl.config.model import Config
from meshctl.security.authorization import KIND, Action, action, dry_run, dry_run_problem
from meshctl.snapshot.model import spec
from meshctl.xds.jwt_authn import jwt_authn_filter
from meshctl.xds.listener_filters import network_filter, typed
from meshctl.xds.rbac_match import MATCH_NEVER, FieldError, translate_rule

logger = logging.getLogger("meshctl.xds.rbac")

HTTP_RBAC: Final = "envoy.filters.http.rbac"
NETWORK_RBAC: Final = "envoy.filters.network.rbac"
#: Istio's RBACTCPFilterStatPrefix.
TCP_STAT_PREFIX: Final = "tcp."
#: Istio's RBACShadowRulesAllowStatPrefix and RBACShadowRulesDenyStatPrefix.
DRY_RUN_ALLOW_STAT_PREFIX: Final = "istio_dry_run_allow_"
DRY_RUN_DENY_STAT_PREFIX: Final = "istio_dry_run_deny_"
#: Istio's extAuthzMatchPrefix and badCustomActionSuffix.
EXT_AUTHZ_PREFIX: Final = "istio-ext-authz"
BAD_CUSTOM_SUFFIX: Final = "-deny-due-to-bad-CUSTOM-action"

_RBAC = rbac_pb2.RBAC
#: The filters in Istio's order, each action with the Envoy action it becomes.
_ORDER: Final = (
    (Action.CUSTOM, _RBAC.DENY),
    (Action.AUDIT, _RBAC.LOG),
    (Action.DENY, _RBAC.DENY),
    (Action.ALLOW, _RBAC.ALLOW),
)


def policy_name(config: Config, rule: int) -> str:
    """Istio's policyName for ALLOW, DENY and AUDIT rules."""
    return f"ns[{config.namespace}]-policy[{config.name}]-rule[{rule}]"


def _custom_name(config: Config, rule: int) -> str:
    provider = spec(config).provider.name
    prefix = f"{EXT_AUTHZ_PREFIX}-{provider}-" if provider else f"{EXT_AUTHZ_PREFIX}-"
    return prefix + policy_name(config, rule) + BAD_CUSTOM_SUFFIX


@dataclass(frozen=True, slots=True)
class FilterRules:
    """What one RBAC filter enforces (`rules`) and only evaluates (`shadow`), either absent."""

    action: int
    rules: rbac_pb2.RBAC | None
    shadow: rbac_pb2.RBAC | None

    @property
    def shadow_stat_prefix(self) -> str:
        """Istio's shadowRuleStatPrefix: by the shadow rules' action, none for LOG."""
        if self.shadow is None:
            return ""
        if self.shadow.action == _RBAC.ALLOW:
            return DRY_RUN_ALLOW_STAT_PREFIX
        if self.shadow.action == _RBAC.DENY:
            return DRY_RUN_DENY_STAT_PREFIX
        return ""


def filter_rules(policies: Sequence[Config], *, trust_domain: str, for_tcp: bool) -> list[FilterRules]:
    """The rules of each RBAC filter the policies make on an HTTP or a TCP chain, in order."""
    out = []
    for kind, envoy_action in _ORDER:
        chosen = [p for p in policies if action(p) is kind]
        if chosen:
            out.append(_build(chosen, kind, envoy_action, trust_domain=trust_domain, for_tcp=for_tcp))
    return out


def _build(
    policies: Sequence[Config], kind: Action, envoy_action: int, *, trust_domain: str, for_tcp: bool
) -> FilterRules:
    """Istio's Builder.build for one action (CUSTOM as getBadCustomDenyRules of its enforced
    policies: a dry-run CUSTOM policy denies nothing)."""
    enforced = _RBAC(action=envoy_action)
    shadow = _RBAC(action=envoy_action)
    has_enforced = has_shadow = False
    name = _custom_name if kind is Action.CUSTOM else policy_name
    for config in policies:
        target = enforced
        if dry_run(config):
            if kind is Action.CUSTOM:
                continue
            target, has_shadow = shadow, True
        else:
            has_enforced = True
        rules = spec(config).rules
        for index, rule in enumerate(rules):
            translation = translate_rule(
                rule,
                policy_namespace=config.namespace,
                trust_domain=trust_domain,
                for_tcp=for_tcp,
                allow=kind is Action.ALLOW,
            )
            _report(config, index, kind, translation.policy is None, translation.problems)
            if translation.policy is not None:
                target.policies[name(config, index)].CopyFrom(translation.policy)
        if not rules:
            target.policies[name(config, 0)].CopyFrom(MATCH_NEVER)
    return FilterRules(envoy_action, enforced if has_enforced else None, shadow if has_shadow else None)


def _report(config: Config, rule: int, kind: Action, skipped: bool, problems: Iterable[FieldError]) -> None:
    where = f"{KIND} {config.namespace}/{config.name} rule {rule} ({kind.name})"
    seen: set[tuple[str, bool]] = set()
    for problem in problems:
        if (problem.field, problem.http_only) in seen:
            continue
        seen.add((problem.field, problem.http_only))
        if skipped and problem.http_only:
            message = f"{problem.field} is HTTP only: on TCP ports the rule matches nothing, as in Istio"
        elif skipped:
            message = f"{problem.field}: {problem.reason}; the rule matches nothing, as in Istio"
        elif problem.http_only:
            message = (
                f"{problem.field} is HTTP only: left out on TCP ports, so there the rule matches more, as in Istio"
            )
        else:
            message = f"{problem.field}: {problem.reason}; left out, so the rule matches more, as in Istio"
        logger.warning("%s: %s", where, message)


def http_filter(rules: FilterRules) -> hcm_pb2.HttpFilter:
    config = http_rbac_pb2.RBAC(shadow_rules_stat_prefix=rules.shadow_stat_prefix)
    if rules.rules is not None:
        config.rules.CopyFrom(rules.rules)
    if rules.shadow is not None:
        config.shadow_rules.CopyFrom(rules.shadow)
    return hcm_pb2.HttpFilter(name=HTTP_RBAC, typed_config=typed(config))


def network_rbac_filter(rules: FilterRules) -> listener_components_pb2.Filter:
    config = network_rbac_pb2.RBAC(stat_prefix=TCP_STAT_PREFIX, shadow_rules_stat_prefix=rules.shadow_stat_prefix)
    if rules.rules is not None:
        config.rules.CopyFrom(rules.rules)
    if rules.shadow is not None:
        config.shadow_rules.CopyFrom(rules.shadow)
    return network_filter(NETWORK_RBAC, config)


class InboundAuthz:
    """The authentication and RBAC filters of the chains that take a workload's traffic (a
    sidecar's inbound chains, a gateway's listeners): `jwt_authn` for its RequestAuthentication
    rules first (RBAC reads the claims it leaves), then the RBAC filters. Each kind is built on
    first use, so what only a TCP chain cannot see is logged only for a workload with a TCP port;
    what is wrong whatever the chain (a CUSTOM action, a targetRef, a dry-run annotation that is
    not a boolean) is logged when this is made. Gateways clear the route cache after
    `jwt_authn` (`clear_route_cache`), as Istio does for every proxy that is not a sidecar, so
    routes may match on claims."""

    def __init__(
        self,
        policies: Sequence[Config],
        trust_domain: str,
        ignored: Sequence[Config] = (),
        *,
        jwt_rules: Sequence[Any] = (),
        clear_route_cache: bool = False,
    ) -> None:
        self.policies = tuple(policies)
        self.trust_domain = trust_domain
        self.jwt_rules = tuple(jwt_rules)
        self.clear_route_cache = clear_route_cache
        for config in ignored:
            logger.warning(
                "%s %s/%s has a targetRef: it applies to Gateway API gateways and waypoints only, "
                "so to no workload meshctl serves; ignored, as Istio ignores it for other proxies",
                KIND,
                config.namespace,
                config.name,
            )
        for config in self.policies:
            problem = dry_run_problem(config)
            if problem is not None:
                logger.warning("%s %s/%s: %s", KIND, config.namespace, config.name, problem)
            if action(config) is Action.CUSTOM and not dry_run(config):
                logger.warning(
                    "%s %s/%s: action CUSTOM needs the external authorizer of provider %r, which meshctl "
                    "does not configure; requests and connections its rules match are denied (fail closed, "
                    "as Istio does when it cannot resolve the provider)",
                    KIND,
                    config.namespace,
                    config.name,
                    spec(config).provider.name,
                )

    @functools.cached_property
    def http(self) -> tuple[hcm_pb2.HttpFilter, ...]:
        """The HTTP filters, to go first in an HTTP connection manager: `jwt_authn`, then RBAC."""
        rules = filter_rules(self.policies, trust_domain=self.trust_domain, for_tcp=False)
        jwt = jwt_authn_filter(self.jwt_rules, clear_route_cache=self.clear_route_cache)
        return (*([jwt] if jwt is not None else []), *(http_filter(r) for r in rules))

    @functools.cached_property
    def network(self) -> tuple[listener_components_pb2.Filter, ...]:
        """The network filters, to go before an inbound chain's tcp_proxy."""
        rules = filter_rules(self.policies, trust_domain=self.trust_domain, for_tcp=True)
        return tuple(network_rbac_filter(r) for r in rules)
