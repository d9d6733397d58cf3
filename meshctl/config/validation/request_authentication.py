"""RequestAuthentication rules (Istio's `ValidateRequestAuthentication` and `validateJwtRule`),
each at its field.

- What it applies to: a `selector` or `targetRef(s)`, not both (`policy_target`).
- Each JWT rule: an `issuer` or a `jwksUri`; `jwksUri` an http or https URL with a host (and a
  port, if given, in 1..65535) that Envoy can parse (`config/jwks_uri.py`); `jwks` a JSON Web
  Key Set whose every key Envoy can read (`jwks.py`); no empty audience, header name
  (`fromHeaders`), query parameter or cookie name; `outputClaimToHeaders` with a claim and a
  header name of letters, digits and `-` (so no `:authority`-style pseudo-header); no empty
  `spaceDelimitedClaims` entry (the CRD's rule); `timeout` at
  least 1ms, in whole milliseconds, and below 2^32 s (Envoy's bound on a fetch timeout).

meshctl adds warnings where it behaves as Istio does but the config is unlikely to do what was
meant: a rule with both `jwks` and `jwksUri` (the URI is ignored), and a rule with neither: istiod
would find the keys through the issuer's OpenID discovery, which meshctl does not do, so every
token of that issuer is rejected. `failureMode`, which meshctl's schema knows and Istio's does
not, is refused when set, as Istio's schema would refuse it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.jwks_uri import jwks_uri_problem_detail, parse_jwks_uri
from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report, duration_problem, probe_header_name_problem
from meshctl.config.validation.envoy_limits import line_break_problem, seconds32_problem
from meshctl.config.validation.jwks import jwks_problem
from meshctl.config.validation.policy_target import check_policy_target

__all__ = ["jwks_problem", "jwks_uri_problem", "validate"]


def validate(spec: Message) -> list[Issue]:
    policy: Any = spec
    report = Report()
    check_policy_target(report, policy, "the RequestAuthentication")
    for i, rule in enumerate(policy.jwt_rules):
        _jwt_rule(report, ("spec", "jwtRules", i), rule)
    return report.issues


def _jwt_rule(report: Report, path: FieldPath, rule: Any) -> None:
    for i, audience in enumerate(rule.audiences):
        if not audience:
            report.error((*path, "audiences", i), "audience must be non-empty string")
    if not rule.issuer and not rule.jwks_uri:
        report.error(path, "issuer or jwksUri must be non-empty string")
    if rule.jwks_uri:
        report.error((*path, "jwksUri"), jwks_uri_problem(rule.jwks_uri))
    if rule.jwks:
        report.error((*path, "jwks"), jwks_problem(rule.jwks))
    if rule.jwks and rule.jwks_uri:
        report.warn((*path, "jwksUri"), "jwksUri is ignored: the rule's jwks is used (set only one of them)")
    if not rule.jwks and not rule.jwks_uri and rule.issuer:
        report.warn(
            path,
            f'no jwks or jwksUri for issuer "{rule.issuer}": istiod would find its keys through OpenID discovery, '
            "which meshctl does not do, so every token of this issuer is rejected (set jwksUri)",
        )
    for i, location in enumerate(rule.from_headers):
        if not location.name:
            report.error((*path, "fromHeaders", i, "name"), "location header name must be non-empty string")
        for field, value in (("name", location.name), ("prefix", location.prefix)):
            report.error((*path, "fromHeaders", i, field), line_break_problem(value, f"header {field}"))
    if rule.output_payload_to_header:
        report.error((*path, "outputPayloadToHeader"), line_break_problem(rule.output_payload_to_header, "header name"))
    for i, param in enumerate(rule.from_params):
        if not param:
            report.error((*path, "fromParams", i), "location query must be non-empty string")
    for i, cookie in enumerate(rule.from_cookies):
        if not cookie:
            report.error((*path, "fromCookies", i), "cookie name must be non-empty string")
    for i, claim in enumerate(rule.space_delimited_claims):
        if not claim:
            report.error((*path, "spaceDelimitedClaims", i), "a space-delimited claim must be a non-empty string")
    for i, output in enumerate(rule.output_claim_to_headers):
        _claim_to_header(report, (*path, "outputClaimToHeaders", i), output)
    if rule.HasField("timeout"):
        report.error((*path, "timeout"), duration_problem(rule.timeout))
        # Envoy's `HttpUri.timeout` is below 2^32 seconds.
        report.error((*path, "timeout"), seconds32_problem(rule.timeout.seconds, "the key set fetch timeout"))
    if rule.failure_mode:
        report.error(
            (*path, "failureMode"),
            'unknown field "failureMode" in JWTRule: Istio has no such field (a missing token passes, '
            "an invalid one is rejected; an AuthorizationPolicy with requestPrincipals requires one)",
        )


def _claim_to_header(report: Report, path: FieldPath, output: Any) -> None:
    message = "outputClaimToHeaders header and claim value must be non-empty string"
    if not output.claim:
        report.error((*path, "claim"), message)
    if not output.header:
        report.error((*path, "header"), message)
    elif probe_header_name_problem(output.header):
        report.error(
            (*path, "header"),
            f'header name "{output.header}" is not a valid header name: use letters, digits and "-" '
            "(Istio's ValidateStrictHTTPHeaderName)",
        )


def jwks_uri_problem(uri: str) -> str | None:
    """An http or https URL with a host, as Istio's `ParseJwksURI` and the CRD take it, and as
    Envoy's jwt_authn filter parses it (`jwks_uri`)."""
    if parse_jwks_uri(uri) is not None:
        return None
    return f'jwksUri "{uri}" is not a valid URL: {jwks_uri_problem_detail(uri)}'
