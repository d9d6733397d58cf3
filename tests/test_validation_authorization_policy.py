"""AuthorizationPolicy as `istioctl validate` checks it (Istio's `ValidateAuthorizationPolicy`,
`pkg/config/security` and the CRD schema), seen the way a user sees it: Istio's documented
examples load without errors, and each broken rule is an error at its field and line.

The cases use the validation rules' format (`cases` in tests/conftest.py): a line marked `# <-` is
where the finding must point (unmarked: the `spec:` line).
"""

from __future__ import annotations

import pytest
from conftest import cases, marked_line
from conftest import document as conftest_document

from meshctl.api.security.v1beta1.authorization_policy_pb2 import AuthorizationPolicy
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import load_text
from meshctl.config.validation import validate_spec

AP = "AuthorizationPolicy"


def document(spec: str, *, namespace: str = "foo") -> str:
    return conftest_document(AP, spec, namespace=namespace)


def findings(text: str) -> list[Finding]:
    """What `meshctl validate` reports about the one document of `text`."""
    return list(load_text(text, "authz.yaml").findings)


def errors(text: str) -> list[Finding]:
    return [f for f in findings(text) if f.severity is Severity.ERROR]


ERRORS = cases(
    AP,
    """
[ap-custom-without-provider] spec.action
`provider.name` must not be empty
    action: CUSTOM  # <-
    rules:
    - to:
      - operation: {paths: ["/admin/*"]}

[ap-custom-provider-without-name] spec.provider.name
`provider.name` must not be empty
    action: CUSTOM
    provider: {}  # <-
    rules:
    - to:
      - operation: {paths: ["/admin/*"]}

[ap-custom-without-rules] spec.action
CUSTOM action without `rules` is meaningless as it will never be triggered
    action: CUSTOM  # <-
    provider: {name: my-ext-authz}

[ap-provider-with-allow] spec.provider
`provider` must not be with non CUSTOM action, found ALLOW
    provider:  # <-
      name: my-ext-authz
    rules:
    - {}

[ap-provider-with-deny] spec.provider
`provider` must not be with non CUSTOM action, found DENY
    action: DENY
    provider: {name: my-ext-authz}  # <-
    rules:
    - {}

[ap-deny-without-rules] spec.action
DENY action without `rules` is meaningless as it will never be triggered, add an empty rule `{}`
    action: DENY  # <-

[ap-custom-namespaces] spec.rules[0].from[0].source.namespaces
From.Namespaces is currently not supported with CUSTOM action
    action: CUSTOM
    provider: {name: my-ext-authz}
    rules:
    - from:
      - source:
          namespaces: ["dev"]  # <-

[ap-custom-request-principals] spec.rules[0].from[0].source.notRequestPrincipals
From.NotRequestPrincipals is currently not supported with CUSTOM action
    action: CUSTOM
    provider: {name: my-ext-authz}
    rules:
    - from:
      - source:
          notRequestPrincipals: ["*"]  # <-

[ap-custom-when-claims] spec.rules[0].when[0].key
request.auth.claims[iss] is currently not supported with CUSTOM action
    action: CUSTOM
    provider: {name: my-ext-authz}
    rules:
    - when:
      - key: request.auth.claims[iss]  # <-
        values: ["https://accounts.example.com"]

[ap-custom-when-source-principal] spec.rules[0].when[0].key
source.principal is currently not supported with CUSTOM action
    action: CUSTOM
    provider: {name: my-ext-authz}
    rules:
    - when:
      - key: source.principal  # <-
        values: ["cluster.local/ns/foo/sa/bar"]

[ap-from-without-source] spec.rules[0].from[0]
`from.source` must not be nil
    rules:
    - from:
      - {}  # <-

[ap-empty-source] spec.rules[0].from[0].source
`from.source` must not be empty
    rules:
    - from:
      - source: {}  # <-

[ap-to-without-operation] spec.rules[0].to[0]
`to.operation` must not be nil
    rules:
    - to:
      - {}  # <-

[ap-empty-operation] spec.rules[0].to[0].operation
`to.operation` must not be empty
    rules:
    - to:
      - operation: {}  # <-

[ap-bad-cidr] spec.rules[0].from[0].source.ipBlocks[1]
bad CIDR range (10.0.0.0/33)
    rules:
    - from:
      - source:
          ipBlocks:
          - 1.2.3.4
          - 10.0.0.0/33  # <-

[ap-bad-ip] spec.rules[0].from[0].source.notRemoteIpBlocks[0]
bad IP address (1.2.3)
    rules:
    - from:
      - source:
          notRemoteIpBlocks: ["1.2.3"]  # <-

[ap-empty-principal] spec.rules[0].from[0].source.principals[0]
empty value not allowed, found in Principals
    rules:
    - from:
      - source:
          principals: [""]  # <-

[ap-empty-method] spec.rules[0].to[0].operation.notMethods[1]
empty value not allowed, found in NotMethods
    rules:
    - to:
      - operation:
          notMethods:
          - GET
          - ""  # <-

[ap-port-name] spec.rules[0].to[0].operation.ports[1]
bad port (http)
    rules:
    - to:
      - operation:
          ports:
          - "8080"
          - http  # <-

[ap-port-too-high] spec.rules[0].to[0].operation.notPorts[0]
bad port (65536)
    rules:
    - to:
      - operation:
          notPorts: ["65536"]  # <-

[ap-port-negative] spec.rules[0].to[0].operation.ports[0]
bad port (-80)
    rules:
    - to:
      - operation:
          ports: ["-80"]  # <-

[ap-path-any-not-last] spec.rules[0].to[0].operation.paths[0]
{**} is not the last operator
    rules:
    - to:
      - operation:
          paths: ["/{**}/reviews/{*}"]  # <-

[ap-path-brace] spec.rules[0].to[0].operation.notPaths[0]
'{' or '}' beyond a supported path template
    rules:
    - to:
      - operation:
          notPaths: ["/reviews/{id}"]  # <-

[ap-path-template-literal] spec.rules[0].to[0].operation.paths[0]
segment "a b" is not a valid literal beside a template
    rules:
    - to:
      - operation:
          paths: ["/{*}/a b"]  # <-

[ap-when-empty-key] spec.rules[0].when[0].key
`key` must not be empty
    rules:
    - when:
      - key: ""  # <-
        values: ["x"]

[ap-when-without-values] spec.rules[0].when[0]
at least one of `values` or `notValues` must be set for key source.ip
    rules:
    - when:
      - key: source.ip  # <-

[ap-when-unknown-key] spec.rules[0].when[0].key
unknown attribute: request.method
    rules:
    - when:
      - key: request.method  # <-
        values: ["GET"]

[ap-when-header-without-name] spec.rules[0].when[0].key
bad key (request.headers[]): should have format a[b]
    rules:
    - when:
      - key: request.headers[]  # <-
        values: ["x"]

[ap-when-claims-without-name] spec.rules[0].when[0].key
bad key (request.auth.claims): should have format a[b]
    rules:
    - when:
      - key: request.auth.claims  # <-
        values: ["group1"]

[ap-when-destination-labels] spec.rules[0].when[0].key
attribute destination.labels[app] is replaced by the workload selector
    rules:
    - when:
      - key: destination.labels[app]  # <-
        values: ["reviews"]

[ap-when-destination-namespace] spec.rules[0].when[0].key
attribute destination.namespace is replaced by the metadata.namespace
    rules:
    - when:
      - key: destination.namespace  # <-
        values: ["foo"]

[ap-when-destination-user] spec.rules[0].when[0].key
deprecated attribute destination.user: only supported in v1alpha1
    rules:
    - when:
      - key: destination.user  # <-
        values: ["bookinfo-reviews"]

[ap-when-source-ip] spec.rules[0].when[0].values[1]
bad IP address (10.0.0.300)
    rules:
    - when:
      - key: source.ip
        values:
        - 10.0.0.1
        - 10.0.0.300  # <-

[ap-when-remote-cidr] spec.rules[0].when[0].notValues[0]
bad CIDR range (10.0.0.0/8/8)
    rules:
    - when:
      - key: remote.ip
        notValues: ["10.0.0.0/8/8"]  # <-

[ap-when-destination-port] spec.rules[0].when[0].notValues[0]
bad port (8o80)
    rules:
    - when:
      - key: destination.port
        notValues: ["8o80"]  # <-

[ap-when-service-account-wildcard] spec.rules[0].when[0].values[0]
wildcard not allowed, found in source.serviceAccount
    rules:
    - when:
      - key: source.serviceAccount
        values: ["foo/*"]  # <-

[ap-when-service-account-segments] spec.rules[0].when[0].values[0]
expected format 'serviceAccount' or 'namespace/serviceAccount'
    rules:
    - when:
      - key: source.serviceAccount
        values: ["a/b/c"]  # <-

[ap-when-service-accounts-too-many] spec.rules[0].when[0].values
may not have more than 16 values
    rules:
    - when:
      - key: source.serviceAccount
        values: [a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17]  # <-

[ap-when-empty-value] spec.rules[0].when[0].values[0]
empty value not allowed, found in request.headers[x-user]
    rules:
    - when:
      - key: request.headers[x-user]
        values: [""]  # <-

[ap-selector-and-target-ref] spec.targetRef
only one of targetRefs or workloadSelector can be set
    selector:
      matchLabels: {app: httpbin}
    targetRef:  # <-
      kind: Gateway
      group: gateway.networking.k8s.io
      name: waypoint

[ap-target-ref-namespace] spec.targetRef.namespace
targetRef namespace must not be set; cross namespace referencing is not supported
    targetRef:
      kind: Gateway
      group: gateway.networking.k8s.io
      name: waypoint
      namespace: other  # <-

[ap-target-ref-kind] spec.targetRefs[0].kind
targetRef must be to one of Service, networking.istio.io/ServiceEntry
    targetRefs:
    - kind: Deployment  # <-
      group: apps
      name: httpbin

[ap-target-ref-name] spec.targetRefs[0].name
targetRef name must be set
    targetRefs:
    - kind: Service  # <-

[ap-selector-wildcard] spec.selector.matchLabels.app
wildcards are not supported in selectors
    selector:
      matchLabels:
        app: "http*"  # <-

[ap-action-unknown] spec.action
invalid value "REJECT": must be one of ALLOW, DENY, AUDIT, CUSTOM
    action: REJECT  # <-

[ap-unknown-field] spec.rules[0].from[0].source.principal
unknown field "principal" in Source
    rules:
    - from:
      - source:
          principal: ["cluster.local/ns/foo/sa/bar"]  # <-
""",
)

# A value Envoy matches by a regex must compile under Envoy's RE2 program size limit (32768 in
# meshctl's bootstrap, as Istio's): past it every workload the policy selects refuses its
# listener.
_HUGE = "n" * 33000
ERRORS += cases(
    AP,
    f"""
[ap-namespace-too-long-to-match] spec.rules[0].from[0].source.namespaces[0]
the value is too long to match: its regex compiles to an RE2 program of size
    rules:
    - from:
      - source:
          namespaces: [{_HUGE}]  # <-

[ap-principal-too-long-to-match] spec.rules[0].from[0].source.notPrincipals[0]
the value is too long to match
    rules:
    - from:
      - source:
          notPrincipals: ["*{_HUGE}"]  # <-

[ap-when-namespace-too-long-to-match] spec.rules[0].when[0].values[0]
the value is too long to match
    rules:
    - when:
      - key: source.namespace
        values: [{_HUGE}]  # <-
""",
)


def test_long_values_matched_exactly_are_not_limited() -> None:
    """Exact matchers have no size limit in Envoy: only regexes do."""
    spec = f"""    rules:
    - from:
      - source:
          principals: [{_HUGE}]
      to:
      - operation:
          paths: ["/{_HUGE}"]
"""
    assert not [f for f in findings(document(spec)) if f.severity is Severity.ERROR]


@pytest.mark.parametrize(("kind", "spec", "field", "message"), ERRORS)
def test_broken_rule_is_an_error_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text = document(spec)
    found = [f for f in findings(text) if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings(text)))
    assert found[0].severity is Severity.ERROR
    assert found[0].line == marked_line(text), str(found[0])


WARNINGS = cases(
    AP,
    """
[ap-selector-without-labels] spec.selector.matchLabels
workload selector has no labels: the AuthorizationPolicy applies to every workload in the namespace
    selector: {}  # <-

[ap-deny-http-only-to] spec.rules[0]
configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the use of only HTTP
    action: DENY
    rules:
    - to:  # <-
      - operation: {methods: ["POST"]}

[ap-deny-http-only-from] spec.rules[0]
due to the use of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port
    action: DENY
    rules:
    - from:  # <-
      - source: {requestPrincipals: ["*"]}

[ap-wildcard-inside] spec.rules[0].from[0].source.principals[0]
"cluster.local/ns/*/sa/bar": "*" is a wildcard only as the whole value, its first or its last character
    rules:
    - from:
      - source:
          principals: ["cluster.local/ns/*/sa/bar"]  # <-

[ap-wildcard-inside-when] spec.rules[0].when[0].values[0]
"a*b": "*" is a wildcard only as the whole value
    rules:
    - when:
      - key: request.headers[x-env]
        values: ["a*b"]  # <-

[ap-target-ref-applies-nowhere] spec.targetRefs[0]
the AuthorizationPolicy names a targetRef: it attaches only to Kubernetes Gateway API gateways and waypoints
    targetRefs:
    - kind: Gateway  # <-
      group: gateway.networking.k8s.io
      name: waypoint
    rules:
    - {}
""",
)


@pytest.mark.parametrize(("kind", "spec", "field", "message"), WARNINGS)
def test_questionable_config_is_a_warning_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text = document(spec)
    found = [f for f in findings(text) if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings(text)))
    assert found[0].severity is Severity.WARNING
    assert found[0].line == marked_line(text), str(found[0])
    assert not errors(text), "a warning alone must not reject the file"


def test_a_deny_rule_with_a_port_or_an_l4_source_is_not_warned_about() -> None:
    """Istio's tcpRulesInFrom/tcpRulesInTo: ports, principals, namespaces and IP blocks can be
    checked on a TCP connection too, so such a DENY rule does not deny every TCP connection."""
    for rule in (
        "- to: [{operation: {ports: ['8080'], methods: [POST]}}]",
        "- from: [{source: {namespaces: [dev]}}]",
        "- from: [{source: {ipBlocks: [10.0.0.0/8]}}]",
        "- from: [{source: {notPrincipals: ['*']}}]\n  when: [{key: 'request.headers[x]', values: [y]}]",
    ):
        assert findings(document(f"action: DENY\nrules:\n{rule}")) == [], rule


def test_wildcards_istio_matches_are_not_warned_about() -> None:
    text = document("""
    rules:
    - from:
      - source:
          principals: ["*", "cluster.local/ns/foo/*", "*/sa/bar"]
          namespaces: ["prod-*"]
      to:
      - operation:
          hosts: ["*.example.com", "api.*"]
          paths: ["/api/*", "*/info", "/v1/{*}/reviews/{**}"]
      when:
      - key: request.headers[user-agent]
        values: ["*", "curl*", "*bot"]
    """)
    assert findings(text) == []


# Istio's documented examples (istio/api security/v1beta1/authorization_policy.proto, istio.io
# tasks), whole, and Istio's CRD test data (pkg/config/validation/testdata/crds/authz-valid.yaml);
# each with the warnings it gets (Istio's own, and meshctl's for a policy that applies nowhere).
ISTIO_EXAMPLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "allow-nothing": (
        """
metadata: {name: allow-nothing, namespace: foo}
spec: {}
""",
        (),
    ),
    "allow-nothing-action": (
        """
metadata: {name: allow-nothing, namespace: foo}
spec:
  action: ALLOW
""",
        (),
    ),
    "deny-all": (
        """
metadata: {name: deny-all, namespace: foo}
spec:
  action: DENY
  # the rules field has an empty rule, the policy will always match.
  rules:
  - {}
""",
        (),
    ),
    "allow-all": (
        """
metadata: {name: allow-all, namespace: foo}
spec:
  action: ALLOW
  rules:
  - {}
""",
        (),
    ),
    "httpbin": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/default/sa/sleep"]
    - source:
        namespaces: ["test"]
    to:
    - operation:
        methods: ["GET"]
        paths: ["/info*"]
    - operation:
        methods: ["POST"]
        paths: ["/data"]
    when:
    - key: request.auth.claims[iss]
      values: ["https://accounts.google.com"]
""",
        (),
    ),
    "allow-get-from-namespace": (
        """
metadata: {name: allow-dev-get, namespace: foo}
spec:
  action: ALLOW
  rules:
  - from:
    - source:
        namespaces: ["dev"]
    to:
    - operation:
        methods: ["GET"]
""",
        (),
    ),
    "deny-post-from-dev": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  action: DENY
  rules:
  - from:
    - source:
        namespaces: ["dev"]
    to:
    - operation:
        methods: ["POST"]
""",
        ("will deny all traffic to TCP ports under its scope",),
    ),
    "require-jwt": (
        """
metadata: {name: require-jwt, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  action: ALLOW
  rules:
  - from:
    - source:
       requestPrincipals: ["testing@secure.istio.io/testing@secure.istio.io"]
""",
        (),
    ),
    "require-jwt-any": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  rules:
  - from:
    - source:
        requestPrincipals: ["*"]
  - to:
    - operation:
        paths: ["/healthz"]
""",
        (),
    ),
    "jwt-groups-claim": (
        """
metadata: {name: require-jwt, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  action: ALLOW
  rules:
  - from:
    - source:
       requestPrincipals: ["testing@secure.istio.io/testing@secure.istio.io"]
    when:
    - key: request.auth.claims[groups]
      values: ["group1"]
""",
        (),
    ),
    "ingress-ip-allowlist": (
        """
metadata: {name: ingress-policy, namespace: istio-system}
spec:
  selector:
    matchLabels:
      app: istio-ingressgateway
  action: ALLOW
  rules:
  - from:
    - source:
        ipBlocks: ["1.2.3.4", "5.6.7.0/24"]
""",
        (),
    ),
    "ingress-remote-ip-denylist": (
        """
metadata: {name: ingress-policy, namespace: istio-system}
spec:
  selector:
    matchLabels:
      app: istio-ingressgateway
  action: DENY
  rules:
  - from:
    - source:
        remoteIpBlocks: ["1.2.3.4", "5.6.7.0/24", "2001:db8::/32"]
""",
        (),
    ),
    "tcp-port": (
        """
metadata: {name: tcp-policy, namespace: foo}
spec:
  selector:
    matchLabels:
      app: tcp-echo
  action: ALLOW
  rules:
  - to:
    - operation:
        ports: ["9000", "9001"]
""",
        (),
    ),
    "ext-authz": (
        """
metadata: {name: ext-authz, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  action: CUSTOM
  provider:
    name: sample-ext-authz-grpc
  rules:
  - to:
    - operation:
        paths: ["/headers"]
""",
        (),
    ),
    "waypoint-target-ref": (
        """
metadata: {name: deny-get, namespace: foo}
spec:
  targetRefs:
  - kind: Gateway
    group: gateway.networking.k8s.io
    name: waypoint
  action: DENY
  rules:
  - to:
    - operation:
        methods: ["GET"]
""",
        ("names a targetRef", "will deny all traffic to TCP ports under its scope"),
    ),
    "crd-testdata-full": (
        """
metadata:
  name: full
spec:
  selector:
    matchLabels:
      app: httpbin
  rules:
    - from:
        - source:
            principals: ["principal", "principal-prefix-*", "*-suffix-principal", "*"]
            requestPrincipals: ["requestPrincipals", "requestPrincipals-prefix-*", "*-suffix-requestPrincipals", "*"]
            namespaces: ["ns", "ns-prefix-*", "*-ns-suffix", "*"]
            ipBlocks: ["1.2.3.4", "5.6.0.0/16"]
            remoteIpBlocks: ["1.2.3.4", "5.6.0.0/16"]
            notPrincipals: ["not-principal", "not-principal-prefix-*", "*-not-suffix-principal", "*"]
            notRequestPrincipals: ["not-requestPrincipals", "not-requestPrincipals-prefix-*", "*"]
            notNamespaces: ["not-ns", "not-ns-prefix-*", "*-not-ns-suffix", "*"]
            notIpBlocks: ["9.0.0.1", "9.2.0.0/16"]
            notRemoteIpBlocks: ["9.0.0.1", "9.2.0.0/16"]
      to:
        - operation:
            methods: ["method", "method-prefix-*", "*-suffix-method", "*"]
            hosts: ["exact.com", "*.suffix.com", "prefix.*", "*"]
            ports: ["80", "90"]
            paths: ["/exact", "/prefix/*", "*/suffix", "*", "/path/template/{*}", "/{**}/path/template"]
            notMethods: ["not-method", "not-method-prefix-*", "*-not-suffix-method", "*"]
            notHosts: ["not-exact.com", "*.not-suffix.com", "not-prefix.*", "*"]
            notPorts: ["8000", "9000"]
            notPaths: ["/not-exact", "/not-prefix/*", "*/not-suffix", "*", "/not-path/template/{*}"]
      when:
        - key: "request.headers[X-header]"
          values: ["header", "header-prefix-*", "*-suffix-header", "*"]
          notValues: ["not-header", "not-header-prefix-*", "*-not-suffix-header", "*"]
        - key: "source.ip"
          values: ["10.10.10.10", "192.168.10.0/24"]
          notValues: ["90.10.10.10", "90.168.10.0/24"]
        - key: "remote.ip"
          values: ["10.10.10.10", "192.168.10.0/24"]
          notValues: ["90.10.10.10", "90.168.10.0/24"]
        - key: "source.namespace"
          values: ["ns", "ns-prefix-*", "*-ns-suffix", "*"]
        - key: "source.principal"
          values: ["principal", "principal-prefix-*", "*-suffix-principal", "*"]
        - key: "request.auth.principal"
          values: ["requestPrincipals", "requestPrincipals-prefix-*", "*", "https://example.com/*"]
        - key: "request.auth.audiences"
          values: ["audiences", "audiences-prefix-*", "*-suffix-audiences", "*"]
        - key: "request.auth.presenter"
          values: ["presenter", "presenter-prefix-*", "*-suffix-presenter", "*"]
        - key: "request.auth.claims[iss]"
          values: ["iss", "iss-prefix-*", "*-suffix-iss", "*"]
        - key: "request.auth.claims[nested1][nested2]"
          values: ["nested", "nested-prefix-*", "*-suffix-nested", "*"]
        - key: "destination.ip"
          values: ["10.10.10.10", "192.168.10.0/24"]
        - key: "destination.port"
          values: ["91", "92"]
          notValues: ["9001", "9002"]
        - key: "connection.sni"
          values: ["exact.com", "*.suffix.com", "prefix.*", "*"]
        - key: "experimental.envoy.filters.a.b[c]"
          values: ["exact", "prefix-*", "*-suffix", "*"]
        - key: "source.serviceAccount"
          values: ["baz/sa", "sa"]
""",
        (),
    ),
}


@pytest.mark.parametrize("api_version", ["security.istio.io/v1beta1", "security.istio.io/v1"])
@pytest.mark.parametrize("example", list(ISTIO_EXAMPLES))
def test_istio_examples_load_without_errors(api_version: str, example: str) -> None:
    body, expected_warnings = ISTIO_EXAMPLES[example]
    text = f"apiVersion: {api_version}\nkind: {AP}\n{body.lstrip()}"
    found = findings(text)
    assert not [f for f in found if f.severity is Severity.ERROR], "\n".join(map(str, found))
    warnings = [f.message for f in found]
    assert len(warnings) == len(expected_warnings), "\n".join(map(str, found))
    for fragment in expected_warnings:
        assert any(fragment in w for w in warnings), (fragment, warnings)


def test_the_validator_is_dispatched_by_kind() -> None:
    """`validate_spec` checks AuthorizationPolicy whether or not the kind is served yet."""
    spec = AuthorizationPolicy(action=AuthorizationPolicy.DENY)
    (issue,) = validate_spec(AP, spec)
    assert issue.path == ("spec", "action") and "DENY action without `rules`" in issue.message
