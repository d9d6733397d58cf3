"""VirtualService rules as `istioctl validate` enforces them, seen the way a user sees them: hosts,
gateways, delegation, destinations and weights, TLS and TCP routes, exportTo. What an HTTP route
may do is in test_validation_virtual_service_http.py.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import VS, cases, rule_case_tests

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

[export-dot-and-own-namespace] spec.exportTo[1]
duplicate exportTo entry "shop": "." already exports to this namespace
    hosts: [r.shop.mesh]
    http:
    - route: [{destination: {host: r.shop.mesh}}]
    exportTo: [., shop]  # <-

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

[tls-sni-ip] spec.tls[0].match[0].sniHosts[0]
SNI host "10.0.0.1" is an IP address
    hosts: [r.shop.mesh]
    tls:
    - match: [{sniHosts: [10.0.0.1]}]  # <-
      route: [{destination: {host: a.mesh}}]
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
]


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
