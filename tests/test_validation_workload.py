"""WorkloadEntry and WorkloadGroup rules as `istioctl validate` enforces them, seen the way a user
sees them.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import WE, WG, cases, rule_case_tests

ERRORS = [
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

[wg-probe-exec] spec.probe.exec
exec probes cannot run: each VM's Envoy checks its health, and Envoy runs only httpGet, tcpSocket and grpc probes
    template: {serviceAccount: a}
    probe:
      exec: {command: [/bin/ready]}  # <-

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
        WE,
        f"""
[we-unix-path-too-long] spec.address
is longer than Envoy takes (107 bytes)
    address: unix:///run/{"s" * 110}.sock  # <-
""",
    ),
    # A service account is the last segment of a SPIFFE URI: a Kubernetes name, no "/" (Envoy
    # and the CA would take `payments/admin` as another path).
    *cases(
        WE,
        """
[we-service-account-slash] spec.serviceAccount
"payments/admin" is not a valid service account name
    address: 10.0.0.1
    serviceAccount: payments/admin  # <-

[we-service-account-uppercase] spec.serviceAccount
"Payments" is not a valid service account name
    address: 10.0.0.1
    serviceAccount: Payments  # <-
""",
    ),
    *cases(
        WG,
        """
[wg-template-service-account] spec.template.serviceAccount
"a/b" is not a valid service account name
    metadata: {labels: {app: a}}
    template:
      serviceAccount: a/b  # <-
""",
    ),
]

WARNINGS = [
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
]

VALID = [
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
]


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
