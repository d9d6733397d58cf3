"""Gateway rules as `istioctl validate` enforces them, seen the way a user sees them.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import GW, cases, rule_case_tests

ERRORS = [
    *cases(
        GW,
        """
[gw-no-servers] spec
a Gateway needs at least one server
    selector: {istio: ingressgateway}

[gw-certificate-hash-not-sha256] spec.servers[0].tls.verifyCertificateHash[0]
"abc" is not a hex SHA-256 of a certificate
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: [shop.example.com]
      tls:
        mode: MUTUAL
        serverCertificate: /etc/certs/cert.pem
        privateKey: /etc/certs/key.pem
        caCertificates: /etc/certs/ca.pem
        verifyCertificateHash: [abc]  # <-

[gw-certificate-spki-not-sha256] spec.servers[0].tls.verifyCertificateSpki[0]
is not a base64 SHA-256 of a public key
    servers:
    - port: {number: 443, name: https, protocol: HTTPS}
      hosts: [shop.example.com]
      tls:
        mode: MUTUAL
        serverCertificate: /etc/certs/cert.pem
        privateKey: /etc/certs/key.pem
        caCertificates: /etc/certs/ca.pem
        verifyCertificateSpki: ["c2hh"]  # <-

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
]

WARNINGS = [
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
]

VALID = [
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
]


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
