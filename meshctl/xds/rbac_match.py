"""One AuthorizationPolicy rule as one Envoy RBAC policy: Istio's `security/authz/model`
(model.go, generator.go) and `security/authz/matcher`, field by field.

A rule becomes a `Policy` whose permissions are its `to` entries (an entry each, or one matching
anything) and whose principals are its `from` entries (likewise); each entry is the AND of its
fields, each field the OR of its values, its `not` values as NOT(OR(...)). `when` conditions are
ANDed into every entry of their side: destination and SNI conditions into the permissions, the
rest into the principals. The order is Istio's, so a dump reads like istiod's:

| Istio field                              | Envoy RBAC matcher                                       |
|------------------------------------------|----------------------------------------------------------|
| `to.operation.hosts`                     | header `:authority`, ignoring case; `*` is presence      |
| `to.operation.methods`                   | header `:method`                                         |
| `to.operation.paths`                     | `url_path`; with `{*}`/`{**}` a `uri_template`           |
| `to.operation.ports`                     | `destination_port`                                       |
| `from.source.principals`                 | `authenticated.principal_name`, `spiffe://` + value      |
| `from.source.requestPrincipals`          | jwt_authn payload `iss` and `sub` (`sourced_metadata`)   |
| `from.source.serviceAccounts`            | as `when` `source.serviceAccount`                        |
| `from.source.trustDomains`               | principal prefix `spiffe://TD/`; `*` as regex `[^/]*`    |
| `from.source.namespaces`                 | `authenticated.principal_name` regex `.*/ns/NS/.*`       |
| `from.source.remoteIpBlocks`             | `remote_ip`                                              |
| `from.source.ipBlocks`                   | `direct_remote_ip`                                       |
| `when` `request.headers[NAME]`           | header NAME                                              |
| `when` `source.ip` / `remote.ip`         | `direct_remote_ip` / `remote_ip`                         |
| `when` `source.namespace` / `.principal` | as `namespaces` / `principals`                           |
| `when` `source.serviceAccount`           | principal regex `spiffe://.+/ns/NS/(.+/|)sa/SA(/.+)?`    |
| `when` `request.auth.principal`          | as `requestPrincipals`                                   |
| `when` `request.auth.audiences`          | jwt_authn payload `aud` (a string, or a list holding it) |
| `when` `request.auth.presenter`          | jwt_authn payload `azp` (likewise)                       |
| `when` `request.auth.claims[a][b]`       | jwt_authn payload `a` then `b` (likewise)                |
| `when` `destination.ip` / `.port`        | `destination_ip` / `destination_port`                    |
| `when` `connection.sni`                  | `requested_server_name`                                  |
| `when` `experimental.envoy.filters.F[K]` | dynamic metadata of filter F, key K                      |

Values use Istio's string matching: `abc` exact, `abc*` prefix, `*abc` suffix, `*` any non-empty
value (a header's presence). Where Istio builds a regex from a value (`*abc` of a principal,
namespaces) it inserts the value as is; here its literal parts are escaped, so `*.example.com`
means what it says and a value with a regex character cannot make Envoy reject the listener.

When a field cannot be used, Istio's rule (`rule.checkError`) is kept: for an ALLOW rule the
whole rule is dropped (the policy allows less), for DENY and AUDIT only the value is (the rule
denies more). That covers HTTP-only fields on a TCP filter chain (hosts, methods, paths,
request principals and `request.*` conditions) and values that do not parse (an IP block, a
port). A `when` key Istio does not know drops the rule whatever the action, as in Istio.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from envoy.config.core.v3 import extension_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
from envoy.type.matcher.v3 import metadata_pb2, path_pb2, regex_pb2, string_pb2, value_pb2
from google.protobuf.message import Message

from meshctl.config.validation.authz_values import namespace_principal_regex, service_account_principal_regex
from meshctl.config.validation.regex_program import re2_escape
from meshctl.security.authorization import with_trust_domain
from meshctl.xds import jwt_metadata
from meshctl.xds.listener_filters import cidr_range, typed

Permission = rbac_pb2.Permission
Principal = rbac_pb2.Principal

SPIFFE_PREFIX: Final = "spiffe://"
URI_TEMPLATE_MATCHER: Final = "envoy.path.match.uri_template.uri_template_matcher"
#: Istio's security.MatchOneTemplate and MatchAnyTemplate in `paths`.
_MATCH_ONE: Final = "{*}"
_MATCH_ANY: Final = "{**}"
_PORT: Final = re.compile(r"[0-9]+")


class FieldError(Exception):
    """A field of a rule that cannot be used here: HTTP only on a TCP chain, or a value that
    does not parse. `field` is the field as the YAML names it."""

    def __init__(self, field: str, reason: str, *, http_only: bool = False) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.http_only = http_only


@dataclass(frozen=True, slots=True)
class Translation:
    """A rule's RBAC policy, None when the rule matches nothing here (an ALLOW rule with a field
    it cannot use, or any rule with an unknown `when` key), and what was left out or why."""

    policy: rbac_pb2.Policy | None
    problems: tuple[FieldError, ...] = ()


# -- Envoy matchers, as Istio's `authz/matcher` builds them --------------------------------------


def regex_matcher(regex: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=regex))


def string_matcher(value: str, prefix: str = "") -> string_pb2.StringMatcher:
    """Istio's StringMatcherWithPrefix: `*` any non-empty value (the prefix then does not
    count), `*abc` suffix, `abc*` prefix, else exact; `prefix` goes before the value."""
    if value == "*":
        return regex_matcher(".+")
    if value.startswith("*"):
        if not prefix:
            return string_pb2.StringMatcher(suffix=value[1:])
        return regex_matcher(re2_escape(prefix) + ".*" + re2_escape(value[1:]))
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=prefix + value[:-1])
    return string_pb2.StringMatcher(exact=prefix + value)


def header_matcher(name: str, value: str, *, ignore_case: bool = False) -> route_components_pb2.HeaderMatcher:
    """Istio's HeaderMatcher (HostMatcher with `ignore_case`): `*` is the header's presence."""
    if value == "*":
        return route_components_pb2.HeaderMatcher(name=name, present_match=True)
    if value.startswith("*"):
        match = string_pb2.StringMatcher(suffix=value[1:], ignore_case=ignore_case)
    elif value.endswith("*"):
        match = string_pb2.StringMatcher(prefix=value[:-1], ignore_case=ignore_case)
    else:
        match = string_pb2.StringMatcher(exact=value, ignore_case=ignore_case)
    return route_components_pb2.HeaderMatcher(name=name, string_match=match)


def _value_string(value: str) -> value_pb2.ValueMatcher:
    return value_pb2.ValueMatcher(string_match=string_matcher(value))


def _value_or(matchers: Sequence[value_pb2.ValueMatcher]) -> value_pb2.ValueMatcher:
    """Istio's OrMatcher: one matcher as itself, more ORed."""
    if len(matchers) == 1:
        return matchers[0]
    return value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=list(matchers)))


def _metadata(filter_name: str, path: Sequence[str], value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=filter_name,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=key) for key in path],
        value=value,
    )


def dynamic(matcher: metadata_pb2.MetadataMatcher) -> rbac_pb2.SourcedMetadata:
    """A matcher of the request's dynamic metadata: what Istio writes as `metadata`, which
    Envoy deprecates for `sourced_metadata` (its default source is the dynamic metadata)."""
    return rbac_pb2.SourcedMetadata(metadata_matcher=matcher)


def jwt_claim(claim: str, match: string_pb2.StringMatcher) -> metadata_pb2.MetadataMatcher:
    """One string claim of the verified token's payload (`iss`, `sub`)."""
    path = (jwt_metadata.PAYLOAD, claim)
    return _metadata(jwt_metadata.FILTER, path, value_pb2.ValueMatcher(string_match=match))


def jwt_claims(claims: Sequence[str], value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    """A (nested) claim matching `value` whether it is a string or a list holding such a string
    (Istio's MetadataListValueMatcher with extended JWT: `aud` is either)."""
    in_list = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=value))
    either = value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=[in_list, value]))
    return _metadata(jwt_metadata.FILTER, (jwt_metadata.PAYLOAD, *claims), either)


# -- the algebra of each side ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Side:
    """How conditions combine on one side of a policy (permissions or principals)."""

    any: Callable[[], Message]
    all_of: Callable[[list[Any]], Message]
    one_of: Callable[[list[Any]], Message]
    negate: Callable[[Any], Message]


_PERMISSION: Final = _Side(
    any=lambda: Permission(any=True),
    all_of=lambda items: Permission(and_rules=Permission.Set(rules=items)),
    one_of=lambda items: Permission(or_rules=Permission.Set(rules=items)),
    negate=lambda item: Permission(not_rule=item),
)
_PRINCIPAL: Final = _Side(
    any=lambda: Principal(any=True),
    all_of=lambda items: Principal(and_ids=Principal.Set(ids=items)),
    one_of=lambda items: Principal(or_ids=Principal.Set(ids=items)),
    negate=lambda item: Principal(not_id=item),
)

#: Istio's rbacPolicyMatchNever: the policy of a rule-less ALLOW (`spec: {}`), which so allows
#: nothing while still making the ALLOW filter (and its default deny) exist.
MATCH_NEVER: Final = rbac_pb2.Policy(
    permissions=[Permission(not_rule=Permission(any=True))],
    principals=[Principal(not_id=Principal(any=True))],
)


# -- fields ---------------------------------------------------------------------------------------

#: value -> matcher; raises FieldError for a value it cannot use.
OneValue = Callable[[str], Message]
#: values -> one matcher (Istio's extendedGenerator: the JWT fields, envoy filter metadata).
AllValues = Callable[[Sequence[str]], Message]


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    values: Sequence[str]
    not_values: Sequence[str]
    one: OneValue | None = None
    many: AllValues | None = None
    http_only: bool = False

    @property
    def empty(self) -> bool:
        return not self.values and not self.not_values


def _cidr(field: str) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        found = cidr_range(value)
        if found is None:
            raise FieldError(field, f"{value!r} is not an IP address or CIDR range")
        return found

    return parse


def _port(field: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        if not _PORT.fullmatch(value) or int(value) > 65535:
            raise FieldError(field, f"{value!r} is not a port")
        return int(value)

    return parse


def _bracketed(field: str, text: str) -> str:
    """Istio's extractNameInBrackets: `[NAME]` -> NAME."""
    if not (text.startswith("[") and text.endswith("]")):
        raise FieldError(field, f"expecting [NAME], found {text!r}")
    return text[1:-1]


def _nested_brackets(field: str, text: str) -> list[str]:
    """Istio's extractNameInNestedBrackets: `[a][b]` -> [a, b]; `[a.b]` -> [a.b]."""
    names: list[str] = []
    begin = 0
    while begin < len(text):
        end = -1
        if text[begin] == "[":
            for i in range(begin + 1, len(text)):
                if text[i] == "[":
                    break
                if text[i] == "]":
                    end = i
                    break
        if end == -1:
            return [_bracketed(field, text)]
        names.append(text[begin + 1 : end])
        begin = end + 1
    if not names:
        raise FieldError(field, "names no claim")
    return names


def _namespace_principal(value: str) -> rbac_pb2.Principal:
    regex = namespace_principal_regex(value)
    return Principal(authenticated=Principal.Authenticated(principal_name=regex_matcher(regex)))


def _principal(value: str) -> rbac_pb2.Principal:
    match = string_matcher(value, SPIFFE_PREFIX)
    return Principal(authenticated=Principal.Authenticated(principal_name=match))


def _service_account(policy_namespace: str) -> OneValue:
    def build(value: str) -> rbac_pb2.Principal:
        namespace, sep, account = value.partition("/")
        if not sep:
            namespace, account = policy_namespace, value
        regex = service_account_principal_regex(namespace, account)
        return Principal(authenticated=Principal.Authenticated(principal_name=regex_matcher(regex)))

    return build


def _request_principals(values: Sequence[str]) -> rbac_pb2.Principal:
    """Istio's requestPrincipalGenerator: `ISS/SUB` split at the last `/` (an issuer is often a
    URL), each side matched as Istio does, both on the jwt_authn payload."""
    anything = regex_matcher(".+")
    found = []
    for value in values:
        iss, sep, sub = value.rpartition("/")
        if not sep:
            iss, sub = value, ""
        if value == "*":
            match_iss, match_sub = anything, anything
        elif value.startswith("*"):
            if sep:
                match_iss = anything if iss == "*" else string_pb2.StringMatcher(suffix=iss[1:])
                match_sub = string_pb2.StringMatcher(exact=sub)
            else:
                match_iss, match_sub = anything, string_pb2.StringMatcher(suffix=value[1:])
        elif value.endswith("*"):
            if sep:
                match_iss = string_pb2.StringMatcher(exact=iss)
                match_sub = anything if sub == "*" else string_pb2.StringMatcher(prefix=sub[:-1])
            else:
                match_iss, match_sub = string_pb2.StringMatcher(prefix=value[:-1]), anything
        else:
            match_iss, match_sub = string_pb2.StringMatcher(exact=iss), string_pb2.StringMatcher(exact=sub)
        both = [
            Principal(sourced_metadata=dynamic(jwt_claim(c, m))) for c, m in (("iss", match_iss), ("sub", match_sub))
        ]
        found.append(Principal(and_ids=Principal.Set(ids=both)))
    return found[0] if len(found) == 1 else Principal(or_ids=Principal.Set(ids=found))


def _claim_values(claims: Sequence[str]) -> AllValues:
    def build(values: Sequence[str]) -> rbac_pb2.Principal:
        return Principal(sourced_metadata=dynamic(jwt_claims(claims, _value_or([_value_string(v) for v in values]))))

    return build


def _envoy_filter(field: str, key: str) -> AllValues:
    """Istio's envoyFilterGenerator: `experimental.envoy.filters.a.b[c]` reads key `c` of the
    dynamic metadata of filter `envoy.filters.a.b`; a value `[v]` matches a list holding v."""
    body = key.removeprefix("experimental.").removesuffix("]")
    filter_name, sep, metadata_key = body.partition("[")

    def build(values: Sequence[str]) -> rbac_pb2.Permission:
        if not sep:
            raise FieldError(field, f"invalid key {key!r}: expecting experimental.envoy.filters.FILTER[KEY]")
        matchers = []
        for value in values:
            if value.startswith("[") and value.endswith("]"):
                one = _value_string(value.strip("[]"))
                matchers.append(value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=one)))
            else:
                matchers.append(_value_string(value))
        return Permission(sourced_metadata=dynamic(_metadata(filter_name, (metadata_key,), _value_or(matchers))))

    return build


def _path(value: str) -> rbac_pb2.Permission:
    if _MATCH_ONE in value or _MATCH_ANY in value:
        template = value.replace(_MATCH_ONE, "*").replace(_MATCH_ANY, "**")
        config = uri_template_match_pb2.UriTemplateMatchConfig(path_template=template)
        return Permission(
            uri_template=extension_pb2.TypedExtensionConfig(name=URI_TEMPLATE_MATCHER, typed_config=typed(config))
        )
    return Permission(url_path=path_pb2.PathMatcher(path=string_matcher(value)))


# -- a rule ---------------------------------------------------------------------------------------


def _condition(condition: Any, policy_namespace: str, trust_domain: str) -> tuple[_Side, _Field] | None:
    """A `when` condition as the field of its side; None for a key Istio does not know."""
    key: str = condition.key
    name = f"when {key}"
    values, not_values = list(condition.values), list(condition.not_values)
    field = _Field(name, values, not_values)
    if key == "destination.ip":
        cidr = _cidr(name)
        return _PERMISSION, _with(field, one=lambda v: Permission(destination_ip=cidr(v)))
    if key == "destination.port":
        port = _port(name)
        return _PERMISSION, _with(field, one=lambda v: Permission(destination_port=port(v)))
    if key == "connection.sni":
        return _PERMISSION, _with(field, one=lambda v: Permission(requested_server_name=string_matcher(v)))
    if key.startswith("experimental.envoy.filters."):
        return _PERMISSION, _with(field, many=_envoy_filter(name, key))
    if key == "source.ip":
        cidr = _cidr(name)
        return _PRINCIPAL, _with(field, one=lambda v: Principal(direct_remote_ip=cidr(v)))
    if key == "remote.ip":
        cidr = _cidr(name)
        return _PRINCIPAL, _with(field, one=lambda v: Principal(remote_ip=cidr(v)))
    if key == "source.namespace":
        return _PRINCIPAL, _with(field, one=_namespace_principal)
    if key == "source.serviceAccount":
        return _PRINCIPAL, _with(field, one=_service_account(policy_namespace))
    if key == "source.principal":
        migrated = _Field(name, with_trust_domain(values, trust_domain), with_trust_domain(not_values, trust_domain))
        return _PRINCIPAL, _with(migrated, one=_principal)
    if key == "request.auth.principal":
        return _PRINCIPAL, _with(field, many=_request_principals, http_only=True)
    if key == "request.auth.audiences":
        return _PRINCIPAL, _with(field, many=_claim_values(["aud"]), http_only=True)
    if key == "request.auth.presenter":
        return _PRINCIPAL, _with(field, many=_claim_values(["azp"]), http_only=True)
    if key.startswith("request.headers"):
        header = key.removeprefix("request.headers")

        def request_header(value: str) -> rbac_pb2.Principal:
            return Principal(header=header_matcher(_bracketed(name, header), value))

        return _PRINCIPAL, _with(field, one=request_header, http_only=True)
    if key.startswith("request.auth.claims"):
        claims = key.removeprefix("request.auth.claims")

        def claim(values: Sequence[str]) -> rbac_pb2.Principal:
            return _claim_values(_nested_brackets(name, claims))(values)

        return _PRINCIPAL, _with(field, many=claim, http_only=True)
    return None


def _with(
    field: _Field, *, one: OneValue | None = None, many: AllValues | None = None, http_only: bool = False
) -> _Field:
    return _Field(field.name, field.values, field.not_values, one, many, http_only)


def _trust_domain(value: str) -> rbac_pb2.Principal:
    """A peer whose SPIFFE URI is in trust domain `value`: its principal begins `spiffe://TD/`.
    A `*` stands for any characters but `/` (istio/istio#59358), so it stays within the trust
    domain; the literal parts are escaped."""
    if "*" not in value:
        match = string_pb2.StringMatcher(prefix=f"{SPIFFE_PREFIX}{value}/")
    else:
        domain = "[^/]*".join(re2_escape(part) for part in value.split("*"))
        match = regex_matcher(f"{re2_escape(SPIFFE_PREFIX)}{domain}/.*")
    return Principal(authenticated=Principal.Authenticated(principal_name=match))


def _source_fields(source: Any, trust_domain: str, policy_namespace: str) -> list[_Field]:
    """A `from.source` in Istio's order (each inserted at the front: the last listed first)."""
    prefix = "from.source."
    principals = _Field(
        prefix + "principals",
        with_trust_domain(list(source.principals), trust_domain),
        with_trust_domain(list(source.not_principals), trust_domain),
        one=_principal,
    )
    request_principals = _Field(
        prefix + "requestPrincipals",
        list(source.request_principals),
        list(source.not_request_principals),
        many=_request_principals,
        http_only=True,
    )
    service_accounts = _Field(
        prefix + "serviceAccounts",
        list(source.service_accounts),
        list(source.not_service_accounts),
        one=_service_account(policy_namespace),
    )
    trust_domains = _Field(
        prefix + "trustDomains", list(source.trust_domains), list(source.not_trust_domains), one=_trust_domain
    )
    namespaces = _Field(
        prefix + "namespaces", list(source.namespaces), list(source.not_namespaces), one=_namespace_principal
    )
    remote = _cidr(prefix + "remoteIpBlocks")
    remote_ips = _Field(
        prefix + "remoteIpBlocks",
        list(source.remote_ip_blocks),
        list(source.not_remote_ip_blocks),
        one=lambda v: Principal(remote_ip=remote(v)),
    )
    direct = _cidr(prefix + "ipBlocks")
    ips = _Field(
        prefix + "ipBlocks",
        list(source.ip_blocks),
        list(source.not_ip_blocks),
        one=lambda v: Principal(direct_remote_ip=direct(v)),
    )
    return [principals, request_principals, service_accounts, trust_domains, namespaces, remote_ips, ips]


def _operation_fields(operation: Any) -> list[_Field]:
    """A `to.operation` in Istio's order."""
    prefix = "to.operation."
    port = _port(prefix + "ports")
    return [
        _Field(
            prefix + "hosts",
            list(operation.hosts),
            list(operation.not_hosts),
            one=lambda v: Permission(header=header_matcher(":authority", v, ignore_case=True)),
            http_only=True,
        ),
        _Field(
            prefix + "methods",
            list(operation.methods),
            list(operation.not_methods),
            one=lambda v: Permission(header=header_matcher(":method", v)),
            http_only=True,
        ),
        _Field(prefix + "paths", list(operation.paths), list(operation.not_paths), one=_path, http_only=True),
        _Field(
            prefix + "ports",
            list(operation.ports),
            list(operation.not_ports),
            one=lambda v: Permission(destination_port=port(v)),
        ),
    ]


def translate_rule(rule: Any, *, policy_namespace: str, trust_domain: str, for_tcp: bool, allow: bool) -> Translation:
    """Istio's `authzmodel.New(rule).Generate(forTCP, ...)` for an ALLOW (`allow`) or a
    DENY/AUDIT/CUSTOM rule."""
    base_permissions: list[_Field] = []
    base_principals: list[_Field] = []
    for condition in rule.when:
        found = _condition(condition, policy_namespace, trust_domain)
        if found is None:
            error = FieldError(f"when {condition.key}", "is not a condition key Istio knows; the rule is skipped")
            return Translation(None, (error,))
        side, field = found
        (base_permissions if side is _PERMISSION else base_principals).append(field)

    sources = [
        _source_fields(f.source, trust_domain, policy_namespace) + base_principals for f in getattr(rule, "from")
    ]
    operations = [_operation_fields(t.operation) + base_permissions for t in rule.to]
    problems: list[FieldError] = []
    try:
        permissions = [
            _entry(_PERMISSION, fields, for_tcp, allow, problems) for fields in operations or [base_permissions]
        ]
        principals = [_entry(_PRINCIPAL, fields, for_tcp, allow, problems) for fields in sources or [base_principals]]
    except FieldError as error:
        return Translation(None, (error,))
    return Translation(rbac_pb2.Policy(permissions=permissions, principals=principals), tuple(problems))


def _entry(side: _Side, fields: Sequence[_Field], for_tcp: bool, allow: bool, problems: list[FieldError]) -> Any:
    """One `from` or `to` entry: the AND of its fields' conditions, anything when none is left."""
    conditions: list[Any] = []
    for field in fields:
        if not field.empty:
            conditions.extend(_field_conditions(side, field, for_tcp, allow, problems))
    return side.all_of(conditions or [side.any()])


def _field_conditions(side: _Side, field: _Field, for_tcp: bool, allow: bool, problems: list[FieldError]) -> list[Any]:
    """Istio's rule.permission / rule.principal: the OR of the values, then NOT of the OR of the
    `not` values; a value (for extended fields, all of them) that cannot be used fails an ALLOW
    rule (raises) and is left out of any other."""
    out: list[Any] = []
    for values, negated in ((field.values, False), (field.not_values, True)):
        if not values:
            continue
        try:
            if for_tcp and field.http_only:
                raise FieldError(field.name, "is HTTP only", http_only=True)
            if field.many is not None:
                matcher = field.many(values)
            else:
                assert field.one is not None
                items = _each(field.one, values, allow, problems)
                if not items:
                    continue
                matcher = side.one_of(items)
        except FieldError as error:
            if allow:
                raise
            problems.append(error)
            continue
        out.append(side.negate(matcher) if negated else matcher)
    return out


def _each(one: OneValue, values: Sequence[str], allow: bool, problems: list[FieldError]) -> list[Any]:
    found = []
    for value in values:
        try:
            found.append(one(value))
        except FieldError as error:
            if allow:
                raise
            problems.append(error)
    return found
