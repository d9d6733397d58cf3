"""Rules that follow a newer Istio, each case named after the Istio function (or API change) it
follows, so that a later Istio change points at the case to revisit.

Sources: Istio's `pkg/config/validation` (validation.go: ValidateSidecar, validateTLSOptions,
validateConnectionPool, validateLoadBalancer, validateHTTPRetry, validateCORSHTTPMethod,
ValidateHTTPHeaderNameOrJwtClaimRoute, ValidateCORSHTTPHeaderName, ValidateProbeHeaderName,
ValidateServiceEntry; agent/validation.go: ValidateNamespaceSlashWildcardHostname), and for
fields whose Go validation could not be read, the API change that added them (its CRD schema
rules, which `istioctl validate` applies too): istio/api#3512 (retryBudget), #3523 (cookie
attributes), #3733 (zoneAwareLbSetting), #3737 (JWTRule presence); and Istio's CRD test files
(`pkg/config/validation/testdata/crds/*-valid.yaml`, `*-invalid.yaml`: the `reqauth-`,
`authz-` and `peerauth-` cases) for the newer security fields. ValidateAuthorizationPolicy
(serviceAccounts, empty `from`/`to`), validateHTTPRouteMatchRequest (null header match),
checkDryRunAnnotation and validateLoadBalancer (minimumRingSize beside a hash algorithm) follow
Istio's Go code; the DYNAMIC_DNS, http2KeepAlive and redirect prefixRewrite cases follow the
list of what Istio refuses, worded by meshctl (docs/validation.md says so).

Every case failed before its rule was changed, except three that guard behaviour which already
matched Istio (a lone `~` egress namespace, a backoff with attempts 0 accepted)
and the valid DestinationRule with the newer fields, which guards the new rules against
refusing what Istio accepts.

The case format is the validation rules' (`cases` in tests/conftest.py): a line marked `# <-` is
where the finding must point.
"""

from __future__ import annotations

import pytest
from conftest import DR, SC, SE, VS, WG, document, load, marked_line

from meshctl.config.findings import Severity
from meshctl.config.loader import load_text

AP = "AuthorizationPolicy"
PA = "PeerAuthentication"
RA = "RequestAuthentication"


def case(kind: str, case_id: str, field: str, message: str, spec: str) -> object:
    return pytest.param(kind, spec, field, message, id=case_id)


ERRORS = [
    case(
        SC,
        "ValidateSidecar-ingress-tls-credentialNames",
        "spec.ingress[0].tls.credentialNames",
        "credentialNames is not supported on a Sidecar ingress",
        """
        ingress:
        - port: {number: 9443, protocol: HTTPS}
          tls:
            mode: SIMPLE
            credentialNames: [rsa, ecdsa]  # <-
        """,
    ),
    case(
        SC,
        "ValidateSidecar-ingress-tls-tlsCertificates",
        "spec.ingress[0].tls.tlsCertificates",
        "tlsCertificates is not supported on a Sidecar ingress",
        """
        ingress:
        - port: {number: 9443, protocol: HTTPS}
          tls:
            mode: SIMPLE
            tlsCertificates:  # <-
            - {serverCertificate: /c.pem, privateKey: /k.pem}
        """,
    ),
    case(
        SC,
        "ValidateSidecar-ingress-tls-needs-a-TLS-port",
        "spec.ingress[0].tls",
        "needs protocol HTTPS or TLS",
        """
        ingress:
        - port: {number: 9080, protocol: HTTP}
          tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}  # <-
        """,
    ),
    case(
        VS,
        "validateHTTPRetry-backoff-below-1ms",
        "spec.http[0].retries.backoff",
        "must be at least 1ms",
        """
        hosts: [r.shop.mesh]
        http:
        - route: [{destination: {host: r.shop.mesh}}]
          retries:
            attempts: 3
            backoff: 500us  # <-
        """,
    ),
    case(
        VS,
        "validateHTTPRetry-backoff-ms-precision",
        "spec.http[0].retries.backoff",
        "finer than the supported 1ms precision",
        """
        hosts: [r.shop.mesh]
        http:
        - route: [{destination: {host: r.shop.mesh}}]
          retries:
            attempts: 3
            backoff: 1500us  # <-
        """,
    ),
    case(
        DR,
        "validateLoadBalancer-cookie-attribute-needs-a-name",
        "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.attributes[1]",
        "a cookie attribute needs a name",
        """
        host: r.shop.mesh
        trafficPolicy:
          loadBalancer:
            consistentHash:
              httpCookie:
                name: session
                ttl: 0s
                attributes:
                - {name: SameSite, value: Strict}
                - {value: Lax}  # <-
        """,
    ),
    case(
        DR,
        "validateConnectionPool-http2KeepAlive-interval-below-1ms",
        "spec.trafficPolicy.connectionPool.http.http2KeepAlive.interval",
        "must be at least 1ms",
        """
        host: r.shop.mesh
        trafficPolicy:
          connectionPool:
            http:
              http2KeepAlive:
                interval: 0s  # <-
                timeout: 5s
        """,
    ),
    case(
        DR,
        "validateConnectionPool-http2KeepAlive-timeout-below-1ms",
        "spec.subsets[0].trafficPolicy.connectionPool.http.http2KeepAlive.timeout",
        "must be at least 1ms",
        """
        host: r.shop.mesh
        subsets:
        - name: v1
          labels: {version: v1}
          trafficPolicy:
            connectionPool:
              http:
                http2KeepAlive: {interval: 30s, timeout: 100us}  # <-
        """,
    ),
    case(
        DR,
        "validateTrafficPolicy-retryBudget-percent-over-100",
        "spec.trafficPolicy.retryBudget.percent",
        "retry budget percent 150 must be in the range 0..100",
        """
        host: r.shop.mesh
        trafficPolicy:
          retryBudget:
            percent: 150  # <-
        """,
    ),
    case(
        DR,
        "validateLoadBalancer-zoneAware-and-locality",
        "spec.trafficPolicy.loadBalancer.zoneAwareLbSetting",
        '"zoneAwareLbSetting" and "localityLbSetting" cannot be set together',
        """
        host: r.shop.mesh
        trafficPolicy:
          loadBalancer:
            simple: ROUND_ROBIN
            localityLbSetting: {enabled: true}
            zoneAwareLbSetting: {enabled: true}  # <-
        """,
    ),
    case(
        DR,
        "validateLoadBalancer-zoneAware-failoverPriority-topology-label",
        "spec.trafficPolicy.portLevelSettings[0].loadBalancer.zoneAwareLbSetting.failoverPriority[1]",
        "cannot be in a zone-aware failoverPriority",
        """
        host: r.shop.mesh
        trafficPolicy:
          portLevelSettings:
          - port: {number: 9080}
            loadBalancer:
              zoneAwareLbSetting:
                enabled: true
                failoverPriority:
                - topology.istio.io/network
                - topology.kubernetes.io/zone  # <-
        """,
    ),
    case(
        WG,
        "ValidateProbeHeaderName-no-underscore",
        "spec.probe.httpGet.httpHeaders[0].name",
        'invalid header name "x_probe": a probe header takes letters, digits and "-" only',
        """
        template: {serviceAccount: reviews}
        probe:
          httpGet:
            port: 9080
            httpHeaders: [{name: x_probe, value: "1"}]  # <-
        """,
    ),
    case(
        AP,
        "ValidateAuthorizationPolicy-serviceAccounts-with-principals",
        "spec.rules[0].from[0].source.serviceAccounts",
        "cannot set serviceAccounts with namespaces or principals",
        """
        rules:
        - from:
          - source:
              principals: [cluster.local/ns/shop/sa/sleep]
              serviceAccounts: [shop/sleep]  # <-
        """,
    ),
    case(
        AP,
        "ValidateAuthorizationPolicy-notServiceAccounts-with-namespaces",
        "spec.rules[0].from[0].source.notServiceAccounts",
        "cannot set serviceAccounts with namespaces or principals",
        """
        rules:
        - from:
          - source:
              namespaces: [shop]
              notServiceAccounts: [shop/legacy]  # <-
        """,
    ),
    case(
        AP,
        "CheckServiceAccount-serviceAccounts-wildcard",
        "spec.rules[0].from[0].source.serviceAccounts[0]",
        "wildcard not allowed",
        """
        rules:
        - from:
          - source:
              serviceAccounts:
              - shop/*  # <-
        """,
    ),
    case(
        AP,
        "ValidateAuthorizationPolicy-empty-from",
        "spec.rules[0].from",
        "`from` must not be empty",
        """
        rules:
        - from: []  # <-
          to: [{operation: {methods: [GET]}}]
        """,
    ),
    case(
        AP,
        "ValidateAuthorizationPolicy-empty-to",
        "spec.rules[0].to",
        "`to` must not be empty",
        """
        rules:
        - from: [{source: {namespaces: [shop]}}]
          to: []  # <-
        """,
    ),
    case(
        PA,
        "ValidatePeerAuthentication-empty-port-level-mtls",
        "spec.portLevelMtls",
        "port level mTLS, if defined, must have at least one element",
        """
        selector: {matchLabels: {app: reviews}}
        portLevelMtls: {}  # <-
        """,
    ),
    case(
        VS,
        "validateHTTPRouteMatchRequest-null-header-match",
        "spec.http[0].match[0].headers.x-user",
        "header match x-user cannot be null",
        """
        hosts: [r.shop.mesh]
        http:
        - match:
          - headers:
              x-user:  # <-
          route: [{destination: {host: r.shop.mesh}}]
        """,
    ),
    case(
        VS,
        "validateHTTPRedirect-uri-and-prefixRewrite",
        "spec.http[0].redirect.prefixRewrite",
        "a redirect cannot set both uri and prefixRewrite",
        """
        hosts: [r.shop.mesh]
        http:
        - match: [{uri: {prefix: /old}}]
          redirect:
            uri: /new
            prefixRewrite: /newer  # <-
        """,
    ),
    case(
        VS,
        "validateHTTPRedirect-prefixRewrite-with-exact-match",
        "spec.http[0].match[1].uri.exact",
        "prefixRewrite in a redirect needs prefix uri matches, found a exact match",
        """
        hosts: [r.shop.mesh]
        http:
        - match:
          - uri: {prefix: /old}
          - uri:
              exact: /old/index.html  # <-
          redirect: {prefixRewrite: /new}
        """,
    ),
    case(
        VS,
        "validateHTTPRedirect-prefixRewrite-with-regex-match",
        "spec.http[0].match[0].uri.regex",
        "prefixRewrite in a redirect needs prefix uri matches, found a regex match",
        """
        hosts: [r.shop.mesh]
        http:
        - match:
          - uri:
              regex: /old/.*  # <-
          redirect: {prefixRewrite: /new}
        """,
    ),
    case(
        DR,
        "validateLoadBalancer-consistentHash-minimumRingSize-and-maglev",
        "spec.trafficPolicy.loadBalancer.consistentHash.minimumRingSize",
        'minimumRingSize cannot be set with "ringHash" or "maglev"',
        """
        host: r.shop.mesh
        trafficPolicy:
          loadBalancer:
            consistentHash:
              httpHeaderName: x-user
              minimumRingSize: 1024  # <-
              maglev: {tableSize: 65537}
        """,
    ),
    case(
        DR,
        "validateConnectionPool-http2KeepAlive-without-interval",
        "spec.trafficPolicy.connectionPool.http.http2KeepAlive",
        "http2KeepAlive needs an interval",
        """
        host: r.shop.mesh
        trafficPolicy:
          connectionPool:
            http:
              http2KeepAlive: {timeout: 5s}  # <-
        """,
    ),
    case(
        DR,
        "validateConnectionPool-http2KeepAlive-empty",
        "spec.trafficPolicy.connectionPool.http.http2KeepAlive",
        "http2KeepAlive needs an interval",
        """
        host: r.shop.mesh
        trafficPolicy:
          connectionPool:
            http:
              http2KeepAlive: {}  # <-
        """,
    ),
    case(
        SE,
        "ValidateServiceEntry-DYNAMIC_DNS-TCP-port",
        "spec.ports[0].protocol",
        "resolution DYNAMIC_DNS needs HTTP or TLS ports",
        """
        hosts: ["*.wikipedia.org"]
        ports:
        - {number: 5432, name: pg, protocol: TCP}  # <-
        resolution: DYNAMIC_DNS
        """,
    ),
    case(
        SE,
        "ValidateServiceEntry-DYNAMIC_DNS-FQDN-host",
        "spec.hosts[0]",
        "resolution DYNAMIC_DNS is for wildcard hosts",
        """
        hosts:
        - www.wikipedia.org  # <-
        ports: [{number: 443, name: tls, protocol: TLS}]
        resolution: DYNAMIC_DNS
        """,
    ),
    case(
        SE,
        "ValidateServiceEntry-DYNAMIC_DNS-endpoints",
        "spec.endpoints",
        "resolution DYNAMIC_DNS takes no endpoints",
        """
        hosts: ["*.wikipedia.org"]
        ports: [{number: 443, name: tls, protocol: TLS}]
        resolution: DYNAMIC_DNS
        endpoints:  # <-
        - address: 198.51.100.7
        """,
    ),
    case(
        SE,
        "ValidateServiceEntry-DYNAMIC_DNS-addresses",
        "spec.addresses",
        "resolution DYNAMIC_DNS takes no addresses",
        """
        hosts: ["*.wikipedia.org"]
        addresses: [240.0.0.9]  # <-
        ports: [{number: 443, name: tls, protocol: TLS}]
        resolution: DYNAMIC_DNS
        """,
    ),
    case(
        RA,
        "reqauth-invalid-space-delimited-claims",
        "spec.jwtRules[0].spaceDelimitedClaims[0]",
        "a space-delimited claim must be a non-empty string",
        """
        jwtRules:
        - issuer: https://issuer.example
          jwksUri: https://issuer.example/keys.json
          spaceDelimitedClaims:
          - ""  # <-
        """,
    ),
    case(
        RA,
        "reqauth-invalid-presence-value",
        "spec.jwtRules[0].presence",
        'invalid value "MANDATORY"',
        """
        jwtRules:
        - issuer: https://issuer.example
          jwksUri: https://issuer.example/keys.json
          presence: MANDATORY  # <-
        """,
    ),
]

WARNINGS = [
    case(
        SE,
        # TestSidecarDynamicDNSClusters "Unsupported protocol HTTPS": Istio accepts the entry
        # and builds no dynamic forward proxy for the port.
        "ValidateServiceEntry-DYNAMIC_DNS-HTTPS-port-not-served",
        "spec.ports[0].protocol",
        "a DYNAMIC_DNS port gets the dynamic forward proxy only as HTTP (routed by Host) or TLS",
        """
        hosts: ["*.wikipedia.org"]
        ports:
        - {number: 443, name: https, protocol: HTTPS}  # <-
        location: MESH_EXTERNAL
        resolution: DYNAMIC_DNS
        """,
    ),
]

VALID = [
    pytest.param(
        VS,
        """
        hosts: [r.shop.mesh]
        http:
        - match:
          - headers:
              x.custom~id: {exact: a}
              ":path": {prefix: /api}
            withoutHeaders:
              x-debug!: {regex: "*"}
          route: [{destination: {host: r.shop.mesh}}]
        """,
        id="ValidateHTTPHeaderNameOrJwtClaimRoute-token-characters-and-pseudo-headers",
    ),
    pytest.param(
        VS,
        """
        hosts: [r.shop.mesh]
        http:
        - route: [{destination: {host: r.shop.mesh}}]
          corsPolicy:
            allowOrigins: [{exact: https://shop.example.com}]
            allowMethods: ["*"]
            allowHeaders: [x.request.id, "*"]
            exposeHeaders: [x.trace~id]
        """,
        id="validateCORSHTTPMethod-star-and-ValidateCORSHTTPHeaderName-tokens",
    ),
    pytest.param(
        DR,
        """
        host: r.shop.mesh
        trafficPolicy:
          retryBudget: {percent: 20, minRetryConcurrency: 3, budgetInterval: 10s}
          connectionPool:
            http:
              http2KeepAlive: {interval: 30s, timeout: 1500us}
          loadBalancer:
            consistentHash:
              httpCookie:
                name: session
                path: /
                ttl: 0s
                attributes: [{name: SameSite, value: Strict}, {name: Secure}, {name: Partitioned}]
        subsets:
        - name: v1
          labels: {version: v1}
          trafficPolicy:
            loadBalancer:
              simple: LEAST_REQUEST
              zoneAwareLbSetting:
                enabled: true
                minClusterSize: 3
                failover: [{from: us-east, to: eu-west}]
                failoverPriority: [topology.istio.io/network]
        """,
        id="newer-DestinationRule-fields-istio-api-3512-3523-3733",
    ),
    pytest.param(
        SC,
        """
        egress:
        - hosts: ["~/*", "./*", "*/api.example.com", "~kube-system/*"]
        """,
        id="ValidateNamespaceSlashWildcardHostname-tilde-namespace",
    ),
    pytest.param(
        VS,
        """
        hosts: [r.shop.mesh]
        http:
        - match: [{uri: {prefix: /old}}]
          redirect: {prefixRewrite: /new}
        """,
        id="validateHTTPRedirect-prefixRewrite-alone",
    ),
    pytest.param(
        DR,
        """
        host: r.shop.mesh
        trafficPolicy:
          loadBalancer:
            consistentHash:
              httpHeaderName: x-user
              ringHash: {minimumRingSize: 1024}
        """,
        id="validateLoadBalancer-ringHash-alone",
    ),
    pytest.param(
        RA,
        """
        jwtRules:
        - issuer: https://issuer.example
          jwksUri: https://issuer.example/keys.json
          spaceDelimitedClaims: [roles, tenant.groups]
          presence: REQUIRED
        """,
        id="reqauth-valid-spaceDelimitedClaims-and-presence",
    ),
    pytest.param(
        AP,
        """
        rules:
        - from:
          - source: {serviceAccounts: [other/sleep, sleep], notServiceAccounts: [shop/legacy]}
          - source: {principals: [cluster.local/ns/shop/sa/admin]}
          - source: {namespaces: [other], trustDomains: [cluster.local, "cluster.*"], notTrustDomains: ["legacy.*"]}
        """,
        id="authz-valid-serviceAccounts-beside-principals-in-other-sources",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "field", "message"), ERRORS)
def test_rule_is_an_error_as_in_istio(kind: str, spec: str, field: str, message: str) -> None:
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.ERROR
    assert found[0].line == marked_line(text), str(found[0])


@pytest.mark.parametrize(("kind", "spec", "field", "message"), WARNINGS)
def test_rule_is_a_warning(kind: str, spec: str, field: str, message: str) -> None:
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.WARNING
    assert found[0].line == marked_line(text), str(found[0])
    assert load_text(text, "parity.yaml").ok, "a warning alone must not reject the file"


@pytest.mark.parametrize(("kind", "spec"), VALID)
def test_istio_accepts_it_so_meshctl_does(kind: str, spec: str) -> None:
    _, findings = load(kind, spec)
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize("namespace", ["~~", "~-", "~a.b"])
def test_ValidateNamespaceSlashWildcardHostname_tilde_then_a_namespace(namespace: str) -> None:
    """`~` alone is a Sidecar egress namespace (none) and `~ns` every namespace but ns; what
    follows the `~` must be a namespace name."""
    _, findings = load(SC, f"egress:\n- hosts: ['{namespace}/*']\n")
    assert [f.message for f in findings] == [f'host "{namespace}/*": invalid namespace "{namespace}"']


def test_validateHTTPRetry_backoff_does_not_count_as_a_retry_setting() -> None:
    """Istio refuses retry settings with attempts 0 for perTryTimeout, retryOn and
    retryRemoteLocalities only; a backoff with retries switched off is accepted."""
    spec = (
        "hosts: [r.shop.mesh]\nhttp:\n- route: [{destination: {host: r.shop.mesh}}]\n"
        "  retries: {attempts: 0, backoff: 25ms}\n"
    )
    _, findings = load(VS, spec)
    assert findings == []


def test_service_entry_addresses_in_a_flow_list_with_ipv6_ending_in_double_colon() -> None:
    """Go's YAML parser (Istio's) reads `[1.2.3.4, 2001:db8::]`; libyaml alone would not."""
    spec = (
        "hosts: [db.shop.mesh]\naddresses: [10.0.0.9, 2001:db8::]\n"
        "ports: [{number: 5432, name: tcp, protocol: TCP}]\nresolution: STATIC\n"
        "endpoints: [{address: 2001:db8::5}, {address: 'fe80::1'}]\n"
    )
    result = load_text(document(SE, spec), "parity.yaml")
    assert result.ok and list(result.findings) == [], "\n".join(map(str, result.findings))
    (config,) = result.configs
    assert list(config.spec.addresses) == ["10.0.0.9", "2001:db8::"]
    assert [e.address for e in config.spec.endpoints] == ["2001:db8::5", "fe80::1"]


@pytest.mark.parametrize("where", ["directResponse: {status: 600}", "fault: {abort: {httpStatus: 600}}"])
def test_validateHTTPStatus_600_stays_an_error_on_purpose(where: str) -> None:
    """Istio's validateHTTPStatus lets 600 through (`status > 600`); Envoy refuses it, so meshctl
    stays stricter here (docs/validation.md)."""
    route = "" if "directResponse" in where else "route: [{destination: {host: r.shop.mesh}}]\n  "
    _, findings = load(VS, f"hosts: [r.shop.mesh]\nhttp:\n- {route}{where}\n")
    assert [f.severity for f in findings if "600 must be in the range 200..599" in f.message] == [Severity.ERROR]


def _dry_run_document(kind: str, action: str, value: str, spec: str) -> str:
    group = "security.istio.io/v1"
    head = (
        f"apiVersion: {group}\nkind: {kind}\nmetadata:\n  name: example\n  namespace: shop\n"
        f"  annotations:\n    istio.io/dry-run: '{value}'  # <-\n"
    )
    return head + f"spec:\n  {spec}\n" + (f"  action: {action}\n" if action else "")


@pytest.mark.parametrize(
    ("kind", "action", "value", "spec", "message"),
    [
        pytest.param(
            AP, "ALLOW", "yes", "rules: [{}]",
            'shop/example has annotation istio.io/dry-run with invalid value (yes): strconv.ParseBool: parsing "yes"',
            id="checkDryRunAnnotation-invalid-value",
        ),
        pytest.param(
            AP, "AUDIT", "true", "rules: [{}]",
            "the annotation istio.io/dry-run currently only supports action ALLOW/DENY, found action AUDIT",
            id="checkDryRunAnnotation-AUDIT",
        ),
        pytest.param(
            RA, "", "true", "jwtRules: [{issuer: https://issuer.example, jwks: '{\"keys\": []}'}]",
            "shop/example has unsupported annotation istio.io/dry-run, please remove the annotation",
            id="checkDryRunAnnotation-RequestAuthentication",
        ),
    ],
)  # fmt: skip
def test_checkDryRunAnnotation(kind: str, action: str, value: str, spec: str, message: str) -> None:
    text = _dry_run_document(kind, action, value, spec)
    findings = [f for f in load_text(text, "parity.yaml").findings if message in f.message]
    assert findings, "\n".join(map(str, load_text(text, "parity.yaml").findings))
    assert findings[0].field == "metadata.annotations.istio.io/dry-run"
    assert findings[0].severity is Severity.ERROR and findings[0].line == marked_line(text)


@pytest.mark.parametrize("value", ["true", "False", "1"])
def test_checkDryRunAnnotation_takes_what_ParseBool_takes(value: str) -> None:
    result = load_text(_dry_run_document(AP, "DENY", value, "rules: [{}]"), "parity.yaml")
    assert result.ok and list(result.findings) == [], "\n".join(map(str, result.findings))


def test_ValidateServiceEntry_DYNAMIC_DNS_MESH_INTERNAL_with_a_waypoint() -> None:
    text = (
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: example\n  namespace: shop\n"
        "  labels:\n    istio.io/use-waypoint: waypoint  # <-\n"
        "spec:\n  hosts: ['*.svc.cluster.local']\n  ports: [{number: 9080, name: http, protocol: HTTP}]\n"
        "  location: MESH_INTERNAL\n  resolution: DYNAMIC_DNS\n"
    )
    findings = [f for f in load_text(text, "parity.yaml").findings if f.severity is Severity.ERROR]
    assert [(f.field, f.line) for f in findings] == [("metadata.labels.istio.io/use-waypoint", marked_line(text))]
    assert "cannot use a waypoint" in findings[0].message
    external = text.replace("MESH_INTERNAL", "MESH_EXTERNAL")
    assert load_text(external, "parity.yaml").ok
