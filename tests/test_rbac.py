"""AuthorizationPolicy as Envoy RBAC: which policies select a workload, each Istio field as the
Envoy matcher Istio makes of it, the filters' order and names, and where they go on the inbound
chains; the generated config is checked by a real Envoy too."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import examples_copy, needs_envoy
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2

from meshctl.api.security.v1beta1 import authorization_policy_pb2
from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, make_config
from meshctl.config.schema import parse_spec
from meshctl.registry.serviceentry import build_file_model
from meshctl.security.authorization import ignored_policies, policies_for_workload, with_trust_domain
from meshctl.server.cache import ResourceCache
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.scope import ProxyScope
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.builders import configs_from_yaml, proxy_for
from meshctl.testing.envoy import to_dict, validate_resources
from meshctl.testing.server import run, serving
from meshctl.xds import jwt_metadata, types
from meshctl.xds.generate import generate_config
from meshctl.xds.inbound_view import inbound_view
from meshctl.xds.rbac import filter_rules
from meshctl.xds.rbac_match import translate_rule

NS = "foo"
REVIEWS = f"sidecar~10.0.0.5~reviews-v1.{NS}~{NS}.svc.cluster.local"
DETAILS = f"sidecar~10.0.0.6~details-v1.{NS}~{NS}.svc.cluster.local"
HTTP_PORT, TCP_PORT = 9080, 9000

#: Two VMs of namespace foo, each taking inbound traffic on an HTTP and a TCP port through a
#: Sidecar ingress listener (a VM without iptables).
MESH = f"""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: reviews-v1, namespace: {NS}}}
spec:
  address: 10.0.0.5
  labels: {{app: reviews, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: details-v1, namespace: {NS}}}
spec:
  address: 10.0.0.6
  labels: {{app: details}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: ingress, namespace: {NS}}}
spec:
  ingress:
  - port: {{number: {HTTP_PORT}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:8080
  - port: {{number: {TCP_PORT}, protocol: TCP, name: tcp}}
    defaultEndpoint: 127.0.0.1:8000
"""


# -- building policies and looking at what they make ---------------------------------------------


def policy(
    spec: Mapping[str, Any],
    *,
    name: str = "p",
    namespace: str = NS,
    annotations: Mapping[str, str] | None = None,
    created: float | None = None,
) -> Config:
    """An AuthorizationPolicy from plain data, through the schema only (some cases here are
    what validation would refuse: generation must still be safe with them)."""
    message, issues = parse_spec(dict(spec), authorization_policy_pb2.AuthorizationPolicy)
    assert issues == [], issues
    return make_config("AuthorizationPolicy", name, namespace, message, annotations=annotations, created=created)


def snapshot_with(*policies: Config, mesh: MeshSettings | None = None) -> Snapshot:
    configs = [*configs_from_yaml(MESH), *policies]
    return build_snapshot(configs, build_file_model(configs), mesh)


def translated(rule: Mapping[str, Any], *, for_tcp: bool = False, allow: bool = True, td: str = "cluster.local") -> Any:
    message = policy({"rules": [dict(rule)]})
    return translate_rule(
        message.spec.rules[0],  # type: ignore[attr-defined]
        policy_namespace=NS,
        trust_domain=td,
        for_tcp=for_tcp,
        allow=allow,
    )


def policy_dict(rule: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    result = translated(rule, **kwargs)
    assert result.policy is not None, result.problems
    return to_dict(result.policy)


def principal_ids(rule: Mapping[str, Any], **kwargs: Any) -> list[Any]:
    (principal,) = policy_dict(rule, **kwargs)["principals"]
    ids: list[Any] = principal["and_ids"]["ids"]
    return ids


def permission_rules(rule: Mapping[str, Any], **kwargs: Any) -> list[Any]:
    (permission,) = policy_dict(rule, **kwargs)["permissions"]
    rules: list[Any] = permission["and_rules"]["rules"]
    return rules


def regex(pattern: str) -> dict[str, Any]:
    return {"safe_regex": {"regex": pattern}}


def authn(matcher: Mapping[str, Any]) -> dict[str, Any]:
    return {"authenticated": {"principal_name": dict(matcher)}}


def any_of(*ids: Any, key: str = "or_ids", inner: str = "ids") -> dict[str, Any]:
    return {key: {inner: list(ids)}}


def rules_of(*items: Any) -> dict[str, Any]:
    return any_of(*items, key="or_rules", inner="rules")


def jwt(claim: str, matcher: Mapping[str, Any]) -> dict[str, Any]:
    path = [{"key": jwt_metadata.PAYLOAD}, {"key": claim}]
    metadata = {"filter": jwt_metadata.FILTER, "path": path, "value": {"string_match": dict(matcher)}}
    return {"sourced_metadata": {"metadata_matcher": metadata}}


def claims(path: Sequence[str], *values: Mapping[str, Any]) -> dict[str, Any]:
    """A claim that is a string or a list holding one of `values` (Istio's extended JWT)."""
    matchers = [{"string_match": dict(v)} for v in values]
    value = matchers[0] if len(matchers) == 1 else {"or_match": {"value_matchers": matchers}}
    either = {"or_match": {"value_matchers": [{"list_match": {"one_of": value}}, value]}}
    keys = [{"key": jwt_metadata.PAYLOAD}, *({"key": k} for k in path)]
    return {"sourced_metadata": {"metadata_matcher": {"filter": jwt_metadata.FILTER, "path": keys, "value": either}}}


def header(name: str, **match: Any) -> dict[str, Any]:
    if match == {"present": True}:
        return {"header": {"name": name, "present_match": True}}
    return {"header": {"name": name, "string_match": match}}


def cidr(prefix: str, length: int) -> dict[str, Any]:
    return {"address_prefix": prefix, "prefix_len": length}


def listener(snapshot: Snapshot, node: str, port: int) -> Any:
    generated = generate_config(snapshot, proxy_for(snapshot, node))
    return next(item for item in generated[types.LISTENER] if item.name == f"{node.split('~')[1]}_{port}")


def hcm(chain: Any) -> Any:
    (network,) = chain.filters
    return unpack(network.typed_config, hcm_pb2.HttpConnectionManager)


def unpack(packed: Any, cls: Any) -> Any:
    message = cls()
    assert packed.Unpack(message)
    return message


def http_rbac(chain: Any) -> list[Any]:
    """The HTTP RBAC filters of an HTTP chain, unpacked, in order."""
    return [unpack(f.typed_config, http_rbac_pb2.RBAC) for f in hcm(chain).http_filters if "rbac" in f.name]


def network_rbac(chain: Any) -> list[Any]:
    return [unpack(f.typed_config, network_rbac_pb2.RBAC) for f in chain.filters if "rbac" in f.name]


def actions(filters: Sequence[Any]) -> list[str]:
    return [
        rbac_pb2.RBAC.Action.Name(f.rules.action if f.HasField("rules") else f.shadow_rules.action) for f in filters
    ]


# -- selection ------------------------------------------------------------------------------------


def test_policies_select_by_root_namespace_namespace_and_selector() -> None:
    root_all = policy({}, name="root-all", namespace="istio-system")
    root_reviews = policy(
        {"selector": {"matchLabels": {"app": "reviews"}}}, name="root-reviews", namespace="istio-system"
    )
    foo_all = policy({}, name="foo-all")
    foo_reviews = policy({"selector": {"matchLabels": {"app": "reviews", "version": "v1"}}}, name="foo-reviews")
    bar_reviews = policy({"selector": {"matchLabels": {"app": "reviews"}}}, name="bar-reviews", namespace="bar")
    snapshot = snapshot_with(root_all, root_reviews, foo_all, foo_reviews, bar_reviews)

    def names(namespace: str, labels: Mapping[str, str]) -> list[str]:
        return [c.name for c in policies_for_workload(snapshot, namespace, labels)]

    # Root namespace first, then the workload's; a root policy with a selector selects anywhere.
    assert names(NS, {"app": "reviews", "version": "v1"}) == ["root-all", "root-reviews", "foo-all", "foo-reviews"]
    assert names(NS, {"app": "reviews", "version": "v2"}) == ["root-all", "root-reviews", "foo-all"]
    assert names(NS, {"app": "details"}) == ["root-all", "foo-all"]
    # A namespace's policies stay in it, with or without a selector.
    assert names("bar", {"app": "reviews", "version": "v1"}) == ["root-all", "root-reviews", "bar-reviews"]
    assert names("baz", {}) == ["root-all"]


def test_policies_of_a_namespace_come_oldest_first() -> None:
    newer = policy({}, name="a-newer", created=2000.0)
    older = policy({}, name="b-older", created=1000.0)
    snapshot = snapshot_with(newer, older)
    assert [c.name for c in policies_for_workload(snapshot, NS, {})] == ["b-older", "a-newer"]


def test_a_target_ref_policy_selects_no_workload_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    gateway_ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}
    single = policy({"targetRef": gateway_ref, "rules": [{}]}, name="single")
    several = policy({"targetRefs": [gateway_ref], "action": "DENY", "rules": [{}]}, name="several")
    snapshot = snapshot_with(single, several)
    assert policies_for_workload(snapshot, NS, {"app": "reviews"}) == ()
    assert [c.name for c in ignored_policies(snapshot, NS)] == ["several", "single"]
    with caplog.at_level(logging.WARNING, "meshctl.xds.rbac"):
        chain = listener(snapshot, REVIEWS, HTTP_PORT).filter_chains[0]
    assert http_rbac(chain) == []  # neither the ALLOW (which would deny all) nor the DENY
    assert "AuthorizationPolicy foo/single has a targetRef" in caplog.text
    assert "AuthorizationPolicy foo/several has a targetRef" in caplog.text


# -- each field as Envoy's matcher ---------------------------------------------------------------


def test_source_fields_become_principals_in_istios_order() -> None:
    source = {
        "principals": ["cluster.local/ns/a/sa/b", "prefix-*", "*-suffix", "*"],
        "notPrincipals": ["cluster.local/ns/x/sa/y"],
        "requestPrincipals": ["https://issuer.example/alice"],
        "notRequestPrincipals": ["*"],
        "namespaces": ["ns1", "dev-*"],
        "notNamespaces": ["*-test"],
        "remoteIpBlocks": ["5.6.0.0/16"],
        "notRemoteIpBlocks": ["5.6.7.8"],
        "ipBlocks": ["10.0.0.0/8", "1.2.3.4"],
        "notIpBlocks": ["10.1.0.0/16"],
    }
    ids = principal_ids({"from": [{"source": source}]})
    assert ids == [
        any_of(
            authn({"exact": "spiffe://cluster.local/ns/a/sa/b"}),
            authn({"prefix": "spiffe://prefix-"}),
            authn(regex("spiffe://.*-suffix")),
            authn(regex(".+")),
        ),
        {"not_id": any_of(authn({"exact": "spiffe://cluster.local/ns/x/sa/y"}))},
        {"and_ids": {"ids": [jwt("iss", {"exact": "https://issuer.example"}), jwt("sub", {"exact": "alice"})]}},
        {"not_id": {"and_ids": {"ids": [jwt("iss", regex(".+")), jwt("sub", regex(".+"))]}}},
        any_of(authn(regex(".*/ns/ns1/.*")), authn(regex(".*/ns/dev-.*/.*"))),
        {"not_id": any_of(authn(regex(".*/ns/.*-test/.*")))},
        any_of({"remote_ip": cidr("5.6.0.0", 16)}),
        {"not_id": any_of({"remote_ip": cidr("5.6.7.8", 32)})},
        any_of({"direct_remote_ip": cidr("10.0.0.0", 8)}, {"direct_remote_ip": cidr("1.2.3.4", 32)}),
        {"not_id": any_of({"direct_remote_ip": cidr("10.1.0.0", 16)})},
    ]


def test_request_principals_use_istios_wildcards_on_issuer_and_subject() -> None:
    values = ["iss/*", "*/sub", "https://a.example/*", "prefix*", "*suffix"]
    (found,) = principal_ids({"from": [{"source": {"requestPrincipals": values}}]})
    pairs = [
        [item["sourced_metadata"]["metadata_matcher"] for item in both["and_ids"]["ids"]]
        for both in found["or_ids"]["ids"]
    ]
    got = [tuple(m["value"]["string_match"] for m in pair) for pair in pairs]
    assert got == [
        ({"exact": "iss"}, regex(".+")),
        (regex(".+"), {"exact": "sub"}),
        ({"exact": "https://a.example"}, regex(".+")),
        ({"prefix": "prefix"}, regex(".+")),
        (regex(".+"), {"suffix": "suffix"}),
    ]


def test_operation_fields_become_permissions_in_istios_order() -> None:
    operation = {
        "hosts": ["Exact.com", "*.suffix.com", "prefix.*", "*"],
        "notHosts": ["admin.exact.com"],
        "methods": ["GET", "P*"],
        "notMethods": ["DELETE"],
        "paths": ["/exact", "/prefix/*", "*/suffix", "*", "/t/{*}/x", "/{**}/y"],
        "notPaths": ["/private"],
        "ports": ["80"],
        "notPorts": ["8000"],
    }
    template = "type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig"

    def uri_template(path: str) -> dict[str, Any]:
        config = {"@type": template, "path_template": path}
        return {"uri_template": {"name": "envoy.path.match.uri_template.uri_template_matcher", "typed_config": config}}

    assert permission_rules({"to": [{"operation": operation}]}) == [
        rules_of(
            header(":authority", exact="Exact.com", ignore_case=True),
            header(":authority", suffix=".suffix.com", ignore_case=True),
            header(":authority", prefix="prefix.", ignore_case=True),
            header(":authority", present=True),
        ),
        {"not_rule": rules_of(header(":authority", exact="admin.exact.com", ignore_case=True))},
        rules_of(header(":method", exact="GET"), header(":method", prefix="P")),
        {"not_rule": rules_of(header(":method", exact="DELETE"))},
        rules_of(
            {"url_path": {"path": {"exact": "/exact"}}},
            {"url_path": {"path": {"prefix": "/prefix/"}}},
            {"url_path": {"path": {"suffix": "/suffix"}}},
            {"url_path": {"path": regex(".+")}},
            uri_template("/t/*/x"),
            uri_template("/**/y"),
        ),
        {"not_rule": rules_of({"url_path": {"path": {"exact": "/private"}}})},
        rules_of({"destination_port": 80}),
        {"not_rule": rules_of({"destination_port": 8000})},
    ]


def test_hosts_match_the_authority_as_written_port_included() -> None:
    """Istio matches `:authority` as it is: `a.com` is not `a.com:8080`; `a.com:*` is."""
    (hosts,) = permission_rules({"to": [{"operation": {"hosts": ["a.com", "a.com:*"]}}]})
    assert hosts == rules_of(
        header(":authority", exact="a.com", ignore_case=True), header(":authority", prefix="a.com:", ignore_case=True)
    )


def test_each_when_condition_goes_to_its_side() -> None:
    when = [
        {"key": "request.headers[X-Team]", "values": ["red", "blue-*"], "notValues": ["*"]},
        {"key": "source.ip", "values": ["10.0.0.1"]},
        {"key": "remote.ip", "values": ["1.2.0.0/16"]},
        {"key": "source.namespace", "values": ["prod"]},
        {"key": "source.principal", "values": ["cluster.local/ns/a/sa/b"]},
        {"key": "source.serviceAccount", "values": ["sa1", "other/sa2"]},
        {"key": "request.auth.principal", "values": ["iss/sub"]},
        {"key": "request.auth.audiences", "values": ["aud1"]},
        {"key": "request.auth.presenter", "values": ["app1", "app2"]},
        {"key": "request.auth.claims[groups]", "values": ["admins"]},
        {"key": "request.auth.claims[a][b]", "values": ["c"]},
        {"key": "destination.ip", "values": ["10.0.0.5"]},
        {"key": "destination.port", "values": ["9080"], "notValues": ["15000"]},
        {"key": "connection.sni", "values": ["*.example.com"]},
        {"key": "experimental.envoy.filters.a.b[c]", "values": ["x", "[y]"]},
    ]
    found = policy_dict({"when": when})
    assert found["permissions"] == [
        {
            "and_rules": {
                "rules": [
                    rules_of({"destination_ip": cidr("10.0.0.5", 32)}),
                    rules_of({"destination_port": 9080}),
                    {"not_rule": rules_of({"destination_port": 15000})},
                    rules_of({"requested_server_name": {"suffix": ".example.com"}}),
                    {
                        "sourced_metadata": {
                            "metadata_matcher": {
                                "filter": "envoy.filters.a.b",
                                "path": [{"key": "c"}],
                                "value": {
                                    "or_match": {
                                        "value_matchers": [
                                            {"string_match": {"exact": "x"}},
                                            {"list_match": {"one_of": {"string_match": {"exact": "y"}}}},
                                        ]
                                    }
                                },
                            }
                        }
                    },
                ]
            }
        }
    ]
    account = "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?"
    assert found["principals"][0]["and_ids"]["ids"] == [
        any_of(header("X-Team", exact="red"), header("X-Team", prefix="blue-")),
        {"not_id": any_of(header("X-Team", present=True))},
        any_of({"direct_remote_ip": cidr("10.0.0.1", 32)}),
        any_of({"remote_ip": cidr("1.2.0.0", 16)}),
        any_of(authn(regex(".*/ns/prod/.*"))),
        any_of(authn({"exact": "spiffe://cluster.local/ns/a/sa/b"})),
        any_of(authn(regex(account.format(NS, "sa1"))), authn(regex(account.format("other", "sa2")))),
        {"and_ids": {"ids": [jwt("iss", {"exact": "iss"}), jwt("sub", {"exact": "sub"})]}},
        claims(["aud"], {"exact": "aud1"}),
        claims(["azp"], {"exact": "app1"}, {"exact": "app2"}),
        claims(["groups"], {"exact": "admins"}),
        claims(["a", "b"], {"exact": "c"}),
    ]


def test_regexes_built_from_values_match_them_literally() -> None:
    """Istio pastes the value into the regex; here `.` means a dot, and a stray `(` cannot make
    Envoy reject the listener."""
    source = {"principals": ["*.example/ns/a/sa/b("], "namespaces": ["a.b*"]}
    ids = principal_ids({"from": [{"source": source}]})
    assert ids == [
        any_of(authn(regex(r"spiffe://.*\.example/ns/a/sa/b\("))),
        any_of(authn(regex(r".*/ns/a\.b.*/.*"))),
    ]


def test_principals_name_the_mesh_trust_domain_as_istio_migrates_them() -> None:
    assert with_trust_domain(["cluster.local/ns/a/sa/b"], "example.org") == ["example.org/ns/a/sa/b"]
    assert with_trust_domain(["*/ns/a/sa/b", "ns/a/sa/b", "other.org/ns/a/sa/b"], "example.org") == [
        "*/ns/a/sa/b",
        "ns/a/sa/b",
        "other.org/ns/a/sa/b",
    ]
    assert with_trust_domain(["*.org/ns/a/sa/b"], "example.org") == ["*.org/ns/a/sa/b"]
    ids = principal_ids({"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}]}, td="example.org")
    assert ids == [any_of(authn({"exact": "spiffe://example.org/ns/a/sa/b"}))]


def test_an_empty_rule_matches_everything() -> None:
    assert policy_dict({}) == {
        "permissions": [{"and_rules": {"rules": [{"any": True}]}}],
        "principals": [{"and_ids": {"ids": [{"any": True}]}}],
    }


def test_each_from_and_to_entry_is_a_principal_and_a_permission_with_the_conditions_in_each() -> None:
    found = policy_dict(
        {
            "from": [{"source": {"namespaces": ["a"]}}, {"source": {"namespaces": ["b"]}}],
            "to": [{"operation": {"ports": ["1"]}}, {"operation": {"ports": ["2"]}}],
            "when": [{"key": "source.ip", "values": ["10.0.0.1"]}, {"key": "destination.port", "values": ["3"]}],
        }
    )
    assert [p["and_rules"]["rules"] for p in found["permissions"]] == [
        [rules_of({"destination_port": port}), rules_of({"destination_port": 3})] for port in (1, 2)
    ]
    assert [p["and_ids"]["ids"] for p in found["principals"]] == [
        [any_of(authn(regex(f".*/ns/{ns}/.*"))), any_of({"direct_remote_ip": cidr("10.0.0.1", 32)})] for ns in "ab"
    ]


# -- what cannot be used ---------------------------------------------------------------------------


def test_http_only_fields_on_tcp_fail_an_allow_rule_and_widen_a_deny_rule() -> None:
    rule = {
        "from": [{"source": {"requestPrincipals": ["*"], "namespaces": ["a"]}}],
        "to": [{"operation": {"paths": ["/admin"], "methods": ["GET"], "ports": ["80"]}}],
        "when": [{"key": "request.headers[x]", "values": ["y"]}],
    }
    allowed = translated(rule, for_tcp=True, allow=True)
    assert allowed.policy is None
    assert allowed.problems[0].http_only
    denied = translated(rule, for_tcp=True, allow=False)
    assert denied.policy is not None
    assert to_dict(denied.policy) == {
        "permissions": [{"and_rules": {"rules": [rules_of({"destination_port": 80})]}}],
        "principals": [{"and_ids": {"ids": [any_of(authn(regex(".*/ns/a/.*")))]}}],
    }
    assert {p.field for p in denied.problems} == {
        "from.source.requestPrincipals",
        "to.operation.methods",
        "to.operation.paths",
        "when request.headers[x]",
    }
    # On HTTP, the same rule keeps every field.
    assert translated(rule, for_tcp=False, allow=True).problems == ()


def test_a_value_that_does_not_parse_fails_an_allow_rule_and_is_left_out_of_a_deny_rule() -> None:
    rule = {"from": [{"source": {"ipBlocks": ["10.0.0.0/8", "not-an-ip"]}}], "to": [{"operation": {"ports": ["x"]}}]}
    assert translated(rule, allow=True).policy is None
    denied = translated(rule, allow=False)
    assert denied.policy is not None
    assert to_dict(denied.policy) == {
        "permissions": [{"and_rules": {"rules": [{"any": True}]}}],
        "principals": [{"and_ids": {"ids": [any_of({"direct_remote_ip": cidr("10.0.0.0", 8)})]}}],
    }


def test_an_unknown_condition_key_skips_the_rule_whatever_the_action() -> None:
    rule = {"when": [{"key": "request.nonsense", "values": ["x"]}]}
    for allow in (True, False):
        result = translated(rule, allow=allow)
        assert result.policy is None
        assert "request.nonsense" in str(result.problems[0])


# -- filters: order, names, actions ---------------------------------------------------------------


ALL_ACTIONS = (
    policy({"action": "ALLOW", "rules": [{"to": [{"operation": {"paths": ["/public*"]}}]}]}, name="allow"),
    policy({"action": "DENY", "rules": [{}, {"to": [{"operation": {"paths": ["/admin"]}}]}]}, name="deny"),
    policy({"action": "AUDIT", "rules": [{}]}, name="audit"),
    policy(
        {"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{"to": [{"operation": {"paths": ["/ext"]}}]}]},
        name="ext",
    ),
)


def test_filters_come_in_istios_order_with_istios_names() -> None:
    rules = filter_rules(ALL_ACTIONS, trust_domain="cluster.local", for_tcp=False)
    assert [(rbac_pb2.RBAC.Action.Name(r.action), sorted(r.rules.policies) if r.rules else None) for r in rules] == [
        ("DENY", ["istio-ext-authz-opa-ns[foo]-policy[ext]-rule[0]-deny-due-to-bad-CUSTOM-action"]),
        ("LOG", ["ns[foo]-policy[audit]-rule[0]"]),
        ("DENY", ["ns[foo]-policy[deny]-rule[0]", "ns[foo]-policy[deny]-rule[1]"]),
        ("ALLOW", ["ns[foo]-policy[allow]-rule[0]"]),
    ]


def test_inbound_http_chains_start_with_the_rbac_filters(caplog: pytest.LogCaptureFixture) -> None:
    snapshot = snapshot_with(*ALL_ACTIONS)
    with caplog.at_level(logging.WARNING, "meshctl.xds.rbac"):
        found = listener(snapshot, REVIEWS, HTTP_PORT)
    # PERMISSIVE: a mutual TLS chain and a plaintext one, the same filters on both (Istio names
    # every chain of a port alike).
    assert [c.name for c in found.filter_chains] == [f"10.0.0.5_{HTTP_PORT}"] * 2
    assert [c.filter_chain_match.transport_protocol for c in found.filter_chains] == ["tls", "raw_buffer"]
    for chain in found.filter_chains:
        names = [f.name for f in hcm(chain).http_filters]
        assert names == [
            *["envoy.filters.http.rbac"] * 4,
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router",
        ]
        assert actions(http_rbac(chain)) == ["DENY", "LOG", "DENY", "ALLOW"]
    # CUSTOM fails closed, and says so.
    assert "AuthorizationPolicy foo/ext: action CUSTOM" in caplog.text and "fail closed" in caplog.text


def test_inbound_tcp_chains_put_the_rbac_filters_before_tcp_proxy(caplog: pytest.LogCaptureFixture) -> None:
    snapshot = snapshot_with(*ALL_ACTIONS)
    with caplog.at_level(logging.WARNING, "meshctl.xds.rbac"):
        found = listener(snapshot, REVIEWS, TCP_PORT)
    for chain in found.filter_chains:
        assert [f.name for f in chain.filters] == [
            *["envoy.filters.network.rbac"] * 4,
            "envoy.filters.network.tcp_proxy",
        ]
        filters = network_rbac(chain)
        assert {f.stat_prefix for f in filters} == {"tcp."}
        assert actions(filters) == ["DENY", "LOG", "DENY", "ALLOW"]
        custom, _, deny, allow = filters
        # The ALLOW rule names only a path: on TCP it matches nothing, so the port denies all.
        assert dict(allow.rules.policies) == {}
        # The DENY rule of a path denies every connection on TCP (the path is left out).
        assert to_dict(deny.rules.policies["ns[foo]-policy[deny]-rule[1]"])["permissions"] == [
            {"and_rules": {"rules": [{"any": True}]}}
        ]
        assert to_dict(custom.rules.policies.popitem()[1])["permissions"] == [{"and_rules": {"rules": [{"any": True}]}}]
    assert "AuthorizationPolicy foo/allow rule 0 (ALLOW): to.operation.paths is HTTP only" in caplog.text
    assert "AuthorizationPolicy foo/deny rule 1 (DENY): to.operation.paths is HTTP only" in caplog.text


def test_without_allow_policies_there_is_no_allow_filter() -> None:
    deny = policy({"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]})
    chain = listener(snapshot_with(deny), REVIEWS, HTTP_PORT).filter_chains[0]
    assert actions(http_rbac(chain)) == ["DENY"]
    # And without any policy, no RBAC filter at all.
    chain = listener(snapshot_with(), REVIEWS, HTTP_PORT).filter_chains[0]
    assert http_rbac(chain) == []


def test_an_empty_spec_denies_everything() -> None:
    (allow,) = http_rbac(listener(snapshot_with(policy({})), REVIEWS, HTTP_PORT).filter_chains[0])
    assert allow.rules.action == rbac_pb2.RBAC.ALLOW
    assert to_dict(allow.rules)["policies"] == {
        "ns[foo]-policy[p]-rule[0]": {
            "permissions": [{"not_rule": {"any": True}}],
            "principals": [{"not_id": {"any": True}}],
        }
    }


def test_an_allow_policy_whose_rules_all_fail_still_denies(caplog: pytest.LogCaptureFixture) -> None:
    broken = policy({"rules": [{"from": [{"source": {"ipBlocks": ["nope"]}}]}]})
    with caplog.at_level(logging.WARNING, "meshctl.xds.rbac"):
        (allow,) = http_rbac(listener(snapshot_with(broken), REVIEWS, HTTP_PORT).filter_chains[0])
    assert allow.rules.action == rbac_pb2.RBAC.ALLOW and dict(allow.rules.policies) == {}
    assert "from.source.ipBlocks: 'nope' is not an IP address or CIDR range; the rule matches nothing" in caplog.text


@pytest.mark.parametrize(("action", "prefix"), [("ALLOW", "istio_dry_run_allow_"), ("DENY", "istio_dry_run_deny_")])
def test_dry_run_policies_are_shadow_rules(action: str, prefix: str) -> None:
    dry = policy({"action": action, "rules": [{}]}, annotations={"istio.io/dry-run": "true"})
    (only,) = http_rbac(listener(snapshot_with(dry), REVIEWS, HTTP_PORT).filter_chains[0])
    assert not only.HasField("rules")  # enforces nothing
    assert list(only.shadow_rules.policies) == ["ns[foo]-policy[p]-rule[0]"]
    assert only.shadow_rules_stat_prefix == prefix
    (tcp,) = network_rbac(listener(snapshot_with(dry), REVIEWS, TCP_PORT).filter_chains[0])
    assert not tcp.HasField("rules") and tcp.shadow_rules_stat_prefix == prefix


def test_dry_run_and_enforced_policies_share_a_filter_and_a_bad_annotation_enforces(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dry = policy({"rules": [{}]}, name="dry", annotations={"istio.io/dry-run": "True"})
    enforced = policy({"rules": [{}]}, name="real", annotations={"istio.io/dry-run": "yes"})
    with caplog.at_level(logging.WARNING):
        (allow,) = http_rbac(listener(snapshot_with(dry, enforced), REVIEWS, HTTP_PORT).filter_chains[0])
    assert list(allow.rules.policies) == ["ns[foo]-policy[real]-rule[0]"]
    assert list(allow.shadow_rules.policies) == ["ns[foo]-policy[dry]-rule[0]"]
    assert "istio.io/dry-run='yes' is not a boolean" in caplog.text


def test_a_dry_run_custom_policy_denies_nothing() -> None:
    custom = policy(
        {"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{}]}, annotations={"istio.io/dry-run": "true"}
    )
    (only,) = http_rbac(listener(snapshot_with(custom), REVIEWS, HTTP_PORT).filter_chains[0])
    assert not only.HasField("rules") and not only.HasField("shadow_rules")


def test_the_mesh_trust_domain_reaches_the_listener() -> None:
    allow = policy({"rules": [{"from": [{"source": {"principals": ["cluster.local/ns/foo/sa/sleep"]}}]}]})
    snapshot = snapshot_with(allow, mesh=MeshSettings(trust_domain="example.org"))
    (found,) = http_rbac(listener(snapshot, REVIEWS, HTTP_PORT).filter_chains[0])
    principal = to_dict(found.rules.policies["ns[foo]-policy[p]-rule[0]"])["principals"][0]
    assert principal == {"and_ids": {"ids": [any_of(authn({"exact": "spiffe://example.org/ns/foo/sa/sleep"}))]}}


def test_redirected_traffic_is_authorized_on_the_passthrough_chains_too() -> None:
    deny = policy({"action": "DENY", "rules": [{"from": [{"source": {"ipBlocks": ["10.9.0.0/16"]}}]}]})
    snapshot = snapshot_with(deny)
    generated = generate_config(snapshot, proxy_for(snapshot, REVIEWS, {"INTERCEPTION_MODE": "REDIRECT"}))
    virtual = next(item for item in generated[types.LISTENER] if item.name == "virtualInbound")
    chains = {c.name: c for c in virtual.filter_chains}
    assert actions(http_rbac(chains["virtualInbound-catchall-http"])) == ["DENY"]
    assert actions(network_rbac(chains["virtualInbound"])) == ["DENY"]
    assert network_rbac(chains["virtualInbound-blackhole"]) == []


# -- what a policy change regenerates --------------------------------------------------------------


def test_a_policy_changes_the_inbound_view_of_the_workloads_it_selects_only() -> None:
    reviews_only = policy({"selector": {"matchLabels": {"app": "reviews"}}, "rules": [{}]})
    before, after = snapshot_with(), snapshot_with(reviews_only)

    def view(snapshot: Snapshot, node: str) -> Any:
        return inbound_view(ProxyScope(snapshot, proxy_for(snapshot, node)))

    assert view(before, DETAILS) == view(after, DETAILS)
    assert view(before, REVIEWS) != view(after, REVIEWS)

    cache = ResourceCache()
    for node in (REVIEWS, DETAILS):
        cache.resources(before, proxy_for(before, node))

    def inbound_generations(snapshot: Snapshot) -> int:
        generations, outbound = cache.generations, cache.outbound_generations
        for node in (REVIEWS, DETAILS):
            cache.resources(snapshot, proxy_for(snapshot, node))
        return (cache.generations - generations) - (cache.outbound_generations - outbound)

    assert inbound_generations(after) == 1  # reviews' inbound part, not details'
    # An edit of the policy's content does the same.
    edited = policy({"selector": {"matchLabels": {"app": "reviews"}}, "action": "DENY", "rules": [{}]})
    assert inbound_generations(snapshot_with(edited)) == 1
    # A policy that selects neither regenerates no inbound part.
    other = policy({"selector": {"matchLabels": {"app": "ratings"}}, "rules": [{}]}, name="other")
    assert inbound_generations(snapshot_with(edited, other)) == 0


GATEWAY_YAML = f"""
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 8080, name: http, protocol: HTTP}}
    hosts: ["*"]
"""


def test_a_gateway_enforces_the_policies_that_select_it() -> None:
    """Istio enforces AuthorizationPolicy on gateways as on sidecars: the RBAC filters go first
    in the gateway's connection managers, and only a policy selecting the gateway's labels counts
    (it is part of the gateway's outbound key, so it is regenerated when the policy changes)."""
    gateway = "router~10.0.0.20~gw.foo~foo.svc.cluster.local"
    meta = {"LABELS": {"istio": "ingressgateway"}}
    selecting = policy(
        {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "action": "DENY",
            "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}],
        }
    )
    configs = [*configs_from_yaml(MESH + GATEWAY_YAML), selecting]
    snapshot = build_snapshot(configs, build_file_model(configs))
    proxy = proxy_for(snapshot, gateway, meta)
    (listener,) = generate_config(snapshot, proxy)[types.LISTENER]
    hcm = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    assert hcm.http_filters[0].name == "envoy.filters.http.rbac"
    config = http_rbac_pb2.RBAC()
    assert hcm.http_filters[0].typed_config.Unpack(config)
    assert config.rules.action == rbac_pb2.RBAC.DENY and list(config.rules.policies) == ["ns[foo]-policy[p]-rule[0]"]
    # A label only a policy's selector tests is part of a gateway's outbound view: another
    # gateway of the same Gateway without it shares nothing with this one.
    narrow = policy({"selector": {"matchLabels": {"istio": "ingressgateway", "tier": "edge"}}, "action": "DENY"})
    configs = [*configs_from_yaml(MESH + GATEWAY_YAML), narrow]
    snapshot = build_snapshot(configs, build_file_model(configs))
    edge = proxy_for(snapshot, gateway, {"LABELS": {"istio": "ingressgateway", "tier": "edge"}})
    other = proxy_for(snapshot, gateway, {"LABELS": {"istio": "ingressgateway", "tier": "inner"}})
    assert edge.outbound is not None and other.outbound is not None
    assert dict(edge.outbound.label_pairs) == {"istio": "ingressgateway", "tier": "edge"}
    assert dict(other.outbound.label_pairs) == {"istio": "ingressgateway"}


# -- a real Envoy takes it ------------------------------------------------------------------------


FULL_RULE = {
    "from": [
        {
            "source": {
                "principals": ["cluster.local/ns/a/sa/b", "*-s", "p-*", "*"],
                "notPrincipals": ["x"],
                "requestPrincipals": ["https://iss/sub", "*"],
                "namespaces": ["ns*"],
                "ipBlocks": ["10.0.0.0/8"],
                "remoteIpBlocks": ["1.2.3.4", "::1"],
            }
        }
    ],
    "to": [
        {
            "operation": {
                "hosts": ["a.com", "*.b.com", "c.*", "*"],
                "methods": ["GET", "*"],
                "paths": ["/x", "/y/*", "*/z", "/t/{*}/z", "/{**}/w"],
                "ports": ["9080", "9000"],
                "notPaths": ["/admin*"],
            }
        }
    ],
    "when": [
        {"key": "request.headers[x-a]", "values": ["v", "*"]},
        {"key": "request.auth.claims[groups]", "values": ["g1", "g2"]},
        {"key": "request.auth.claims[a][b]", "values": ["c"]},
        {"key": "request.auth.audiences", "values": ["aud"]},
        {"key": "request.auth.presenter", "values": ["azp"]},
        {"key": "request.auth.principal", "values": ["iss/sub"]},
        {"key": "source.ip", "values": ["10.0.0.1"]},
        {"key": "remote.ip", "values": ["10.0.0.0/24"]},
        {"key": "source.namespace", "values": ["ns"]},
        {"key": "source.principal", "values": ["cluster.local/ns/a/sa/b"]},
        {"key": "source.serviceAccount", "values": ["sa"]},
        {"key": "destination.ip", "values": ["10.0.0.5"]},
        {"key": "destination.port", "values": ["9080"], "notValues": ["1"]},
        {"key": "connection.sni", "values": ["*.x"]},
        {"key": "experimental.envoy.filters.a.b[c]", "values": ["[v]", "w"]},
    ],
}


@needs_envoy
@pytest.mark.parametrize("interception", ["NONE", "REDIRECT"])
def test_envoy_accepts_every_field_on_http_and_tcp_chains(interception: str) -> None:
    policies = [
        policy({"rules": [FULL_RULE, {}]}, name="allow"),
        policy({"action": "DENY", "rules": [FULL_RULE]}, name="deny"),
        policy({"action": "AUDIT", "rules": [FULL_RULE]}, name="audit", annotations={"istio.io/dry-run": "true"}),
        policy({"action": "DENY", "rules": [FULL_RULE]}, name="deny-dry", annotations={"istio.io/dry-run": "true"}),
        policy({"action": "CUSTOM", "provider": {"name": "ext"}, "rules": [FULL_RULE]}, name="custom"),
        policy({}, name="nothing", namespace="istio-system"),
    ]
    snapshot = snapshot_with(*policies)
    generated = generate_config(snapshot, proxy_for(snapshot, REVIEWS, {"INTERCEPTION_MODE": interception}))
    listeners = [item for item in generated[types.LISTENER] if item.name.startswith(("10.0.0.5_", "virtualInbound"))]
    assert listeners
    assert json.dumps([to_dict(item) for item in listeners]).count("envoy.filters.network.rbac") > 0
    validate_resources(generated)


REVIEWS_V1_NODE = "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local"
PRODUCTPAGE_NODE = "sidecar~10.10.0.11~productpage-v1-vm.bookinfo~bookinfo.svc.cluster.local"
ONLY_REVIEWS = """apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-get-only, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  rules: [{to: [{operation: {methods: [GET]}}]}]
"""


@pytest.mark.slow
def test_a_policy_change_is_pushed_to_the_proxies_it_selects_and_no_other(tmp_path: Path) -> None:
    """Through the real server: writing a policy that selects reviews sends reviews' proxy a new
    listener and productpage's proxy nothing at all (iptables mode, so both have inbound
    listeners for a policy to land on)."""
    mesh = examples_copy(tmp_path)
    redirect = {"INTERCEPTION_MODE": "REDIRECT"}

    async def test() -> None:
        async with (
            serving(mesh) as server,
            AdsClient(f"127.0.0.1:{server.xds_port}", REVIEWS_V1_NODE, metadata=redirect) as reviews,
            AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE_NODE, metadata=redirect) as productpage,
        ):
            for client in (reviews, productpage):
                await client.wait_for(lambda c: c.complete(), timeout=20)
            await asyncio.sleep(0.5)  # anything still in flight from start-up arrives
            seen = {client: len(client.log) for client in (reviews, productpage)}
            (mesh / "policy.yaml").write_text(ONLY_REVIEWS)

            def has_rbac(c: AdsClient) -> bool:
                return any(
                    b"envoy.filters.http.rbac" in m.SerializeToString() for m in c.resources[types.LISTENER].values()
                )

            await reviews.wait_for(has_rbac, timeout=20)
            await asyncio.sleep(1.0)  # time for a wrong push to productpage to show
            assert {r.type_url for r in reviews.log[seen[reviews] :]} == {types.LISTENER}
            assert productpage.log[seen[productpage] :] == []

    run(test)
