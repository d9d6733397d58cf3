"""Analysis of the security policies: selectors that select nothing (IST0127) and identity
rules where no selected workload receives mutual TLS (MC0004)."""

from __future__ import annotations

from meshctl.config.analysis import analyze
from meshctl.testing.builders import configs_from_yaml

WORKLOADS = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: payments, namespace: shop}
spec: {address: 10.0.0.1, labels: {app: payments, security.istio.io/tlsMode: istio}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: legacy, namespace: shop}
spec: {address: 10.0.0.2, labels: {app: legacy}}
"""


def policy(kind: str, namespace: str, spec: str, name: str = "p") -> str:
    header = f"---\napiVersion: security.istio.io/v1\nkind: {kind}\n"
    return header + f"metadata: {{name: {name}, namespace: {namespace}}}\nspec: {spec}\n"


def codes(yaml: str) -> list[tuple[str, str]]:
    return [(i.code, i.key.name) for i in analyze(configs_from_yaml(WORKLOADS + yaml))]


FROM_FRONTEND = (
    "{action: ALLOW, selector: {matchLabels: {app: %s}},"
    ' rules: [{from: [{source: {principals: ["cluster.local/ns/shop/sa/frontend"]}}]}]}'
)


def test_a_policy_selecting_no_workload_is_ist0127_and_root_namespace_policies_reach_every_namespace() -> None:
    for kind in ("AuthorizationPolicy", "RequestAuthentication", "PeerAuthentication"):
        assert ("IST0127", "p") in codes(policy(kind, "shop", "{selector: {matchLabels: {app: nothing}}}"))
        assert ("IST0127", "p") not in codes(policy(kind, "shop", "{selector: {matchLabels: {app: payments}}}"))
        # From the root namespace a selector selects across namespaces.
        assert ("IST0127", "p") not in codes(policy(kind, "istio-system", "{selector: {matchLabels: {app: payments}}}"))
        assert ("IST0127", "p") in codes(policy(kind, "other", "{selector: {matchLabels: {app: payments}}}"))


def test_an_identity_rule_where_no_workload_gets_mutual_tls_is_mc0004() -> None:
    found = analyze(configs_from_yaml(WORKLOADS + policy("AuthorizationPolicy", "shop", FROM_FRONTEND % "legacy")))
    (issue,) = [i for i in found if i.code == "MC0004"]
    assert issue.path == ("spec", "rules", 0, "from", 0, "source", "principals")
    assert "shop/legacy (not labelled security.istio.io/tlsMode: istio" in issue.message
    assert "lets no one in" in issue.message
    # The labelled workload receives mutual TLS: the rule can match.
    assert ("MC0004", "p") not in codes(policy("AuthorizationPolicy", "shop", FROM_FRONTEND % "payments"))
    # ...unless its PeerAuthentication DISABLEs it.
    disabled = policy("PeerAuthentication", "shop", "{mtls: {mode: DISABLE}}", name="off")
    assert ("MC0004", "p") in codes(policy("AuthorizationPolicy", "shop", FROM_FRONTEND % "payments") + disabled)
    # Rules on other attributes are fine without mutual TLS.
    paths = '{selector: {matchLabels: {app: legacy}}, rules: [{to: [{operation: {paths: ["/x"]}}]}]}'
    assert ("MC0004", "p") not in codes(policy("AuthorizationPolicy", "shop", paths))
    when = (
        "{action: DENY, selector: {matchLabels: {app: legacy}},"
        " rules: [{when: [{key: source.namespace, values: [dev]}]}]}"
    )
    assert ("MC0004", "p") in codes(policy("AuthorizationPolicy", "shop", when))


PAYMENTS_SERVICE = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP, targetPort: 8080}]
  workloadSelector: {labels: {app: payments}}
"""
PAYMENTS_INGRESS = """---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: payments, namespace: shop}
spec:
  workloadSelector: {labels: {app: payments}}
  ingress:
  - port: {number: 8080, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:18080
"""


def test_a_policy_on_a_workload_whose_port_bypasses_its_proxy_is_mc0005() -> None:
    """Without iptables, a port no Sidecar ingress listener takes reaches the app directly: a
    policy selecting that workload is not enforced there (fail open), so validate says so."""
    deny = policy(
        "AuthorizationPolicy", "shop", "{action: DENY, selector: {matchLabels: {app: payments}}, rules: [{}]}"
    )
    found = analyze(configs_from_yaml(WORKLOADS + PAYMENTS_SERVICE + deny))
    (issue,) = [i for i in found if i.code == "MC0005"]
    assert (
        "AuthorizationPolicy shop/p is not enforced" in issue.message and "shop/payments (port 8080)" in issue.message
    )
    assert ("MC0005", "p") not in codes(PAYMENTS_SERVICE + PAYMENTS_INGRESS + deny)
    jwt = policy("RequestAuthentication", "shop", "{selector: {matchLabels: {app: payments}}, jwtRules: [{issuer: x}]}")
    assert ("MC0005", "p") in codes(PAYMENTS_SERVICE + jwt)


def test_a_service_accounts_rule_where_no_workload_gets_mutual_tls_is_mc0004() -> None:
    """`serviceAccounts` and `trustDomains` read the peer certificate too."""
    for field, value in (("serviceAccounts", "shop/frontend"), ("notTrustDomains", "other.example")):
        spec = (
            f'{{selector: {{matchLabels: {{app: legacy}}}}, rules: [{{from: [{{source: {{{field}: ["{value}"]}}}}]}}]}}'
        )
        found = analyze(configs_from_yaml(WORKLOADS + policy("AuthorizationPolicy", "shop", spec)))
        (issue,) = [i for i in found if i.code == "MC0004"]
        assert issue.path == ("spec", "rules", 0, "from", 0, "source", field)
