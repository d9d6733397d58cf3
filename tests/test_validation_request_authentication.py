"""RequestAuthentication as `istioctl validate` checks it (Istio's `ValidateRequestAuthentication`,
`validateJwtRule` and the CRD schema), seen the way a user sees it: Istio's documented examples
load without errors, and each broken rule is an error at its field and line.

The cases use the validation rules' format (`cases` in tests/conftest.py): a line marked `# <-` is
where the finding must point (unmarked: the `spec:` line).
"""

from __future__ import annotations

import base64
import json

import pytest
from conftest import cases, marked_line
from conftest import document as conftest_document
from cryptography.hazmat.primitives.asymmetric import ec

from meshctl.api.security.v1beta1.jwt_pb2 import JWTRule
from meshctl.api.security.v1beta1.request_authentication_pb2 import RequestAuthentication
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import load_text
from meshctl.config.validation import validate_spec
from meshctl.config.validation.request_authentication import jwks_problem

RA = "RequestAuthentication"


def document(spec: str, *, namespace: str = "foo") -> str:
    return conftest_document(RA, spec, namespace=namespace)


def findings(text: str) -> list[Finding]:
    """What `meshctl validate` reports about the one document of `text`."""
    return list(load_text(text, "authn.yaml").findings)


def _b64url(number: int) -> str:
    return base64.urlsafe_b64encode(number.to_bytes(32, "big")).rstrip(b"=").decode()


def _example_jwks() -> str:
    public = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    key = {"kty": "EC", "crv": "P-256", "kid": "example", "x": _b64url(public.x), "y": _b64url(public.y)}
    return json.dumps({"keys": [key]})


ERRORS = cases(
    RA,
    """
[ra-neither-issuer-nor-jwks-uri] spec.jwtRules[0]
issuer or jwksUri must be non-empty string
    jwtRules:
    - audiences: ["bookstore"]  # <-

[ra-empty-audience] spec.jwtRules[0].audiences[1]
audience must be non-empty string
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com/.well-known/jwks.json
      audiences:
      - bookstore
      - ""  # <-

[ra-jwks-uri-scheme] spec.jwtRules[0].jwksUri
URI scheme "ftp" is not supported
    jwtRules:
    - issuer: issuer-foo
      jwksUri: ftp://example.com/jwks.json  # <-

[ra-jwks-uri-without-scheme] spec.jwtRules[0].jwksUri
URI scheme "" is not supported: use an http:// or https:// URL
    jwtRules:
    - issuer: issuer-foo
      jwksUri: example.com/jwks.json  # <-

[ra-jwks-uri-crd-testdata] spec.jwtRules[0].jwksUri
is not supported: use an http:// or https:// URL
    jwtRules:
    - issuer: example
      jwksUri: "hTPp\\\\\\blah"  # <-

[ra-jwks-uri-without-host] spec.jwtRules[0].jwksUri
is not a valid URL: it needs a host
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https:///jwks.json  # <-

[ra-jwks-uri-port] spec.jwtRules[0].jwksUri
its port "99999" is not a number in 1..65535
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com:99999/jwks.json  # <-

[ra-jwks-not-json] spec.jwtRules[0].jwks
jwks parse error: not JSON
    jwtRules:
    - issuer: issuer-foo
      jwks: "{keys: ["  # <-

[ra-jwks-key-without-type] spec.jwtRules[0].jwks
jwks parse error: key 0: kty must be a string (RSA, EC, oct or OKP), found None
    jwtRules:
    - issuer: issuer-foo
      jwks: '{"keys": [{"n": "abc", "e": "AQAB"}]}'  # <-

[ra-jwks-rsa-without-exponent] spec.jwtRules[0].jwks
jwks parse error: key 1: RSA key lacks e
    jwtRules:
    - issuer: issuer-foo
      jwks: '{"keys": [{"kty": "oct", "k": "c2VjcmV0"}, {"kty": "RSA", "n": "abc"}]}'  # <-

[ra-from-header-without-name] spec.jwtRules[0].fromHeaders[0].name
location header name must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      fromHeaders:
      - prefix: baz  # <-

[ra-from-header-empty-name] spec.jwtRules[0].fromHeaders[1].name
location header name must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      fromHeaders:
      - name: x-jwt-assertion
      - name: ""  # <-
        prefix: baz

[ra-from-param-empty] spec.jwtRules[0].fromParams[0]
location query must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      fromParams: [""]  # <-

[ra-from-cookie-empty] spec.jwtRules[0].fromCookies[0]
cookie name must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      fromCookies: [""]  # <-

[ra-claim-to-header-without-claim] spec.jwtRules[0].outputClaimToHeaders[0].claim
outputClaimToHeaders header and claim value must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      outputClaimToHeaders:
      - header: h
        claim: ""  # <-

[ra-claim-to-header-without-header] spec.jwtRules[0].outputClaimToHeaders[0].header
outputClaimToHeaders header and claim value must be non-empty string
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      outputClaimToHeaders:
      - claim: x
        header: ""  # <-

[ra-claim-to-pseudo-header] spec.jwtRules[0].outputClaimToHeaders[0].header
header name ":authority" is not a valid header name: use letters, digits and "-"
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      outputClaimToHeaders:
      - claim: x
        header: ":authority"  # <-

[ra-claim-to-header-underscore] spec.jwtRules[0].outputClaimToHeaders[1].header
header name "x_jwt_group" is not a valid header name
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      outputClaimToHeaders:
      - {claim: sub, header: x-jwt-sub}
      - {claim: group, header: x_jwt_group}  # <-

[ra-timeout-too-short] spec.jwtRules[0].timeout
duration 0.000500s must be at least 1ms
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      timeout: 500us  # <-

[ra-timeout-finer-than-ms] spec.jwtRules[0].timeout
is finer than the supported 1ms precision
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      timeout: 1.0005s  # <-

[ra-timeout-not-a-duration] spec.jwtRules[0].timeout
invalid duration "apple"
    jwtRules:
    - issuer: example
      timeout: apple  # <-

[ra-failure-mode] spec.jwtRules[0].failureMode
unknown field "failureMode" in JWTRule: Istio has no such field
    jwtRules:
    - issuer: example
      jwksUri: https://example.com/.well-known/jwks.json
      failureMode: STRICT  # <-

[ra-old-jwt-field] spec.jwtRules[0].jwtHeaders
unknown field "jwtHeaders" in JWTRule
    jwtRules:
    - issuer: example
      jwtHeaders: ["x-goog-iap-jwt-assertion"]  # <-

[ra-selector-and-target-ref] spec.targetRef
only one of targetRefs or workloadSelector can be set
    selector:
      matchLabels: {a: b}
    targetRef:  # <-
      group: ""
      kind: Service
      name: foo

[ra-target-ref-namespace] spec.targetRef.namespace
cross namespace referencing is not supported
    targetRef:
      group: ""
      kind: Service
      name: foo
      namespace: bar  # <-

[ra-target-ref-kind] spec.targetRef.kind
targetRef must be to one of Service, networking.istio.io/ServiceEntry, gateway.networking.k8s.io/Gateway
    targetRef:
      group: ""
      kind: Serv_ice  # <-
      name: foo

[ra-selector-empty-key] spec.selector.matchLabels.
empty key is not allowed in a selector
    selector:
      matchLabels:
        "": httpbin  # <-
""",
)

# What Istio's Go parsers take and every Envoy refuses: a jwksUri its URL parser cannot read, and
# key sets jwt_verify_lib cannot (measured against Envoy: tests/test_e2e_envoy_refusals.py).
_RSA_EVEN = base64.urlsafe_b64encode((1 << 2047).to_bytes(256, "big")).rstrip(b"=").decode()
_SECP256K1_X = _b64url(0x79BE667EF9DCBBAC55A06295CE870B07029BFCDB2DCE28D959F2815B16F81798)
ERRORS += cases(
    RA,
    f"""
[ra-jwks-uri-pipe-in-host] spec.jwtRules[0].jwksUri
host "a|b" is not a DNS name or an IP address
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://a|b:80/"  # <-

[ra-jwks-uri-space] spec.jwtRules[0].jwksUri
printable ASCII only
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://example.com/a b"  # <-

[ra-jwks-uri-nul] spec.jwtRules[0].jwksUri
printable ASCII only
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://exa\\0mple.com/"  # <-

[ra-jwks-uri-non-ascii-host] spec.jwtRules[0].jwksUri
printable ASCII only
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://b\u00fccher.example/"  # <-

[ra-jwks-uri-two-at] spec.jwtRules[0].jwksUri
more than one "@"
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://u@v@example.com/"  # <-

[ra-jwks-uri-empty-port] spec.jwtRules[0].jwksUri
is not a valid URL
    jwtRules:
    - issuer: issuer-foo
      jwksUri: "http://example.com:/keys"  # <-

[ra-jwks-rsa-even-modulus] spec.jwtRules[0].jwks
RSA modulus n (2048 bits, even) is not a valid key
    jwtRules:
    - issuer: issuer-foo
      jwks: '{{"keys": [{{"kty": "RSA", "n": "{_RSA_EVEN}", "e": "AQAB"}}]}}'  # <-

[ra-jwks-rsa-exponent] spec.jwtRules[0].jwks
RSA exponent e=5 is not 3 or 65537
    jwtRules:
    - issuer: issuer-foo
      jwks: '{{"keys": [{{"kty": "RSA", "n": "{_RSA_EVEN}", "e": "BQ"}}]}}'  # <-

[ra-jwks-unsupported-curve] spec.jwtRules[0].jwks
curve "secp256k1" is not supported
    jwtRules:
    - issuer: issuer-foo
      jwks: '{{"keys": [{{"kty": "EC", "crv": "secp256k1", "x": "{_SECP256K1_X}", "y": "{_SECP256K1_X}"}}]}}'  # <-

[ra-jwks-point-off-curve] spec.jwtRules[0].jwks
x and y are not a point on P-256
    jwtRules:
    - issuer: issuer-foo
      jwks: '{{"keys": [{{"kty": "EC", "crv": "P-256", "x": "{_SECP256K1_X}", "y": "{_SECP256K1_X}"}}]}}'  # <-

[ra-jwks-empty-set] spec.jwtRules[0].jwks
the key set has no keys
    jwtRules:
    - issuer: issuer-foo
      jwks: '{{"keys": []}}'  # <-

[ra-from-header-prefix-line-break] spec.jwtRules[0].fromHeaders[0].prefix
contains a NUL, carriage return or line feed
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com/keys
      fromHeaders:
      - name: x-jwt
        prefix: "Bearer\\n"  # <-

[ra-timeout-beyond-envoy] spec.jwtRules[0].timeout
longer than Envoy can hold here
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com/keys
      timeout: 4294967296s  # <-
""",
)


@pytest.mark.parametrize(("kind", "spec", "field", "message"), ERRORS)
def test_broken_rule_is_an_error_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text = document(spec)
    found = [f for f in findings(text) if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings(text)))
    assert found[0].severity is Severity.ERROR
    assert found[0].line == marked_line(text), str(found[0])


WARNINGS = cases(
    RA,
    """
[ra-selector-without-labels] spec.selector.matchLabels
workload selector has no labels: the RequestAuthentication applies to every workload in the namespace
    selector: {}  # <-
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com/.well-known/jwks.json

[ra-jwks-and-jwks-uri] spec.jwtRules[0].jwksUri
jwksUri is ignored: the rule's jwks is used
    jwtRules:
    - issuer: issuer-foo
      jwks: '{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}'
      jwksUri: https://example.com/.well-known/jwks.json  # <-

[ra-no-keys] spec.jwtRules[0]
no jwks or jwksUri for issuer "issuer-foo": istiod would find its keys through OpenID discovery
    jwtRules:
    - issuer: issuer-foo  # <-

[ra-target-ref-applies-nowhere] spec.targetRef
the RequestAuthentication names a targetRef
    targetRef:  # <-
      kind: Gateway
      group: gateway.networking.k8s.io
      name: waypoint
    jwtRules:
    - issuer: issuer-foo
      jwksUri: https://example.com/.well-known/jwks.json
""",
)


@pytest.mark.parametrize(("kind", "spec", "field", "message"), WARNINGS)
def test_questionable_config_is_a_warning_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text = document(spec)
    found = [f for f in findings(text) if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings(text)))
    assert found[0].severity is Severity.WARNING
    assert found[0].line == marked_line(text), str(found[0])
    assert not [f for f in findings(text) if f.severity is Severity.ERROR], "a warning alone must not reject the file"


@pytest.mark.parametrize(
    ("jwks", "reason"),
    [
        ('{"keys": []}', "the key set has no keys"),
        ('{"kty": "RSA", "n": "abc", "e": "AQAB"}', 'no "keys" list'),
        ('{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "abc"}]}', "not a 32-byte Ed25519 public key"),
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}], "keys": []}', '"keys" is written twice'),
    ],
)
def test_key_sets_envoy_cannot_read_are_refused(jwks: str, reason: str) -> None:
    """jwx's `jwk.Parse` (Istio's check) takes these, and every Envoy refuses them: an empty set,
    one bare key, a key of the wrong size, a member written twice."""
    problem = jwks_problem(jwks)
    assert problem is not None and reason in problem, problem


# Istio's documented examples (istio/api security/v1beta1/request_authentication.proto, istio.io
# tasks), whole, and Istio's CRD test data (reqauth-valid.yaml, but for `spaceDelimitedClaims`,
# which meshctl's schema does not have yet); each with the warnings it gets from meshctl.
ISTIO_EXAMPLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "httpbin-jwks-uri": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  jwtRules:
  - issuer: "issuer-foo"
    jwksUri: https://example.com/.well-known/jwks.json
""",
        (),
    ),
    "two-issuers-by-openid-discovery": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  jwtRules:
  - issuer: "issuer-foo"
  - issuer: "issuer-bar"
""",
        ('no jwks or jwksUri for issuer "issuer-foo"', 'no jwks or jwksUri for issuer "issuer-bar"'),
    ),
    "ingress-gateway": (
        """
metadata: {name: jwt-on-ingress, namespace: istio-system}
spec:
  selector:
    matchLabels:
      app: istio-ingressgateway
  jwtRules:
  - issuer: "example.com"
    jwksUri: https://example.com/.well-known/jwks.json
""",
        (),
    ),
    "jwt-task": (
        """
metadata: {name: "jwt-example", namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  jwtRules:
  - issuer: "testing@secure.istio.io"
    jwksUri: "https://raw.githubusercontent.com/istio/istio/master/security/tools/jwt/samples/jwks.json"
""",
        (),
    ),
    "claim-to-header-task": (
        """
metadata: {name: "jwt-example", namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  jwtRules:
  - issuer: "testing@secure.istio.io"
    jwksUri: "https://raw.githubusercontent.com/istio/istio/master/security/tools/jwt/samples/jwks.json"
    outputClaimToHeaders:
    - header: "x-jwt-claim-foo"
      claim: "foo"
""",
        (),
    ),
    "from-headers": (
        """
metadata: {name: httpbin, namespace: foo}
spec:
  selector:
    matchLabels:
      app: httpbin
  jwtRules:
  - issuer: "issuer-foo"
    jwksUri: https://example.com/.well-known/jwks.json
    fromHeaders:
    - name: x-jwt-assertion
      prefix: "Bearer "
    fromParams:
    - "my_token"
    outputPayloadToHeader: x-jwt-payload
    forwardOriginalToken: true
""",
        (),
    ),
    "namespace-wide-audiences": (
        """
metadata: {name: default, namespace: foo}
spec:
  jwtRules:
  - issuer: "https://accounts.google.com"
    jwksUri: https://www.googleapis.com/oauth2/v3/certs
    audiences:
    - bookstore_android.apps.googleusercontent.com
    - bookstore_web.apps.googleusercontent.com
    timeout: 10s
""",
        (),
    ),
    "crd-testdata-full": (
        """
metadata: {name: full, namespace: foo}
spec:
  targetRefs:
  - group: ""
    kind: Service
    name: foo
  jwtRules:
  - issuer: "example.com"
    jwksUri: https://example.com/.well-known/jwks.json
    forwardOriginalToken: true
    fromCookies: [foo]
    fromHeaders:
      - name: foo
        prefix: baz
    outputClaimToHeaders:
    - claim: abc
      header: def
    timeout: 5s
    outputPayloadToHeader: header
""",
        ("names a targetRef",),
    ),
}


@pytest.mark.parametrize("api_version", ["security.istio.io/v1beta1", "security.istio.io/v1"])
@pytest.mark.parametrize("example", list(ISTIO_EXAMPLES))
def test_istio_examples_load_without_errors(api_version: str, example: str) -> None:
    body, expected_warnings = ISTIO_EXAMPLES[example]
    text = f"apiVersion: {api_version}\nkind: {RA}\n{body.lstrip()}"
    found = findings(text)
    assert not [f for f in found if f.severity is Severity.ERROR], "\n".join(map(str, found))
    warnings = [f.message for f in found]
    assert len(warnings) == len(expected_warnings), "\n".join(map(str, found))
    for fragment in expected_warnings:
        assert any(fragment in w for w in warnings), (fragment, warnings)


def test_an_inline_key_set_loads_without_findings() -> None:
    text = document(f"""
    selector:
      matchLabels: {{app: httpbin}}
    jwtRules:
    - issuer: "testing@secure.istio.io"
      jwks: '{_example_jwks()}'
    """)
    assert findings(text) == []


def test_the_validator_is_dispatched_by_kind() -> None:
    """`validate_spec` checks RequestAuthentication whether or not the kind is served yet."""
    spec = RequestAuthentication(jwt_rules=[JWTRule(audiences=["a"])])
    (issue,) = validate_spec(RA, spec)
    assert issue.path == ("spec", "jwtRules", 0) and issue.message == "issuer or jwksUri must be non-empty string"
