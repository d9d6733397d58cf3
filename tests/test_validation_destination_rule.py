"""DestinationRule rules as `istioctl validate` enforces them, seen the way a user sees them.

Each case is in the format `cases` reads (tests/conftest.py): a line marked `# <-` is where the
finding must point (unmarked: the `spec:` line); the finding must name the field and say what
is wrong.
"""

from __future__ import annotations

import pytest
from conftest import DR, cases, rule_case_tests

ERRORS = [
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

[dr-selector-export] spec.exportTo[0]
a DestinationRule with a workloadSelector can only be exported to its namespace
    host: r.mesh
    workloadSelector: {matchLabels: {app: r}}
    exportTo: ['*']  # <-

[dr-selector-export-other-namespace] spec.exportTo[0]
a DestinationRule with a workloadSelector can only be exported to its namespace, not "web"
    host: r.mesh
    workloadSelector: {matchLabels: {app: r}}
    exportTo: [web]  # <-
""",
    ),
    # Durations Envoy cannot hold: it takes every duration in int64 nanoseconds, and keepalive
    # times in 32-bit seconds.
    *cases(
        DR,
        """
[dr-connect-timeout-beyond-envoy] spec.trafficPolicy.connectionPool.tcp.connectTimeout
duration "99999999999999h" is longer than Envoy can hold
    host: r.mesh
    trafficPolicy:
      connectionPool:
        tcp:
          connectTimeout: 99999999999999h  # <-

[dr-outlier-interval-beyond-envoy] spec.trafficPolicy.outlierDetection.interval
duration "9223372036s" is longer than Envoy can hold
    host: r.mesh
    trafficPolicy:
      outlierDetection:
        interval: 9223372036s  # <-

[dr-ring-size-beyond-envoy] spec.trafficPolicy.loadBalancer.consistentHash.ringHash.minimumRingSize
minimumRingSize 9000000 is more than Envoy takes (at most 8388608)
    host: r.mesh
    trafficPolicy:
      loadBalancer:
        consistentHash:
          httpHeaderName: x-user
          ringHash:
            minimumRingSize: 9000000  # <-

[dr-keepalive-beyond-32-bits] spec.trafficPolicy.connectionPool.tcp.tcpKeepalive.time
tcpKeepalive.time of 4294967296s is longer than Envoy can hold here
    host: r.mesh
    trafficPolicy:
      connectionPool:
        tcp:
          tcpKeepalive:
            time: 4294967296s  # <-
""",
    ),
]

WARNINGS = [
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
]

VALID = [
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
]


# The three checks of every kind's cases (`conftest.rule_case_tests`).
(
    test_broken_rule_is_an_error_at_its_field,
    test_questionable_config_is_a_warning_at_its_field,
    test_valid_config_has_no_findings,
) = rule_case_tests(errors=ERRORS, warnings=WARNINGS, valid=VALID)
