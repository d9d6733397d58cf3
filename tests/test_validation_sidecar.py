"""Sidecar rules as `istioctl validate` enforces them, seen the way a user sees them.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import SC, cases, rule_case_tests

ERRORS = [
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
        SC,
        """
[sc-egress-duplicate-host] spec.egress[0].hosts[1]
duplicate egress host "./api.example.com"
    egress:
    - hosts:
      - ./*
      - ./api.example.com  # <-

[sc-egress-duplicate-own-namespace] spec.egress[0].hosts[1]
duplicate egress host "shop/api.example.com": "./" and "shop/" are the same namespace here
    egress:
    - hosts:
      - ./api.example.com
      - shop/api.example.com  # <-

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


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
