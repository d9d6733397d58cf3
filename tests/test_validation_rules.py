"""Per-kind rules, as `istioctl validate` enforces them, seen the way a user sees them.

Each case is a small resource loaded from YAML text. A line marked `# <-` is where the finding
must point (unmarked: the `spec:` line); the finding must name the field and say what is wrong.
Cases are written as

    [case-id] field.path
    text the message contains
        yaml of the spec ...

separated by blank lines.
"""

from __future__ import annotations

import textwrap

import pytest

from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import load_text

MARK = "# <-"


def document(kind: str, spec: str) -> str:
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    head = f"apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata:\n  name: example\n  namespace: shop\n"
    return f"{head}spec:\n{body}\n"


def load(kind: str, spec: str) -> tuple[str, list[Finding]]:
    text = document(kind, spec)
    return text, list(load_text(text, "rules.yaml").findings)


def marked_line(text: str) -> int:
    lines = text.splitlines()
    marked = [n for n, line in enumerate(lines, 1) if line.rstrip().endswith(MARK)]
    assert len(marked) <= 1, "mark one line at most"
    return marked[0] if marked else lines.index("spec:") + 1


def cases(kind: str, text: str) -> list[object]:
    """Parameters (kind, spec, field, message) from the case format in the module docstring."""
    out: list[object] = []
    for block in textwrap.dedent(text).strip().split("\n\n"):
        title, message, *spec = block.splitlines()
        case_id, _, field = title.partition("] ")
        out.append(pytest.param(kind, "\n".join(spec), field, message, id=case_id.lstrip("[")))
    return out


VS = "VirtualService"
DR = "DestinationRule"
GW = "Gateway"
SE = "ServiceEntry"
WE = "WorkloadEntry"
WG = "WorkloadGroup"
SC = "Sidecar"

ERRORS = [
    *cases(
        VS,
        """
[vs-host-label] spec.hosts[0]
"bad_host" is not a DNS label
    hosts: [bad_host.mesh]  # <-
    tcp: [{route: [{destination: {host: a.mesh}}]}]

[vs-host-partial-wildcard] spec.hosts[0]
a wildcard is only allowed as a leading
    hosts: ['a*.mesh']  # <-
    tcp: [{route: [{destination: {host: a.mesh}}]}]

[vs-host-star-mesh] spec.hosts[0]
host "*" is not allowed in a VirtualService bound to the mesh
    hosts: ['*']  # <-
    tcp: [{route: [{destination: {host: a.mesh}}]}]

[vs-host-duplicate] spec.hosts[1]
duplicate host: "*.shop.mesh" overlaps "a.shop.mesh"
    hosts:
    - a.shop.mesh
    - '*.shop.mesh'  # <-
    tcp: [{route: [{destination: {host: a.mesh}}]}]

[vs-no-routes] spec
needs at least one http, tcp or tls route
    hosts: [r.shop.mesh]

[vs-delegate-gateways] spec.gateways
a delegate VirtualService (one without hosts) cannot have gateways
    gateways: [gw]  # <-
    http: [{route: [{destination: {host: a.mesh}}]}]

[vs-delegate-tcp] spec.tcp
cannot have tcp routes
    tcp: [{route: [{destination: {host: a.mesh}}]}]  # <-

[vs-gateway-name] spec.gateways[0]
invalid gateway name "Bad_Name"
    hosts: [r.shop.mesh]
    gateways: [shop/Bad_Name]  # <-
    http: [{route: [{destination: {host: a.mesh}}]}]

[vs-gateway-name-short] spec.gateways[0]
invalid gateway name "bad_gw"
    hosts: [r.shop.mesh]
    gateways: [bad_gw]  # <-
    http: [{route: [{destination: {host: a.mesh}}]}]

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

[destination-missing] spec.http[0].route[0]
a route needs a destination
    hosts: [r.shop.mesh]
    http:
    - route:
      - weight: 100  # <-

[destination-star] spec.http[0].route[0].destination.host
destination host "*" is not allowed
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {host: '*'}  # <-

[destination-host-missing] spec.http[0].route[0].destination.host
destination host is required
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {subset: v1}  # <-

[destination-subset] spec.http[0].route[0].destination.subset
invalid subset name "V_1"
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {host: a.mesh, subset: V_1}  # <-

[destination-port] spec.http[0].route[0].destination.port.number
port number 0
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {host: a.mesh, port: {number: 0}}  # <-

[weight-negative] spec.http[0].route[0].weight
weight -1 must not be negative
    hosts: [r.shop.mesh]
    http:
    - route:
      - destination: {host: a.mesh}
        weight: -1  # <-

[weights-all-zero] spec.http[0].route
the destination weights add up to 0
    hosts: [r.shop.mesh]
    http:
    - route:  # <-
      - destination: {host: a.mesh, subset: v1}
      - destination: {host: a.mesh, subset: v2}

[tls-no-match] spec.tls[0]
a tls route needs at least one match with sniHosts
    hosts: [r.shop.mesh]
    tls:
    - route: [{destination: {host: a.mesh}}]  # <-

[tls-no-sni] spec.tls[0].match[0]
a tls match needs at least one host in sniHosts
    hosts: [r.shop.mesh]
    tls:
    - match: [{port: 443}]  # <-
      route: [{destination: {host: a.mesh}}]

[tls-sni-outside-hosts] spec.tls[0].match[0].sniHosts[0]
SNI host "other.mesh" is not within the VirtualService hosts (r.shop.mesh)
    hosts: [r.shop.mesh]
    tls:
    - match: [{sniHosts: [other.mesh]}]  # <-
      route: [{destination: {host: a.mesh}}]

[tls-no-route] spec.tls[0]
a tls route needs at least one destination in route
    hosts: [r.shop.mesh]
    tls:
    - match: [{sniHosts: [r.shop.mesh]}]  # <-

[tcp-subnet] spec.tcp[0].match[0].destinationSubnets[0]
"10.0.0.0/33" is not a valid CIDR block
    hosts: [r.shop.mesh]
    tcp:
    - match: [{destinationSubnets: [10.0.0.0/33]}]  # <-
      route: [{destination: {host: a.mesh}}]

[tcp-port] spec.tcp[1].match[0].port
port number 70000
    hosts: [r.shop.mesh]
    tcp:
    - match: [{port: 0}]
      route: [{destination: {host: a.mesh}}]
    - match: [{port: 70000}]  # <-
      route: [{destination: {host: a.mesh}}]

[tcp-no-route] spec.tcp[0]
a tcp route needs at least one destination in route
    hosts: [r.shop.mesh]
    tcp:
    - match: [{port: 5432}]  # <-

[export-duplicate] spec.exportTo[1]
duplicate exportTo entry "."
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    exportTo: [., .]  # <-

[export-nobody] spec.exportTo[0]
exportTo "~" (no one) is only allowed on a ServiceEntry
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    exportTo: ['~']  # <-

[export-star-and-more] spec.exportTo
cannot be combined with other entries
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    exportTo: ['*', shop]  # <-

[export-invalid] spec.exportTo[0]
invalid exportTo entry "Shop_NS"
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    exportTo: [Shop_NS]  # <-
""",
    ),
    *cases(
        DR,
        """
[dr-host-missing] spec.host
host is required
    subsets: [{name: v1}]

[dr-host-invalid] spec.host
"" is not a DNS label
    host: reviews..mesh  # <-

[dr-subset-name-missing] spec.subsets[0]
subset name is required
    host: r.mesh
    subsets:
    - labels: {version: v1}  # <-

[dr-subset-name-invalid] spec.subsets[0].name
invalid subset name "v_1"
    host: r.mesh
    subsets:
    - name: v_1  # <-

[dr-subset-duplicate] spec.subsets[1].name
duplicate subset name "v1"
    host: r.mesh
    subsets:
    - name: v1
    - name: v1  # <-

[dr-subset-labels] spec.subsets[0].labels.version
invalid label value "v1 beta"
    host: r.mesh
    subsets:
    - name: v1
      labels: {version: 'v1 beta'}  # <-

[dr-tunnel-and-proxy-protocol] spec.trafficPolicy
"tunnel" and "proxyProtocol" cannot be set together
    host: r.mesh
    trafficPolicy:  # <-
      tunnel: {targetHost: proxy.mesh, targetPort: 8080}
      proxyProtocol: {version: V1}

[outlier-max-ejection] spec.trafficPolicy.outlierDetection.maxEjectionPercent
percentage 101 must be in the range 0..100
    host: r.mesh
    trafficPolicy:
      outlierDetection: {maxEjectionPercent: 101}  # <-

[outlier-min-health] spec.trafficPolicy.outlierDetection.minHealthPercent
percentage -5
    host: r.mesh
    trafficPolicy:
      outlierDetection: {minHealthPercent: -5}  # <-

[outlier-interval] spec.trafficPolicy.outlierDetection.interval
must be at least 1ms
    host: r.mesh
    trafficPolicy:
      outlierDetection: {interval: 0s}  # <-

[outlier-base-ejection] spec.trafficPolicy.outlierDetection.baseEjectionTime
must be at least 1ms
    host: r.mesh
    trafficPolicy:
      outlierDetection: {baseEjectionTime: 0.0001s}  # <-

[outlier-local-origin] spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures
only counts when splitExternalLocalOriginErrors is true
    host: r.mesh
    trafficPolicy:
      outlierDetection: {consecutiveLocalOriginFailures: 3}  # <-

[pool-negative] spec.trafficPolicy.connectionPool.http.http1MaxPendingRequests
must not be negative
    host: r.mesh
    trafficPolicy:
      connectionPool:
        http: {http1MaxPendingRequests: -1}  # <-

[pool-connect-timeout] spec.trafficPolicy.connectionPool.tcp.connectTimeout
must be at least 1ms
    host: r.mesh
    trafficPolicy:
      connectionPool:
        tcp: {connectTimeout: 0s}  # <-

[pool-upgrade-and-client-protocol] spec.trafficPolicy.connectionPool.http.useClientProtocol
cannot be true when h2UpgradePolicy is UPGRADE
    host: r.mesh
    trafficPolicy:
      connectionPool:
        http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true}  # <-

[lb-cookie-name] spec.trafficPolicy.loadBalancer.consistentHash.httpCookie
httpCookie needs a name
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        consistentHash:
          httpCookie: {ttl: 10s}  # <-

[lb-ring-size-twice] spec.trafficPolicy.loadBalancer.consistentHash.minimumRingSize
cannot be set with "ringHash" or "maglev"
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        consistentHash:
          useSourceIp: true
          minimumRingSize: 1024  # <-
          ringHash: {minimumRingSize: 1024}

[lb-maglev-prime] spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize
maglev tableSize 65536 must be a prime below 5000011
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        consistentHash:
          useSourceIp: true
          maglev: {tableSize: 65536}  # <-

[locality-distribute-and-failover] spec.trafficPolicy.loadBalancer.localityLbSetting
"distribute" and "failover" cannot be set together
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        localityLbSetting:  # <-
          distribute: [{from: us-east/*, to: {us-east/*: 100}}]
          failover: [{from: us-east, to: us-west}]

[locality-weights-sum] spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to
locality weights add up to 90, not 100
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        localityLbSetting:
          distribute:
          - from: us-east/*
            to: {us-east/*: 60, us-west/*: 30}  # <-

[locality-weight-zero] spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to.us-west/*
locality weight 0 must be in the range 1..100
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        localityLbSetting:
          distribute:
          - from: us-east/*
            to:
              us-east/*: 100
              us-west/*: 0  # <-

[locality-overlap] spec.trafficPolicy.loadBalancer.localityLbSetting.distribute
locality "us-east/zone1" overlaps an earlier one
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        localityLbSetting:
          distribute:  # <-
          - {from: us-east/*, to: {us-east/*: 100}}
          - {from: us-east/zone1, to: {us-east/*: 100}}

[locality-failover-same] spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0]
failover must go from one region to a different one
    host: r.mesh
    trafficPolicy:
      outlierDetection: {consecutive5xxErrors: 5}
      loadBalancer:
        localityLbSetting:
          failover:
          - {from: us-east, to: us-east}  # <-

[locality-failover-zone] spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0]
failover takes regions only
    host: r.mesh
    trafficPolicy:
      outlierDetection: {consecutive5xxErrors: 5}
      loadBalancer:
        localityLbSetting:
          failover:
          - {from: us-east/zone1, to: us-west}  # <-

[locality-failover-priority] spec.trafficPolicy.loadBalancer.localityLbSetting.failoverPriority[0]
cannot be in failoverPriority when "failover" is set
    host: r.mesh
    trafficPolicy:
      outlierDetection: {consecutive5xxErrors: 5}
      loadBalancer:
        localityLbSetting:
          failover: [{from: us-east, to: us-west}]
          failoverPriority: [topology.kubernetes.io/region]  # <-

[lb-warmup-duration-secs] spec.trafficPolicy.loadBalancer.warmupDurationSecs
must be at least 1ms
    host: r.mesh
    trafficPolicy:
      loadBalancer: {simple: ROUND_ROBIN, warmupDurationSecs: 0s}  # <-

[lb-warmup-aggression] spec.trafficPolicy.loadBalancer.warmup.aggression
aggression must be at least 1
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        warmup: {duration: 10s, aggression: 0.5}  # <-

[lb-warmup-duration] spec.trafficPolicy.loadBalancer.warmup
warmup needs a duration
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        warmup: {minimumPercent: 10}  # <-

[tls-mutual-cert] spec.trafficPolicy.tls
MUTUAL TLS needs a clientCertificate
    host: r.mesh
    trafficPolicy:
      tls: {mode: MUTUAL, privateKey: /etc/key.pem}  # <-

[tls-mutual-key] spec.trafficPolicy.tls
MUTUAL TLS needs a privateKey
    host: r.mesh
    trafficPolicy:
      tls: {mode: MUTUAL, clientCertificate: /etc/cert.pem}  # <-

[tls-credential-and-files] spec.trafficPolicy.tls.credentialName
with credentialName, certificates, keys and CRLs come from the credential
    host: r.mesh
    trafficPolicy:
      tls:
        mode: SIMPLE
        credentialName: api-cert  # <-
        caCertificates: /etc/ca.pem

[tls-insecure-with-ca] spec.trafficPolicy.tls
cannot be set with insecureSkipVerify
    host: r.mesh
    trafficPolicy:
      tls: {mode: SIMPLE, insecureSkipVerify: true, caCertificates: /ca.pem}  # <-

[port-policy-no-port] spec.trafficPolicy.portLevelSettings[0]
portLevelSettings entry needs a port
    host: r.mesh
    trafficPolicy:
      portLevelSettings:
      - loadBalancer: {simple: RANDOM}  # <-

[port-policy-empty] spec.trafficPolicy.portLevelSettings[0]
must set a policy besides its port
    host: r.mesh
    trafficPolicy:
      portLevelSettings:
      - port: {number: 80}  # <-

[port-policy-port-range] spec.trafficPolicy.portLevelSettings[0].port.number
port number 70000
    host: r.mesh
    trafficPolicy:
      portLevelSettings:
      - port: {number: 70000}  # <-
        loadBalancer: {simple: RANDOM}

[port-policy-outlier] spec.trafficPolicy.portLevelSettings[0].outlierDetection.maxEjectionPercent
percentage 200
    host: r.mesh
    trafficPolicy:
      portLevelSettings:
      - port: {number: 80}
        outlierDetection: {maxEjectionPercent: 200}  # <-

[subset-policy] spec.subsets[0].trafficPolicy.connectionPool.tcp.maxConnections
maxConnections must not be negative
    host: r.mesh
    subsets:
    - name: v1
      trafficPolicy:
        connectionPool:
          tcp: {maxConnections: -1}  # <-

[tunnel-protocol] spec.trafficPolicy.tunnel.protocol
tunnel protocol must be "CONNECT" or "POST"
    host: r.mesh
    trafficPolicy:
      tunnel: {protocol: GET, targetHost: proxy.mesh, targetPort: 8080}  # <-

[tunnel-host] spec.trafficPolicy.tunnel.targetHost
must be a DNS name or an IP address
    host: r.mesh
    trafficPolicy:
      tunnel: {targetHost: 'bad host', targetPort: 8080}  # <-

[tunnel-port] spec.trafficPolicy.tunnel.targetPort
port number 0
    host: r.mesh
    trafficPolicy:
      tunnel: {targetHost: 10.0.0.1}  # <-

[dr-selector-wildcard] spec.workloadSelector.matchLabels.app
wildcards are not supported in selectors
    host: r.mesh
    workloadSelector:
      matchLabels: {app: '*'}  # <-

[dr-selector-export] spec.exportTo
a DestinationRule with a workloadSelector can only be exported to its namespace
    host: r.mesh
    workloadSelector: {matchLabels: {app: r}}
    exportTo: ['*']  # <-
""",
    ),
    *cases(
        GW,
        """
[gw-no-servers] spec
a Gateway needs at least one server
    selector: {istio: ingressgateway}

[gw-no-hosts] spec.servers[0].hosts
a server needs at least one host
    servers:
    - port: {number: 80, name: http, protocol: HTTP}  # <-

[gw-host-invalid] spec.servers[0].hosts[0]
"bad_host" is not a DNS label
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: [bad_host.example.com]  # <-

[gw-host-short] spec.servers[0].hosts[0]
short names are not allowed here
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: [shop/reviews]  # <-

[gw-host-namespace] spec.servers[0].hosts[0]
invalid namespace "~"
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: ['~/a.example.com']  # <-

[gw-host-partial-wildcard] spec.servers[0].hosts[0]
partial wildcard "*example.com" is not allowed
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: ['shop/*example.com']  # <-

[gw-no-port] spec.servers[0]
a server needs a port
    servers:
    - hosts: ['*']  # <-

[gw-protocol] spec.servers[0].port.protocol
unsupported protocol "SMTP"
    servers:
    - port: {number: 80, name: x, protocol: SMTP}  # <-
      hosts: ['*']

[gw-port-zero] spec.servers[0].port.number
port number 0 must be in the range 1..65535
    servers:
    - port: {number: 0, name: http, protocol: HTTP}  # <-
      hosts: ['*']

[gw-target-port] spec.servers[0].port.targetPort
targetPort has no effect on a Gateway
    servers:
    - port: {number: 80, name: http, protocol: HTTP, targetPort: 8080}  # <-
      hosts: ['*']

[gw-port-name] spec.servers[0].port
the server port needs a name
    servers:
    - port: {number: 80, protocol: HTTP}  # <-
      hosts: ['*']

[gw-unix-port] spec.servers[0].port.number
the port number must be 0 when bind is a unix domain socket
    servers:
    - port: {number: 80, name: http, protocol: HTTP}  # <-
      bind: unix:///var/run/gw.sock
      hosts: ['*']

[gw-bind] spec.servers[0].bind
"localhost" is not a valid IP address
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      bind: localhost  # <-
      hosts: ['*']

[gw-unix-relative] spec.servers[0].bind
"gw.sock" is not an absolute path
    servers:
    - port: {number: 0, name: http, protocol: HTTP}
      bind: unix://gw.sock  # <-
      hosts: ['*']

[gw-https-without-tls] spec.servers[0]
a server with protocol HTTPS needs tls settings
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}  # <-
      hosts: ['*']

[gw-tcp-with-tls] spec.servers[0].tls
a server with protocol TCP cannot have tls settings
    servers:
    - port: {number: 5432, name: tcp, protocol: TCP}
      hosts: ['*']
      tls: {mode: SIMPLE}  # <-

[gw-http-with-tls] spec.servers[0].tls
a plain-text HTTP server can only have tls.httpsRedirect
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: ['*']
      tls: {mode: SIMPLE, credentialName: cert}  # <-

[gw-duplicate-port-name] spec.servers[1].port.name
duplicate port name "http"
    servers:
    - port: {number: 80, name: http, protocol: HTTP}
      hosts: [a.example.com]
    - port: {number: 8080, name: http, protocol: HTTP}  # <-
      hosts: [b.example.com]

[gw-simple-cert] spec.servers[0].tls
SIMPLE TLS needs a serverCertificate
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls: {mode: SIMPLE}  # <-

[gw-mutual-ca] spec.servers[0].tls
MUTUAL TLS needs caCertificates
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls: {mode: MUTUAL, serverCertificate: /c.pem, privateKey: /k.pem}  # <-

[gw-istio-mutual-cert] spec.servers[0].tls.serverCertificate
cannot be set with mode ISTIO_MUTUAL
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: ISTIO_MUTUAL
        serverCertificate: /c.pem  # <-

[gw-two-cert-sources] spec.servers[0].tls
set only one of credentialName, credentialNames
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls: {mode: SIMPLE, credentialName: a, serverCertificate: /c.pem, privateKey: /k.pem}  # <-

[gw-crl-simple] spec.servers[0].tls.caCrl
caCrl is not supported with SIMPLE TLS
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: SIMPLE
        serverCertificate: /c.pem
        privateKey: /k.pem
        caCrl: /crl.pem  # <-

[gw-tls-certificates] spec.servers[0].tls.tlsCertificates[0]
SIMPLE TLS needs a privateKey
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: SIMPLE
        tlsCertificates:
        - {serverCertificate: /c.pem}  # <-
""",
    ),
    *cases(
        SE,
        """
[se-no-hosts] spec.hosts
a ServiceEntry needs at least one host
    ports: [{number: 80, name: http, protocol: HTTP}]

[se-host-star] spec.hosts[0]
host "*" is not allowed in a ServiceEntry
    hosts: ['*']  # <-
    ports: [{number: 80, name: http, protocol: HTTP}]

[se-host-invalid] spec.hosts[0]
is not a DNS label
    hosts: [api.example..com]  # <-
    ports: [{number: 80, name: http, protocol: HTTP}]

[se-selector-and-endpoints] spec.endpoints
"workloadSelector" and "endpoints" cannot be set together
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    workloadSelector: {labels: {app: a}}
    endpoints: [{address: 10.0.0.1}]  # <-
    resolution: STATIC

[se-address] spec.addresses[0]
"10.0.0.300" is not a valid IP address
    hosts: [a.mesh]
    addresses: [10.0.0.300]  # <-
    ports: [{number: 80, name: http, protocol: HTTP}]

[se-cidr-with-dns] spec.addresses
CIDR addresses are only allowed with resolution NONE or STATIC
    hosts: [a.mesh]
    addresses: [10.1.0.0/16]  # <-
    ports: [{number: 80, name: http, protocol: HTTP}]
    resolution: DNS

[se-port-name-duplicate] spec.ports[1].name
duplicate port name "http"
    hosts: [a.mesh]
    ports:
    - {number: 80, name: http, protocol: HTTP}
    - {number: 81, name: http, protocol: HTTP}  # <-

[se-port-number-duplicate] spec.ports[1].number
duplicate port number 80
    hosts: [a.mesh]
    ports:
    - {number: 80, name: http, protocol: HTTP}
    - {number: 80, name: web, protocol: HTTP}  # <-

[se-port-name] spec.ports[0].name
invalid port name "Http_Web"
    hosts: [a.mesh]
    ports: [{number: 80, name: Http_Web, protocol: HTTP}]  # <-

[se-port-protocol] spec.ports[0].protocol
unsupported protocol "SPDY"
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: SPDY}]  # <-

[se-target-port] spec.ports[0].targetPort
port number 70000
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP, targetPort: 70000}]  # <-

[se-none-with-endpoints] spec.endpoints
resolution NONE takes no endpoints
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    resolution: NONE
    endpoints: [{address: 10.0.0.1}]  # <-

[se-static-hostname] spec.endpoints[0].address
endpoint address "db.example.com" is not an IP address (resolution STATIC)
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    resolution: STATIC
    endpoints:
    - address: db.example.com  # <-

[se-unix-two-ports] spec.endpoints[0].address
a unix socket endpoint needs a ServiceEntry with exactly one port
    hosts: [a.mesh]
    ports:
    - {number: 80, name: http, protocol: HTTP}
    - {number: 81, name: web, protocol: HTTP}
    resolution: STATIC
    endpoints:
    - address: unix:///var/run/a.sock  # <-

[se-static-endpoint-port] spec.endpoints[0].ports.grpc
port "grpc" is not a port of the ServiceEntry
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    resolution: STATIC
    endpoints:
    - address: 10.0.0.1
      ports: {grpc: 9090}  # <-

[se-dns-wildcard] spec.hosts[0]
resolution DNS without endpoints resolves the hosts themselves
    hosts: ['*.example.com']  # <-
    ports: [{number: 443, name: tls, protocol: TLS}]
    resolution: DNS

[se-round-robin-endpoints] spec.endpoints
resolution DNS_ROUND_ROBIN takes at most one endpoint
    hosts: [a.example.com]
    ports: [{number: 443, name: tls, protocol: TLS}]
    resolution: DNS_ROUND_ROBIN
    endpoints:  # <-
    - address: a1.example.com
    - address: a2.example.com

[se-dns-endpoint] spec.endpoints[0].address
is not an IP address or a DNS name
    hosts: [a.example.com]
    ports: [{number: 443, name: tls, protocol: TLS}]
    resolution: DNS
    endpoints:
    - address: bad_host.example.com  # <-

[se-dns-endpoint-port] spec.endpoints[0].ports.https
endpoint port "https" is not a port of this ServiceEntry
    hosts: [a.example.com]
    ports: [{number: 443, name: tls, protocol: TLS}]
    resolution: DNS
    endpoints:
    - address: a1.example.com
      ports: {https: 8443}  # <-

[se-hosts-tcp] spec.ports[0].protocol
several hosts on a port that is neither HTTP nor TLS
    hosts: [a.example.com, b.example.com]
    addresses: [10.0.0.1]
    ports: [{number: 5432, name: tcp, protocol: TCP}]  # <-
    resolution: STATIC

[se-export-nobody-and-more] spec.exportTo
exportTo "~" (no one) cannot be combined
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    exportTo: ['~', shop]  # <-
""",
    ),
    *cases(
        WE,
        """
[we-address-required] spec
address is required
    labels: {app: a}

[we-address-invalid] spec.address
address "bad host!" is not an IP address or a DNS name
    address: 'bad host!'  # <-

[we-unix-relative] spec.address
"var/run/a.sock" is not an absolute path
    address: unix://var/run/a.sock  # <-

[we-unix-ports] spec.ports
cannot have ports
    address: unix:///var/run/a.sock
    ports: {http: 8080}  # <-

[we-port-number] spec.ports.http
port number 0
    address: 10.0.0.1
    ports:
      http: 0  # <-

[we-port-name] spec.ports.HTTP_1
invalid port name "HTTP_1"
    address: 10.0.0.1
    ports:
      HTTP_1: 8080  # <-

[we-labels] spec.labels.app
invalid label value "my app"
    address: 10.0.0.1
    labels:
      app: 'my app'  # <-
""",
    ),
    *cases(
        WG,
        """
[wg-template] spec
a WorkloadGroup needs a template
    metadata: {labels: {app: a}}

[wg-metadata-labels] spec.metadata.labels.-app
invalid label key "-app"
    metadata:
      labels: {'-app': a}  # <-
    template: {serviceAccount: a}

[wg-template-port] spec.template.ports.http
port number 70000
    template:
      ports:
        http: 70000  # <-

[wg-probe-method] spec.probe
a probe needs one of httpGet, tcpSocket, exec or grpc
    template: {serviceAccount: a}
    probe: {periodSeconds: 5}  # <-

[wg-probe-negative] spec.probe.periodSeconds
periodSeconds must not be negative
    template: {serviceAccount: a}
    probe:
      periodSeconds: -1  # <-
      tcpSocket: {port: 80}

[wg-probe-http-port] spec.probe.httpGet.port
port number 0
    template: {serviceAccount: a}
    probe:
      httpGet: {port: 0, path: /ready}  # <-

[wg-probe-scheme] spec.probe.httpGet.scheme
httpGet scheme "FTP" must be HTTP or HTTPS
    template: {serviceAccount: a}
    probe:
      httpGet: {port: 80, scheme: FTP}  # <-

[wg-probe-header] spec.probe.httpGet.httpHeaders[0].name
invalid header name "x y"
    template: {serviceAccount: a}
    probe:
      httpGet:
        port: 80
        httpHeaders: [{name: 'x y', value: a}]  # <-

[wg-probe-tcp-port] spec.probe.tcpSocket.port
port number 70000
    template: {serviceAccount: a}
    probe:
      tcpSocket: {port: 70000}  # <-
""",
    ),
    *cases(
        SC,
        """
[sc-empty] spec
a Sidecar needs at least one of ingress, egress
    workloadSelector: {labels: {app: a}}

[sc-selector-wildcard] spec.workloadSelector.labels.*
wildcards are not supported in selectors
    workloadSelector:
      labels: {'*': a}  # <-
    egress: [{hosts: [./*]}]

[sc-ingress-no-port] spec.ingress[0]
an ingress listener needs a port
    ingress:
    - defaultEndpoint: 127.0.0.1:8080  # <-

[sc-ingress-protocol] spec.ingress[0].port.protocol
unsupported protocol "QUIC"
    ingress:
    - port: {number: 9080, name: http, protocol: QUIC}  # <-

[sc-ingress-port-name] spec.ingress[0].port.name
invalid port name "Http_1"
    ingress:
    - port: {number: 9080, name: Http_1, protocol: HTTP}  # <-

[sc-ingress-target-port] spec.ingress[0].port.targetPort
targetPort has no effect on a Sidecar
    ingress:
    - port: {number: 9080, protocol: HTTP, targetPort: 8080}  # <-

[sc-ingress-bind] spec.ingress[0].bind
"eth0" is not a valid IP address
    ingress:
    - port: {number: 9080, protocol: HTTP}
      bind: eth0  # <-

[sc-ingress-duplicate-port] spec.ingress[1].port.number
port 9080 is used by another ingress listener
    ingress:
    - port: {number: 9080, protocol: HTTP}
    - port: {number: 9080, protocol: TCP}  # <-

[sc-default-endpoint-host] spec.ingress[0].defaultEndpoint
must be 127.0.0.1:PORT, 0.0.0.0:PORT
    ingress:
    - port: {number: 9080, protocol: HTTP}
      defaultEndpoint: 10.0.0.5:8080  # <-

[sc-default-endpoint-no-port] spec.ingress[0].defaultEndpoint
must be HOST:PORT or unix://PATH
    ingress:
    - port: {number: 9080, protocol: HTTP}
      defaultEndpoint: 127.0.0.1  # <-

[sc-default-endpoint-port] spec.ingress[0].defaultEndpoint
the port "http" is not a number
    ingress:
    - port: {number: 9080, protocol: HTTP}
      defaultEndpoint: 127.0.0.1:http  # <-

[sc-default-endpoint-unix] spec.ingress[0].defaultEndpoint
"app.sock" is not an absolute path
    ingress:
    - port: {number: 9080, protocol: HTTP}
      defaultEndpoint: unix://app.sock  # <-

[sc-ingress-tls-mode] spec.ingress[0].tls.mode
mode ISTIO_MUTUAL is not supported on a Sidecar ingress
    ingress:
    - port: {number: 9443, protocol: HTTPS}
      tls: {mode: ISTIO_MUTUAL}  # <-

[sc-ingress-tls-credential] spec.ingress[0].tls.credentialName
credentialName is not supported on a Sidecar ingress
    ingress:
    - port: {number: 9443, protocol: HTTPS}
      tls:
        mode: SIMPLE
        credentialName: cert  # <-

[sc-ingress-tls-cert] spec.ingress[0].tls
SIMPLE TLS needs a serverCertificate
    ingress:
    - port: {number: 9443, protocol: HTTPS}
      tls: {mode: SIMPLE, privateKey: /k.pem}  # <-

[sc-egress-no-hosts] spec.egress[0].hosts
an egress listener needs at least one host
    egress:
    - port: {number: 80, protocol: HTTP}  # <-

[sc-egress-host-form] spec.egress[0].hosts[0]
must be of the form namespace/dnsName
    egress:
    - hosts: [api.example.com]  # <-

[sc-egress-namespace] spec.egress[0].hosts[0]
invalid namespace "shop_ns"
    egress:
    - hosts: [shop_ns/api.example.com]  # <-

[sc-egress-short-name] spec.egress[0].hosts[0]
short names are not allowed here
    egress:
    - hosts: [./reviews]  # <-

[sc-egress-two-catch-alls] spec.egress[0]
only the last egress listener can leave out the port
    egress:
    - hosts: [./*]  # <-
    - hosts: [istio-system/*]

[sc-egress-catch-all-last] spec.egress[0]
only the last egress listener can leave out the port
    egress:
    - hosts: [./*]  # <-
    - port: {number: 80, protocol: HTTP}
      hosts: [./*]

[sc-egress-duplicate-port] spec.egress[1].port.number
port 80 is used by another egress listener
    egress:
    - port: {number: 80, protocol: HTTP}
      hosts: [./*]
    - port: {number: 80, protocol: TCP}  # <-
      hosts: [./*]

[sc-egress-unix-bind] spec.egress[0].bind
an egress listener with port 0 needs a unix:// bind address
    egress:
    - port: {number: 0, protocol: HTTP}
      bind: 127.0.0.1  # <-
      hosts: [./*]

[sc-egress-unix-capture] spec.egress[0].captureMode
needs captureMode DEFAULT or NONE
    egress:
    - port: {number: 0, protocol: HTTP}
      bind: unix:///run/a.sock
      captureMode: IPTABLES  # <-
      hosts: [./*]

[sc-egress-unix-duplicate] spec.egress[1].bind
unix domain socket "unix:///run/a.sock" is used by another egress listener
    egress:
    - port: {number: 0, protocol: HTTP}
      bind: unix:///run/a.sock
      hosts: [./*]
    - port: {number: 0, protocol: TCP}
      bind: unix:///run/a.sock  # <-
      hosts: [./*]

[sc-egress-proxy-mode] spec.outboundTrafficPolicy.egressProxy
egressProxy only applies with mode ALLOW_ANY
    outboundTrafficPolicy:
      mode: REGISTRY_ONLY
      egressProxy: {host: proxy.mesh, port: {number: 3128}}  # <-

[sc-egress-proxy-port] spec.outboundTrafficPolicy.egressProxy
egressProxy needs a port
    outboundTrafficPolicy:
      mode: ALLOW_ANY
      egressProxy: {host: proxy.mesh}  # <-

[sc-egress-proxy-host] spec.outboundTrafficPolicy.egressProxy.host
is not a DNS label
    outboundTrafficPolicy:
      mode: ALLOW_ANY
      egressProxy: {host: '*.mesh', port: {number: 3128}}  # <-

[sc-inbound-pool] spec.inboundConnectionPool.http.maxRetries
maxRetries must not be negative
    inboundConnectionPool:
      http: {maxRetries: -1}  # <-
""",
    ),
]

WARNINGS = [
    *cases(
        VS,
        """
[vs-legacy-gateway-name] spec.gateways[0]
legacy gateway name "gw.shop": prefer "shop/gw"
    hosts: [r.shop.mesh]
    gateways: [gw.shop]  # <-
    http: [{route: [{destination: {host: a.mesh}}]}]

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

[tls-sni-ip] spec.tls[0].match[0].sniHosts[0]
SNI host "10.0.0.1" is an IP address
    hosts: [r.shop.mesh]
    tls:
    - match: [{sniHosts: [10.0.0.1]}]  # <-
      route: [{destination: {host: a.mesh}}]

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
    *cases(
        DR,
        """
[outlier-deprecated] spec.trafficPolicy.outlierDetection.consecutiveErrors
consecutiveErrors is deprecated
    host: r.mesh
    trafficPolicy:
      outlierDetection: {consecutiveErrors: 5}  # <-

[lb-ring-size-deprecated] spec.trafficPolicy.loadBalancer.consistentHash.minimumRingSize
minimumRingSize is deprecated
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        consistentHash: {useSourceIp: true, minimumRingSize: 64}  # <-

[locality-failover-without-outlier] spec.trafficPolicy.loadBalancer.localityLbSetting
failover only happens with outlierDetection
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        localityLbSetting:  # <-
          failover: [{from: us-east, to: us-west}]

[tls-istio-mutual-files] spec.trafficPolicy.tls.clientCertificate
is ignored: ISTIO_MUTUAL uses the mesh's certificates
    host: r.mesh
    trafficPolicy:
      tls:
        mode: ISTIO_MUTUAL
        clientCertificate: /c.pem  # <-
""",
    ),
    *cases(
        GW,
        """
[gw-https-redirect-on-https] spec.servers[0].tls.httpsRedirect
httpsRedirect only applies to HTTP servers
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls: {mode: SIMPLE, credentialName: cert, httpsRedirect: true}  # <-

[gw-passthrough-certs] spec.servers[0].tls
mode PASSTHROUGH does not terminate TLS
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls: {mode: PASSTHROUGH, serverCertificate: /c.pem}  # <-

[gw-old-tls] spec.servers[0].tls.minProtocolVersion
TLSV1_1 needs cipherSuites set
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: SIMPLE
        credentialName: cert
        minProtocolVersion: TLSV1_1  # <-

[gw-cipher-unknown] spec.servers[0].tls.cipherSuites[1]
unknown cipher suite "ROT13-SHA" is ignored
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: SIMPLE
        credentialName: cert
        cipherSuites: [AES128-SHA, ROT13-SHA]  # <-

[gw-cipher-duplicate] spec.servers[0].tls.cipherSuites[1]
duplicate cipher suite "AES128-SHA"
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: ['*']
      tls:
        mode: SIMPLE
        credentialName: cert
        cipherSuites: [AES128-SHA, AES128-SHA]  # <-

[gw-shared-plain-port] spec.servers[1].port.number
server #1 is ignored: port 8080 is already served by server #0 (HTTP)
    servers:
    - port: {number: 8080, name: http, protocol: HTTP}
      hosts: ['*']
    - port: {number: 8080, name: tcp, protocol: TCP}  # <-
      hosts: ['*']
""",
    ),
    *cases(
        SE,
        """
[se-none-selector] spec.workloadSelector
workloadSelector has no effect with resolution NONE
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    workloadSelector: {labels: {app: a}}  # <-

[se-tcp-no-address] spec.ports[0].protocol
carries TCP (or an unset protocol) and the entry has no addresses
    hosts: [db.mesh]
    ports: [{number: 5432, name: tcp-db, protocol: TCP}]  # <-
    resolution: DNS
""",
    ),
    *cases(
        WE,
        """
[we-network-without-address] spec
reached through the gateway of network "vpc-2"
    network: vpc-2
    labels: {app: a}
""",
    ),
    *cases(
        WG,
        """
[wg-template-address] spec.template.address
address is ignored
    template:
      address: 10.0.0.1  # <-
""",
    ),
    *cases(
        SC,
        """
[sc-egress-duplicate-host] spec.egress[0].hosts[1]
duplicate egress host "./api.example.com"
    egress:
    - hosts:
      - ./*
      - ./api.example.com  # <-

[sc-egress-star-star] spec.egress[0].hosts
"*/*" selects every host
    egress:
    - hosts:  # <-
      - '*/*'
      - istio-system/*

[sc-ingress-http-pool-on-tcp] spec.ingress[0].connectionPool.http
port 5432 is not HTTP (TCP): only the tcp settings apply
    ingress:
    - port: {number: 5432, protocol: TCP}
      connectionPool:
        http: {maxRetries: 3}  # <-
""",
    ),
]

VALID = [
    pytest.param(
        VS,
        """
        hosts: [reviews.shop.mesh, 10.0.0.9, "*.reviews.shop.mesh"]
        http:
        - name: jason
          match:
          - uri: {prefix: ""}
            headers: {end-user: {exact: jason}}
            withoutHeaders: {x-debug: {regex: "*"}}
            queryParams: {v: {regex: "^[0-9]+$"}}
          route:
          - destination: {host: reviews.shop.mesh, subset: v2, port: {number: 9080}}
            weight: 0
          - destination: {host: reviews.shop.mesh, subset: v3}
            weight: 100
            headers: {request: {set: {Host: reviews.example.com}}, response: {add: {x-served-by: "%HOSTNAME% 100%%"}}}
          retries: {attempts: 3, perTryTimeout: 0.5s, retryOn: "5xx,503,reset,unavailable"}
          timeout: 10s
          corsPolicy:
            allowOrigins: [{exact: "https://shop.example.com"}, {regex: "https://.*\\\\.example\\\\.com"}]
            allowMethods: [GET, POST]
            allowHeaders: ["*", x-request-id]
            maxAge: 24h
          fault:
            delay: {fixedDelay: 5s, percentage: {value: 0.0001}}
            abort: {grpcStatus: UNAVAILABLE, percentage: {value: 0}}
          mirror: {host: mirror.shop.mesh}
          mirrorPercentage: {value: 100}
          headers: {request: {add: {x-id: "%REQ(x-request-id)%"}, remove: [x-internal]}}
        - match: [{uri: {exact: /legacy}}]
          redirect: {uri: /v2, redirectCode: 308, scheme: https, port: 8443}
        - match: [{uri: {prefix: /health}}]
          directResponse: {status: 200, body: {string: ok}}
        - match: [{uri: {prefix: /v1}}]
          rewrite: {uriRegexRewrite: {match: "^/v1/(.*)", rewrite: "/v2/\\\\1"}}
          route: [{destination: {host: reviews.shop.mesh}}]
        - route: [{destination: {host: reviews.shop.mesh}}]
        exportTo: [".", istio-system]
        """,
        id="virtual-service",
    ),
    pytest.param(
        VS,
        """
        hosts: ["*.example.com"]
        gateways: [shop/edge]
        tls:
        - match: [{sniHosts: [api.shop.example.com], port: 443, destinationSubnets: [10.0.0.0/8]}]
          route: [{destination: {host: api.shop.mesh}}]
        http:
        - match: [{headers: {"@request.auth.claims.group": {exact: admin}}, sourceLabels: {app: web}, gateways: [mesh]}]
          route: [{destination: {host: admin.shop.mesh}}]
        - route: [{destination: {host: web.shop.mesh}}]
        """,
        id="virtual-service-gateway",
    ),
    pytest.param(
        VS,
        """
        hosts: [db.shop.mesh]
        tcp:
        - match: [{port: 5432, sourceLabels: {app: api}}]
          route: [{destination: {host: db.shop.mesh}, weight: 80}, {destination: {host: replica.shop.mesh}, weight: 20}]
        - route: [{destination: {host: db.shop.mesh}}]
        """,
        id="virtual-service-tcp",
    ),
    pytest.param(
        VS,
        """
        http:
        - match: [{uri: {prefix: /reviews}}]
          route: [{destination: {host: reviews.shop.mesh}}]
        """,
        id="delegate",
    ),
    pytest.param(
        VS,
        """
        hosts: [shop.example.com]
        http:
        - match: [{uri: {prefix: /reviews}}]
          delegate: {name: reviews, namespace: shop}
        """,
        id="delegating-root",
    ),
    pytest.param(
        DR,
        """
        host: "*.shop.mesh"
        trafficPolicy:
          loadBalancer:
            consistentHash: {httpCookie: {name: session, ttl: 0s}, maglev: {tableSize: 65537}}
            localityLbSetting:
              distribute:
              - {from: us-east/zone1/*, to: {us-east/zone1/*: 80, us-east/zone2/*: 20}}
              - {from: us-west/*, to: {us-west/*: 100}}
            warmup: {duration: 30s, minimumPercent: 10, aggression: 2}
          connectionPool:
            tcp:
              maxConnections: 100
              connectTimeout: 30ms
              idleTimeout: 0s
              tcpKeepalive: {time: 7200s, interval: 75s}
            http: {http1MaxPendingRequests: 0, maxRetries: 3, idleTimeout: 1h, h2UpgradePolicy: UPGRADE}
          outlierDetection:
            consecutive5xxErrors: 7
            interval: 5m
            baseEjectionTime: 15m
            maxEjectionPercent: 100
            minHealthPercent: 0
            splitExternalLocalOriginErrors: true
            consecutiveLocalOriginFailures: 3
          tls: {mode: MUTUAL, credentialName: client-cert, sni: reviews.example.com}
          portLevelSettings:
          - port: {number: 9080}
            tls: {mode: MUTUAL, clientCertificate: /etc/c.pem, privateKey: /etc/k.pem, caCertificates: /etc/ca.pem}
          - port: {number: 9443}
            loadBalancer:
              localityLbSetting: {failover: [{from: us-east, to: us-west}]}
            outlierDetection: {consecutiveGatewayErrors: 3}
        subsets:
        - {name: v1, labels: {version: v1, app.kubernetes.io/name: reviews}}
        - name: v2
          labels: {version: v2}
          trafficPolicy: {tunnel: {protocol: CONNECT, targetHost: 10.0.0.1, targetPort: 8080}}
        exportTo: ["."]
        """,
        id="destination-rule",
    ),
    pytest.param(
        DR,
        """
        host: reviews
        workloadSelector: {matchLabels: {app: gateway}}
        trafficPolicy: {tls: {mode: SIMPLE, insecureSkipVerify: true}}
        exportTo: ["."]
        """,
        id="destination-rule-selector",
    ),
    pytest.param(
        GW,
        """
        selector: {istio: ingressgateway}
        servers:
        - port: {number: 80, name: http, protocol: HTTP}
          hosts: ["shop/shop.example.com", "./*.example.com", "*/api.example.com", "10.0.0.1"]
          tls: {httpsRedirect: true}
        - port: {number: 80, name: http-admin, protocol: HTTP2}
          hosts: [admin.example.com]
        - port: {number: 443, name: https, protocol: HTTPS}
          hosts: [shop.example.com]
          tls:
            mode: SIMPLE
            credentialName: shop-cert
            minProtocolVersion: TLSV1_2
            cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256, "-AES128-SHA"]
        - port: {number: 443, name: https-api, protocol: HTTPS}
          hosts: [api.example.com]
          tls:
            mode: MUTUAL
            serverCertificate: /etc/c.pem
            privateKey: /etc/k.pem
            caCertificates: /etc/ca.pem
            caCrl: /etc/crl.pem
        - port: {number: 443, name: tls-passthrough, protocol: TLS}
          hosts: [db.example.com]
          tls: {mode: PASSTHROUGH}
        - port: {number: 15443, name: tls-mesh, protocol: TLS}
          hosts: ["*.local"]
          tls:
            mode: OPTIONAL_MUTUAL
            caCertificates: /etc/ca.pem
            tlsCertificates:
            - {serverCertificate: /etc/rsa.pem, privateKey: /etc/rsa.key}
            - {serverCertificate: /etc/ec.pem, privateKey: /etc/ec.key}
        - port: {number: 0, name: uds, protocol: HTTP}
          bind: unix:///var/run/gateway.sock
          hosts: ["*"]
        - port: {number: 8443, name: istio-mtls, protocol: HTTPS}
          bind: 10.0.0.2
          hosts: ["*"]
          tls: {mode: ISTIO_MUTUAL}
        """,
        id="gateway",
    ),
    pytest.param(
        SE,
        """
        hosts: [api.example.com, "*.api.example.com"]
        addresses: [10.10.0.0/16, "2001:db8::/32", 192.168.0.1]
        ports:
        - {number: 443, name: https, protocol: HTTPS, targetPort: 8443}
        - {number: 80, name: http, protocol: http}
        location: MESH_EXTERNAL
        resolution: STATIC
        endpoints:
        - {address: 10.10.0.1, ports: {https: 9443}, labels: {zone: a}, weight: 3}
        - {address: "2001:db8::1"}
        exportTo: ["~"]
        """,
        id="service-entry-static",
    ),
    pytest.param(
        SE,
        """
        hosts: [db.shop.mesh]
        addresses: [10.20.0.1]
        ports: [{number: 5432, name: tcp-postgres, protocol: TCP}]
        resolution: DNS_ROUND_ROBIN
        endpoints: [{address: db.internal.example.com, ports: {tcp-postgres: 6432}}]
        """,
        id="service-entry-dns",
    ),
    pytest.param(
        SE,
        """
        hosts: [local.shop.mesh]
        ports: [{number: 8080, name: http, protocol: HTTP}]
        resolution: STATIC
        endpoints: [{address: "unix:///var/run/app.sock"}]
        """,
        id="service-entry-unix",
    ),
    pytest.param(
        SE,
        """
        hosts: [payments.shop.mesh]
        ports: [{number: 443, name: grpc, protocol: GRPC}]
        resolution: STATIC
        workloadSelector: {labels: {app: payments}}
        """,
        id="service-entry-selector",
    ),
    pytest.param(
        SE,
        """
        hosts: ["*.googleapis.com", "*.gstatic.com"]
        ports: [{number: 443, name: tls, protocol: TLS}]
        resolution: NONE
        """,
        id="service-entry-none",
    ),
    pytest.param(
        WE,
        """
        address: reviews-1.vm.example.com
        ports: {http: 9080, grpc-admin: 15000}
        labels: {app: reviews, version: v1, example.com/team: books}
        serviceAccount: reviews
        network: vpc-1
        locality: us-east/zone1
        weight: 10
        """,
        id="workload-entry",
    ),
    pytest.param(WE, "address: unix://@abstract-socket\n", id="workload-entry-abstract-socket"),
    pytest.param(
        WG,
        """
        metadata: {labels: {app: reviews}, annotations: {owner: books}}
        template: {serviceAccount: reviews, ports: {http: 9080}, network: vpc-1}
        probe:
          initialDelaySeconds: 5
          periodSeconds: 10
          httpGet: {port: 9080, path: /ready, scheme: HTTPS, httpHeaders: [{name: x-probe, value: "1"}]}
        """,
        id="workload-group",
    ),
    pytest.param(
        WG, "template: {serviceAccount: a}\nprobe: {exec: {command: [/bin/ready]}}\n", id="workload-group-exec"
    ),
    pytest.param(
        SC,
        """
        workloadSelector: {labels: {app: reviews}}
        ingress:
        - port: {number: 9080, name: http, protocol: HTTP}
          defaultEndpoint: 127.0.0.1:8080
          connectionPool: {http: {maxRetries: 3}}
        - port: {number: 9443, protocol: HTTPS}
          defaultEndpoint: "[::1]:8443"
          tls: {mode: SIMPLE, serverCertificate: /etc/c.pem, privateKey: /etc/k.pem}
        - port: {number: 9090, protocol: GRPC}
          bind: 0.0.0.0
          defaultEndpoint: unix:///var/run/app.sock
        - port: {number: 9091, protocol: TCP}
          defaultEndpoint: ":9091"
        egress:
        - port: {number: 3306, protocol: MYSQL, name: mysql}
          bind: 127.0.0.1
          hosts: ["*/mysql.shop.mesh"]
        - port: {number: 0, protocol: HTTP}
          bind: unix:///var/run/egress.sock
          captureMode: NONE
          hosts: ["~/*"]
        - hosts: ["./*", "istio-system/*", "*/api.example.com"]
        inboundConnectionPool: {tcp: {maxConnections: 1000}}
        outboundTrafficPolicy:
          mode: ALLOW_ANY
          egressProxy: {host: proxy.shop.mesh, port: {number: 3128}}
        """,
        id="sidecar",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "field", "message"), ERRORS)
def test_broken_rule_is_an_error_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.ERROR
    assert found[0].line == marked_line(text), str(found[0])
    assert not load_text(text, "rules.yaml").ok


@pytest.mark.parametrize(("kind", "spec", "field", "message"), WARNINGS)
def test_questionable_config_is_a_warning_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.WARNING
    assert found[0].line == marked_line(text), str(found[0])
    assert load_text(text, "rules.yaml").ok, "a warning alone must not reject the file"


@pytest.mark.parametrize(("kind", "spec"), VALID)
def test_valid_config_has_no_findings(kind: str, spec: str) -> None:
    _, findings = load(kind, spec)
    assert findings == [], "\n".join(map(str, findings))


def test_finding_names_file_line_resource_and_field() -> None:
    text = document(VS, "hosts: [r.shop.mesh]\nhttp:\n- route:\n  - destination: {host: r.shop.mesh}\n    weight: -5\n")
    (finding,) = load_text(text, "shop/reviews.yaml").findings
    assert str(finding) == (
        "error shop/reviews.yaml:11:7 VirtualService shop/example spec.http[0].route[0].weight: "
        "weight -5 must not be negative"
    )


def test_every_problem_in_a_resource_is_reported_at_once() -> None:
    _, findings = load(
        SE, "hosts: ['*']\nports: [{number: 0, name: Bad_Name, protocol: SPDY}]\nresolution: DNS_ROUND_ROBIN"
    )
    assert {f.field for f in findings} >= {
        "spec.hosts[0]",
        "spec.ports[0].number",
        "spec.ports[0].name",
        "spec.ports[0].protocol",
    }


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        (DR, "host: r.mesh\ntrafficPolicy: {}", "trafficPolicy must set at least one field"),
        (SC, "workloadSelector: {labels: {}}\negress: [{hosts: [./*]}]", "workload selector has no labels"),
    ],
)
def test_an_empty_mapping_counts_as_set(kind: str, spec: str, message: str) -> None:
    _, findings = load(kind, spec)
    assert [message in f.message for f in findings] == [True]


def test_a_large_direct_response_body_is_a_warning() -> None:
    body = "x" * 110_000
    spec = f"hosts: [r.shop.mesh]\nhttp:\n- directResponse:\n    status: 200\n    body:\n      string: {body}\n"
    _, findings = load(VS, spec)
    (finding,) = findings
    assert (finding.severity, finding.field, finding.line) == (Severity.WARNING, "spec.http[0].directResponse.body", 11)
    assert "the body is over 100KB" in finding.message
