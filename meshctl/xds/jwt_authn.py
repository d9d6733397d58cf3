"""RequestAuthentication's JWT rules as Envoy's `jwt_authn` HTTP filter, as Istio builds it
(`pilot/pkg/security/authn/policy_applier.go`, `convertToEnvoyJwtConfig`).

One provider per rule, named `origins-N` by the rule's place among the workload's rules sorted
by issuer (`meshctl.security.request_authentication.jwt_rules_for_workload`):

- `issuer`, `audiences`, `forward` (forwardOriginalToken), `forward_payload_header`
  (outputPayloadToHeader), `claim_to_headers` (outputClaimToHeaders), `from_headers` (name and
  value prefix), `from_params`, `from_cookies`; with none of the three, Envoy reads the
  `Authorization: Bearer` header and the `access_token` parameter, as the API documents;
- the verified payload goes to the filter's dynamic metadata under one key for every provider
  (`jwt_metadata.PAYLOAD`), where the RBAC rules read the claims, with `scope` and `permission`
  split on spaces into lists (Istio's default `spaceDelimitedClaims`), so a condition on one
  scope matches a token that holds several;
- the key set: inline `jwks` as `local_jwks`; else `jwksUri` as `remote_jwks`, fetched by Envoy
  through the cluster `jwks_cluster` builds (`outbound|PORT||HOST`), with the rule's `timeout`
  (5 s by default) and Istio's five-minute cache. A rule with neither is one whose keys istiod
  would find through OpenID discovery; meshctl does no fetching, so it gets what istiod sends
  while keys are not known yet: a key set nobody holds the private key of, which fails every
  token of that rule (401) and lets requests without one through;
- `clear_route_cache` on gateways only (Istio's `JwtFilter(proxy.Type != SidecarProxy)`), so
  that routes matching on claims see the verified token's.

The requirement is Istio's: a token that is present must be valid (401 otherwise), a request
without one passes unauthenticated, so that only an AuthorizationPolicy (`requestPrincipals`)
turns a missing token into a 403. One rule: `requires_any {provider, allow_missing}`; several:
`requires_any {P0, P1, ..., requires_all {any {P0, allow_missing}, any {P1, allow_missing}, ...}}`,
where the outer alternatives let a token pass when several providers read the same location (the
inner `requires_all` then fails it for the providers of other issuers). CORS preflight requests
pass without a token (`bypass_cors_preflight`), as in Istio; `failed_status_in_metadata` is not set,
as Istio does not set it.

A rule with `presence: REQUIRED` (istio/istio#60830) drops its `allow_missing`: its provider is
required on its own, the rules are ANDed (`requires_all {P0, any {P1, allow_missing}, ...}`)
and the outer alternatives go, so a request without that token gets 401.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, duration_pb2

from meshctl.config.jwks_uri import parse_jwks_uri
from meshctl.xds import jwt_metadata
from meshctl.xds.jwks_cluster import cluster_name

#: The filter's name in the HTTP connection manager (Istio's `EnvoyJwtFilterName`).
FILTER_NAME: Final = jwt_metadata.FILTER
#: How long Envoy waits for a remote key set when the rule sets no `timeout`.
DEFAULT_TIMEOUT_SECONDS: Final = 5
#: How long Envoy keeps a fetched key set.
JWKS_CACHE_SECONDS: Final = 5 * 60
#: Claims Istio always splits on spaces into lists in the payload metadata.
SPACE_DELIMITED_CLAIMS: Final = ("permission", "scope")

#: The key set of a rule whose keys meshctl cannot know (no `jwks`, no usable `jwksUri`): one
#: P-256 public key whose private key was thrown away when it was made, so no token verifies.
UNRESOLVED_JWKS: Final = (
    '{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","use":"sig","kid":"meshctl-unresolved",'
    '"x":"BgP6eDMDm_Iwq26VS1WzsUmcFv5vFvzeU5aK6JdKyZ4","y":"osEf3vmqcjAu21PanjDqXS-79MaEP27QCsLoPe32i9Y"}]}'
)

_Requirement = config_pb2.JwtRequirement


def provider_name(index: int) -> str:
    """Istio's name for the provider of the `index`th rule: `origins-0`, `origins-1`, ..."""
    return f"origins-{index}"


def build_jwt_authn(rules: Sequence[Any], *, clear_route_cache: bool = False) -> config_pb2.JwtAuthentication | None:
    """The filter config for `rules` (JWTRule messages, in the order `jwt_rules_for_workload`
    gives them); None when there are none: a workload without RequestAuthentication gets no
    filter."""
    if not rules:
        return None
    config = config_pb2.JwtAuthentication(bypass_cors_preflight=True)
    names = [provider_name(i) for i in range(len(rules))]
    for name, rule in zip(names, rules, strict=True):
        config.providers[name].CopyFrom(build_provider(rule, clear_route_cache=clear_route_cache))
    required = [_presence(rule) == "REQUIRED" for rule in rules]
    # A REQUIRED rule's provider stands alone (no allow_missing): its token must be there.
    each = [
        _provider(name) if must else _any_of(_provider(name), _allow_missing())
        for name, must in zip(names, required, strict=True)
    ]
    if len(each) == 1:
        requires = each[0]
    else:
        every = _Requirement()
        every.requires_all.requirements.extend(each)
        # The outer alternatives (one valid token of any rule passes) would let an optional
        # token stand in for a required one, so Istio drops them when a rule is REQUIRED.
        requires = every if any(required) else _any_of(*(_provider(name) for name in names), every)
    rule = config.rules.add()
    rule.match.CopyFrom(route_components_pb2.RouteMatch(prefix="/"))
    rule.requires.CopyFrom(requires)
    return config


def jwt_authn_filter(rules: Sequence[Any], *, clear_route_cache: bool = False) -> hcm_pb2.HttpFilter | None:
    """`envoy.filters.http.jwt_authn` for `rules`, ready for an HTTP connection manager's
    filters (before the RBAC and router filters); None when there are no rules."""
    config = build_jwt_authn(rules, clear_route_cache=clear_route_cache)
    if config is None:
        return None
    packed = any_pb2.Any()
    # Deterministic: `providers` is a protobuf map, which Pack otherwise writes in an order that
    # differs between processes, and replicas must send the same bytes and versions.
    packed.Pack(config, deterministic=True)
    return hcm_pb2.HttpFilter(name=FILTER_NAME, typed_config=packed)


def build_provider(rule: Any, *, clear_route_cache: bool = False) -> config_pb2.JwtProvider:
    """One JWTRule as a provider."""
    provider = config_pb2.JwtProvider(
        issuer=rule.issuer,
        audiences=list(rule.audiences),
        forward=rule.forward_original_token,
        forward_payload_header=rule.output_payload_to_header,
        payload_in_metadata=jwt_metadata.PAYLOAD,
        from_params=list(rule.from_params),
        from_cookies=list(rule.from_cookies),
        clear_route_cache=clear_route_cache,
    )
    # Istio's buildSpaceDelimitedClaims: the rule's own claims with the two defaults, once each, sorted.
    claims = sorted({*SPACE_DELIMITED_CLAIMS, *rule.space_delimited_claims})
    provider.normalize_payload_in_metadata.space_delimited_claims.extend(claims)
    for claim in rule.output_claim_to_headers:
        provider.claim_to_headers.add(header_name=claim.header, claim_name=claim.claim)
    for location in rule.from_headers:
        provider.from_headers.add(name=location.name, value_prefix=location.prefix)
    _set_keys(provider, rule)
    return provider


def _set_keys(provider: config_pb2.JwtProvider, rule: Any) -> None:
    """Inline keys win over a URI (the API: "jwks_uri will be ignored"); a URI is fetched by Envoy."""
    jwks = parse_jwks_uri(rule.jwks_uri) if rule.jwks_uri and not rule.jwks else None
    if jwks is None:
        provider.local_jwks.inline_string = rule.jwks or UNRESOLVED_JWKS
        return
    timeout = duration_pb2.Duration(seconds=DEFAULT_TIMEOUT_SECONDS)
    if rule.HasField("timeout"):
        timeout.CopyFrom(rule.timeout)
    remote = provider.remote_jwks
    remote.http_uri.uri = jwks.uri
    remote.http_uri.cluster = cluster_name(jwks)
    remote.http_uri.timeout.CopyFrom(timeout)
    remote.cache_duration.seconds = JWKS_CACHE_SECONDS


def _presence(rule: Any) -> str:
    return str(type(rule).JWTRequirement.Name(rule.presence))


def _provider(name: str) -> config_pb2.JwtRequirement:
    return _Requirement(provider_name=name)


def _allow_missing() -> config_pb2.JwtRequirement:
    out = _Requirement()
    out.allow_missing.SetInParent()
    return out


def _any_of(*requirements: config_pb2.JwtRequirement) -> config_pb2.JwtRequirement:
    out = _Requirement()
    out.requires_any.requirements.extend(requirements)
    return out
