"""ServiceEntry rules as `istioctl validate` enforces them, seen the way a user sees them.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import SE, cases, rule_case_tests

ERRORS = [
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
        SE,
        """
[se-endpoint-service-account] spec.endpoints[0].serviceAccount
"team/a" is not a valid service account name
    hosts: [a.mesh]
    ports: [{number: 80, name: http, protocol: HTTP}]
    resolution: STATIC
    endpoints:
    - address: 10.0.0.1
      serviceAccount: team/a  # <-
""",
    ),
]

WARNINGS = [
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
]

VALID = [
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
]


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
