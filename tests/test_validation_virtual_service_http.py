"""VirtualService HTTP routes as `istioctl validate` checks them, seen the way a user sees them:
what a route does (route, redirect, directResponse, delegate, mirrors), its matches, headers,
CORS policy, faults, mirroring, redirects, retries, rewrites and timeouts, and routes that
shadow one another.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

from conftest import VS, cases, load, rule_case_tests

from meshctl.config.findings import Severity

ERRORS = [
    *cases(
        VS,
        """
[http-route-and-redirect] spec.http[0].route
cannot have both "route" and "redirect"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: a.mesh}}]  # <-
      redirect: {uri: /v2}

[http-route-and-direct-response] spec.http[0].route
cannot have both "route" and "directResponse"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: a.mesh}}]  # <-
      directResponse: {status: 503}

[http-redirect-and-direct] spec.http[0].directResponse
cannot have both "directResponse" and "redirect"
    hosts: [r.shop.mesh]
    http:
    - redirect: {uri: /v2}
      directResponse: {status: 503}  # <-

[http-fault-and-redirect] spec.http[0].fault
cannot have both "fault" and "redirect"
    hosts: [r.shop.mesh]
    http:
    - redirect: {uri: /v2}
      fault: {abort: {httpStatus: 500}}  # <-

[http-rewrite-and-direct] spec.http[0].rewrite
cannot have both "rewrite" and "directResponse"
    hosts: [r.shop.mesh]
    http:
    - directResponse: {status: 503}
      rewrite: {uri: /}  # <-

[http-nothing-to-do] spec.http[0]
needs "route", "redirect", "directResponse" or "delegate"
    hosts: [r.shop.mesh]
    http:
    - timeout: 1s  # <-

[http-delegate-and-route] spec.http[0].route
an HTTP route that delegates cannot also have route
    hosts: [r.shop.mesh]
    http:
    - delegate: {name: child}
      route: [{destination: {host: a.mesh}}]  # <-

[http-delegate-in-delegate] spec.http[0].delegate
a delegate VirtualService cannot delegate again
    http:
    - delegate: {name: grandchild}  # <-
      route: [{destination: {host: a.mesh}}]

[http-mirror-and-mirrors] spec.http[0].mirrors
cannot have both "mirror" and "mirrors"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirror: {host: m.mesh}
      mirrors: [{destination: {host: m.mesh}}]  # <-

[match-header-name] spec.http[0].match[0].headers.bad header
invalid header name "bad header"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - headers:
          bad header: {exact: x}  # <-

[match-uri-regex-re2] spec.http[0].match[0].uri.regex
invalid perl operator
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - uri: {regex: '/api/(?=v1)'}  # <-

[match-header-regex] spec.http[0].match[0].headers.x-id.regex
missing ]
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - headers:
          x-id: {regex: '['}  # <-

[match-query-regex] spec.http[0].match[0].queryParams.q.regex
invalid regex
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - queryParams:
          q: {regex: '(a'}  # <-

[match-empty-prefix] spec.http[0].match[0].headers.x-id.prefix
prefix must not be empty
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - headers:
          x-id: {prefix: ''}  # <-

[match-port] spec.http[0].match[0].port
port number 70000 must be in the range 1..65535
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - port: 70000  # <-

[match-source-labels] spec.http[0].match[0].sourceLabels.bad key!
invalid label key "bad key!"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - sourceLabels:
          bad key!: v1  # <-

[match-source-namespace] spec.http[0].match[0].sourceNamespace
invalid sourceNamespace "Not_A_Namespace"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - sourceNamespace: Not_A_Namespace  # <-

[match-jwt-on-mesh] spec.http[0].match[0].headers.@request.auth.claims.group
only supported for gateways
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      match:
      - headers:
          '@request.auth.claims.group': {exact: admin}  # <-

[headers-pseudo] spec.http[0].headers.request.set.:path
header ":path" cannot be changed
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      headers:
        request:
          set: {':path': /x}  # <-

[headers-response-host] spec.http[0].headers.response.set.Host
header "Host" cannot be changed
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      headers:
        response:
          set: {Host: x}  # <-

[headers-remove-authority] spec.http[0].headers.request.remove[0]
header ":authority" cannot be changed
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      headers:
        request:
          remove: [':authority']  # <-

[headers-value-percent] spec.http[0].headers.request.add.x-id
write a literal % as "%%"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      headers:
        request:
          add: {x-id: '50%'}  # <-

[headers-authority-twice] spec.http[0].headers.request.set.host
the authority is rewritten more than once
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      rewrite: {authority: a.example.com}
      headers:
        request:
          set: {host: b.example.com}  # <-

[headers-on-destination] spec.http[0].route[0].headers.request.set.:method
header ":method" cannot be changed
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {host: a.mesh}
        headers: {request: {set: {':method': GET}}}  # <-

[cors-empty-origin] spec.http[0].corsPolicy.allowOrigins[0]
needs a non-empty exact, prefix or regex
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      corsPolicy:
        allowOrigins:
        - exact: ''  # <-

[cors-origin-regex] spec.http[0].corsPolicy.allowOrigins[0].regex
invalid regex
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      corsPolicy:
        allowOrigins:
        - regex: '*.example.com'  # <-

[cors-method] spec.http[0].corsPolicy.allowMethods[1]
"FETCH" is not a supported HTTP method
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      corsPolicy:
        allowMethods: [GET, FETCH]  # <-

[cors-header] spec.http[0].corsPolicy.allowHeaders[0]
invalid header name "x id"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      corsPolicy:
        allowHeaders: ['x id']  # <-

[cors-max-age] spec.http[0].corsPolicy.maxAge
maxAge is only accurate to whole seconds
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      corsPolicy:
        maxAge: 1.5s  # <-

[fault-http-status] spec.http[0].fault.abort.httpStatus
HTTP status 700 must be in the range 200..599
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        abort: {httpStatus: 700}  # <-

[fault-grpc-status] spec.http[0].fault.abort.grpcStatus
unknown gRPC status "BROKEN"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        abort: {grpcStatus: BROKEN}  # <-

[fault-http2] spec.http[0].fault.abort.http2Error
HTTP/2 abort fault injection is not supported
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        abort: {http2Error: REFUSED}  # <-

[fault-abort-percentage] spec.http[0].fault.abort.percentage.value
percentage 101 must be 0 or in the range 0.0001..100
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        abort:
          httpStatus: 503
          percentage: {value: 101}  # <-

[fault-delay-percentage] spec.http[0].fault.delay.percentage.value
must be 0 or in the range 0.0001..100
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        delay:
          fixedDelay: 5s
          percentage: {value: 0.00001}  # <-

[fault-delay-zero] spec.http[0].fault.delay.fixedDelay
duration 0s must be at least 1ms
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        delay: {fixedDelay: 0s}  # <-

[fault-exponential] spec.http[0].fault.delay.exponentialDelay
exponentialDelay is not supported
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        delay: {exponentialDelay: 1s}  # <-

[mirror-percentage] spec.http[0].mirrorPercentage
mirror percentage 150 must be in the range 0..100
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirror: {host: m.mesh}
      mirrorPercentage: {value: 150}  # <-

[mirror-percent-legacy] spec.http[0].mirror_percent
mirror_percent 101 must be at most 100
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirror: {host: m.mesh}
      mirror_percent: 101  # <-

[mirrors-destination] spec.http[0].mirrors[0]
a mirror needs a destination
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirrors:
      - percentage: {value: 10}  # <-

[mirrors-host] spec.http[0].mirrors[0].destination.host
destination host "*" is not allowed
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirrors:
      - destination: {host: '*'}  # <-
        percentage: {value: 10}

[mirrors-percentage] spec.http[0].mirrors[0].percentage
mirror percentage -1 must be in the range 0..100
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirrors:
      - destination: {host: m.mesh}
        percentage: {value: -1}  # <-

[redirect-empty] spec.http[0].redirect
a redirect needs at least one of uri, authority, scheme, port or prefixRewrite
    hosts: [r.shop.mesh]
    http:
    - redirect: {redirectCode: 301}  # <-

[redirect-code] spec.http[0].redirect.redirectCode
redirectCode 200 must be a 3xx code
    hosts: [r.shop.mesh]
    http:
    - redirect:
        uri: /v2
        redirectCode: 200  # <-

[redirect-scheme] spec.http[0].redirect.scheme
redirect scheme "ftp" must be "http" or "https"
    hosts: [r.shop.mesh]
    http:
    - redirect:
        scheme: ftp  # <-

[redirect-port] spec.http[0].redirect.port
port number 70000
    hosts: [r.shop.mesh]
    http:
    - redirect:
        port: 70000  # <-

[direct-response-status] spec.http[0].directResponse.status
status 700 must be in the range 200..599
    hosts: [r.shop.mesh]
    http:
    - directResponse:
        status: 700  # <-

[retries-negative] spec.http[0].retries.attempts
retry attempts must not be negative
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      retries: {attempts: -1}  # <-

[retries-disabled] spec.http[0].retries.attempts
retries are disabled (attempts is 0) but other retry settings are set
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      retries: {perTryTimeout: 2s}  # <-

[retries-per-try-timeout] spec.http[0].retries.perTryTimeout
duration 0.000500s must be at least 1ms
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      retries:
        attempts: 3
        perTryTimeout: 0.0005s  # <-

[retries-retry-on] spec.http[0].retries.retryOn
"sometimes" is not a valid retryOn policy
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      retries:
        attempts: 3
        retryOn: 5xx,sometimes  # <-

[retries-retry-on-spaces] spec.http[0].retries.retryOn
(no spaces around commas)
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      retries:
        attempts: 3
        retryOn: 5xx, reset  # <-

[rewrite-both] spec.http[0].rewrite
a rewrite can have "uri" or "uriRegexRewrite", not both
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      rewrite:  # <-
        uri: /v2
        uriRegexRewrite: {match: ^/v1, rewrite: /v2}

[rewrite-regex-half] spec.http[0].rewrite.uriRegexRewrite
uriRegexRewrite needs both "match" and "rewrite"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      rewrite:
        uriRegexRewrite: {match: ^/v1}  # <-

[rewrite-regex-invalid] spec.http[0].rewrite.uriRegexRewrite.match
invalid regex
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      rewrite:
        uriRegexRewrite:
          match: '^/(v1'  # <-
          rewrite: /v2

[timeout-zero] spec.http[0].timeout
duration 0s must be at least 1ms
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      timeout: 0s  # <-

[timeout-precision] spec.http[0].timeout
finer than the supported 1ms precision
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      timeout: 1.0005s  # <-
""",
    ),
    # What Envoy writes into a request or a redirect cannot hold a NUL, CR or LF (Envoy refuses the
    # route configuration), and a header it adds is at most 16 KiB.
    *cases(
        VS,
        f"""
[http-rewrite-uri-line-break] spec.http[0].rewrite.uri
contains a NUL, carriage return or line feed, which Envoy refuses
    hosts: [r.shop.mesh]
    http:
    - route: [{{destination: {{host: a.mesh}}}}]
      rewrite: {{uri: "/v2\\r\\nx-injected: 1"}}  # <-

[http-rewrite-authority-line-break] spec.http[0].rewrite.authority
contains a NUL, carriage return or line feed
    hosts: [r.shop.mesh]
    http:
    - route: [{{destination: {{host: a.mesh}}}}]
      rewrite: {{authority: "a\\nb"}}  # <-

[http-redirect-uri-line-break] spec.http[0].redirect.uri
contains a NUL, carriage return or line feed
    hosts: [r.shop.mesh]
    http:
    - redirect: {{uri: "/v2\\n"}}  # <-

[http-header-value-too-long] spec.http[0].headers.request.set.x-big
Envoy takes at most 16384
    hosts: [r.shop.mesh]
    http:
    - route: [{{destination: {{host: a.mesh}}}}]
      headers:
        request:
          set:
            x-big: {"v" * 16385}  # <-
""",
    ),
]

WARNINGS = [
    *cases(
        VS,
        """
[vs-source-labels-gateway] spec.http[0].match[0].sourceLabels
sourceLabels applies to sidecar clients, but this rule is not bound to "mesh"
    hosts: [r.shop.mesh]
    gateways: [shop/gw]
    http:
    - match: [{sourceLabels: {app: web}}]  # <-
      route: [{destination: {host: a.mesh}}]

[fault-abort-without-status] spec.http[0].fault.abort
abort has no httpStatus or grpcStatus
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      fault:
        abort: {percentage: {value: 10}}  # <-

[mirror-percent-deprecated] spec.http[0].mirror_percent
mirror_percent is deprecated: use "mirrorPercentage"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
      mirror: {host: m.mesh}
      mirror_percent: 10  # <-

[rule-after-catch-all] spec.http[1]
http rule #1 is never used: rule #0 has no match and takes all traffic
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    - route:  # <-
      - destination: {host: b.mesh}

[rule-duplicate-match] spec.http[1].match[0]
http rule #1 match #0 is never used: rule "api" has the same match
    hosts: [r.shop.mesh]
    http:
    - name: api
      match: [{uri: {prefix: /api}}]
      route: [{destination: {host: a.mesh}}]
    - match:
      - uri: {prefix: /api}  # <-
      route: [{destination: {host: b.mesh}}]

[rule-shadowed-prefix] spec.http[1].match[0].uri
rule #0 takes uri prefix "/api" first
    hosts: [r.shop.mesh]
    http:
    - match: [{uri: {prefix: /api}}]
      route: [{destination: {host: a.mesh}}]
    - match:
      - uri: {prefix: /api/v2}  # <-
      route: [{destination: {host: b.mesh}}]
""",
    ),
]


def test_a_large_direct_response_body_is_a_warning() -> None:
    body = "x" * 110_000
    spec = f"hosts: [r.shop.mesh]\nhttp:\n- directResponse:\n    status: 200\n    body:\n      string: {body}\n"
    _, findings = load(VS, spec)
    (finding,) = findings
    assert (finding.severity, finding.field, finding.line) == (Severity.WARNING, "spec.http[0].directResponse.body", 11)
    assert "the body is over 100KB" in finding.message


# The three checks of every kind's cases (`conftest.rule_case_tests`).
test_broken_rule_is_an_error_at_its_field, test_questionable_config_is_a_warning_at_its_field = rule_case_tests(
    errors=ERRORS, warnings=WARNINGS, valid=None
)
