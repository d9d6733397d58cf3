"""RequestAuthentication as Envoy's jwt_authn filter: which policies apply to a workload (Istio's
GetJwtPoliciesForWorkload), each JWTRule field as Istio's convertToEnvoyJwtConfig sets it, the
clusters remote key sets are fetched through, real Envoy accepting what is generated, and real
Envoy enforcing it: a valid token passes and its claims reach the backend, an invalid one gets
401, a request without one passes.

Tokens are signed here with `cryptography` (RS256: base64url(header).base64url(payload).signature).
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import DEADLINE, envoy_log_left_open, needs_envoy
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.api.security.v1beta1.jwt_pb2 import JWTRule
from meshctl.api.security.v1beta1.request_authentication_pb2 import RequestAuthentication
from meshctl.config.jwks_uri import parse_jwks_uri
from meshctl.config.model import Config, make_config
from meshctl.registry.serviceentry import build_file_model
from meshctl.security.request_authentication import jwt_rules_for_workload, policies_for_workload
from meshctl.snapshot.model import MeshSettings, Snapshot, build_snapshot
from meshctl.testing.backends import Backend
from meshctl.testing.envoy import EnvoyProcess, bootstrap, free_port, validate_config
from meshctl.testing.jwt import SigningKey, b64url
from meshctl.xds import jwt_metadata, types
from meshctl.xds.cluster_dns import discovery_type
from meshctl.xds.cluster_tls import SYSTEM_CA_BUNDLE
from meshctl.xds.jwks_cluster import build_jwks_cluster, cluster_name, jwks_clusters
from meshctl.xds.jwt_authn import (
    FILTER_NAME,
    UNRESOLVED_JWKS,
    build_jwt_authn,
    build_provider,
    jwt_authn_filter,
)
from meshctl.xds.listener_filters import http_connection_manager

RA = "RequestAuthentication"


def rule(**fields: Any) -> JWTRule:
    """A JWTRule from its YAML spelling (`jwksUri`, `fromHeaders`, ...)."""
    return json_format.ParseDict(fields, JWTRule())


# -- which policies apply to a workload ---------------------------------------------------------


def policy(name: str, namespace: str, spec: Mapping[str, Any], created: float | None = None) -> Config:
    return make_config(RA, name, namespace, json_format.ParseDict(spec, RequestAuthentication()), created=created)


def snapshot_of(*configs: Config) -> Snapshot:
    return build_snapshot(configs, build_file_model(configs), MeshSettings())


def issuers_for(snapshot: Snapshot, namespace: str, labels: Mapping[str, str]) -> list[str]:
    return [r.issuer for r in jwt_rules_for_workload(snapshot, namespace, labels)]


def test_policies_apply_as_in_istio_get_jwt_policies_for_workload() -> None:
    """getConfigsForWorkload: the workload's namespace and the root namespace, each policy applying
    without a selector or when its labels are the workload's; a root-namespace selector selects
    in every namespace; other namespaces' policies never apply."""
    snapshot = snapshot_of(
        policy("mesh", "istio-system", {"jwtRules": [{"issuer": "mesh"}]}),
        policy(
            "mesh-apps",
            "istio-system",
            {"selector": {"matchLabels": {"app": "api"}}, "jwtRules": [{"issuer": "root-api"}]},
        ),
        policy("ns", "shop", {"jwtRules": [{"issuer": "shop"}]}),
        policy("api", "shop", {"selector": {"matchLabels": {"app": "api"}}, "jwtRules": [{"issuer": "shop-api"}]}),
        policy("web", "shop", {"selector": {"matchLabels": {"app": "web"}}, "jwtRules": [{"issuer": "shop-web"}]}),
        policy("other", "billing", {"jwtRules": [{"issuer": "billing"}]}),
    )
    assert issuers_for(snapshot, "shop", {"app": "api", "version": "v1"}) == ["mesh", "root-api", "shop", "shop-api"]
    assert issuers_for(snapshot, "shop", {"app": "cart"}) == ["mesh", "shop"]
    assert issuers_for(snapshot, "billing", {"app": "api"}) == ["billing", "mesh", "root-api"]
    assert issuers_for(snapshot, "istio-system", {}) == ["mesh"]
    assert issuers_for(snapshot, "empty", {}) == ["mesh"]


def test_policies_come_namespace_first_then_oldest_first() -> None:
    snapshot = snapshot_of(
        policy("b", "shop", {"jwtRules": [{"issuer": "x"}]}, created=20.0),
        policy("a", "shop", {"jwtRules": [{"issuer": "x"}]}, created=30.0),
        policy("c", "shop", {"jwtRules": [{"issuer": "x"}]}, created=10.0),
        policy("root", "istio-system", {"jwtRules": [{"issuer": "x"}]}, created=1.0),
    )
    assert [c.name for c in policies_for_workload(snapshot, "shop", {})] == ["c", "b", "a", "root"]


def test_rules_are_sorted_by_issuer_keeping_the_order_of_one_issuer() -> None:
    """Istio sorts the workload's rules by issuer so the filter is the same whatever the order
    policies were found in; two rules of one issuer keep theirs."""
    snapshot = snapshot_of(
        policy("one", "shop", {"jwtRules": [{"issuer": "zeta"}, {"issuer": "alpha", "fromParams": ["first"]}]}, 1.0),
        policy("two", "shop", {"jwtRules": [{"issuer": "alpha", "fromParams": ["second"]}]}, 2.0),
    )
    rules = jwt_rules_for_workload(snapshot, "shop", {})
    assert [(r.issuer, list(r.from_params)) for r in rules] == [
        ("alpha", ["first"]),
        ("alpha", ["second"]),
        ("zeta", []),
    ]


def test_a_policy_with_a_target_ref_applies_to_no_workload() -> None:
    """ShouldAttachPolicy: targetRefs attach to Gateway API gateways and waypoints only; for any
    other proxy Istio ignores the policy altogether."""
    snapshot = snapshot_of(
        policy(
            "gw",
            "shop",
            {
                "targetRef": {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"},
                "jwtRules": [{"issuer": "gw"}],
            },
        ),
        policy("gws", "shop", {"targetRefs": [{"kind": "Service", "name": "api"}], "jwtRules": [{"issuer": "svc"}]}),
    )
    assert jwt_rules_for_workload(snapshot, "shop", {"app": "api"}) == ()


def test_no_policy_no_rules_no_filter() -> None:
    snapshot = snapshot_of()
    assert jwt_rules_for_workload(snapshot, "shop", {}) == ()
    assert build_jwt_authn(()) is None and jwt_authn_filter(()) is None


# -- each field as Istio sets it ----------------------------------------------------------------


FULL_RULE = rule(
    issuer="https://issuer.example.com",
    audiences=["bookstore_android.apps.example.com", "bookstore_web.apps.example.com"],
    jwksUri="https://keys.example.com/.well-known/jwks.json",
    fromHeaders=[{"name": "x-jwt-assertion", "prefix": "Bearer "}, {"name": "x-token"}],
    fromParams=["my_token"],
    fromCookies=["session"],
    outputPayloadToHeader="x-jwt-payload",
    outputClaimToHeaders=[{"header": "x-jwt-sub", "claim": "sub"}, {"header": "x-jwt-group", "claim": "groups"}],
    forwardOriginalToken=True,
    timeout="2s",
)


def test_every_field_of_a_rule_lands_in_its_provider() -> None:
    provider = build_provider(FULL_RULE)
    expected = config_pb2.JwtProvider(
        issuer="https://issuer.example.com",
        audiences=["bookstore_android.apps.example.com", "bookstore_web.apps.example.com"],
        forward=True,
        forward_payload_header="x-jwt-payload",
        payload_in_metadata=jwt_metadata.PAYLOAD,
        from_params=["my_token"],
        from_cookies=["session"],
        from_headers=[
            config_pb2.JwtHeader(name="x-jwt-assertion", value_prefix="Bearer "),
            config_pb2.JwtHeader(name="x-token"),
        ],
        claim_to_headers=[
            config_pb2.JwtClaimToHeader(header_name="x-jwt-sub", claim_name="sub"),
            config_pb2.JwtClaimToHeader(header_name="x-jwt-group", claim_name="groups"),
        ],
    )
    expected.normalize_payload_in_metadata.space_delimited_claims.extend(["permission", "scope"])
    remote = expected.remote_jwks
    remote.http_uri.uri = "https://keys.example.com/.well-known/jwks.json"
    remote.http_uri.cluster = "outbound|443||keys.example.com"
    remote.http_uri.timeout.seconds = 2
    remote.cache_duration.seconds = 300
    assert provider == expected


def test_a_minimal_rule_reads_envoys_default_locations_and_keeps_the_token_out_of_the_upstream() -> None:
    """No fromHeaders/fromParams: Envoy reads `Authorization: Bearer` and `access_token`, the
    locations the API documents; forwardOriginalToken false: Envoy strips the token."""
    provider = build_provider(rule(issuer="issuer-foo", jwks='{"keys": []}'))
    assert not provider.from_headers and not provider.from_params and not provider.from_cookies
    assert not provider.forward and not provider.forward_payload_header and not provider.claim_to_headers
    assert not provider.audiences and not provider.clear_route_cache
    assert provider.local_jwks.inline_string == '{"keys": []}'
    assert provider.payload_in_metadata == jwt_metadata.PAYLOAD


def test_remote_key_sets_wait_five_seconds_unless_the_rule_says() -> None:
    http = build_provider(rule(issuer="a", jwksUri="http://keys.internal:8080/jwks")).remote_jwks
    assert http.http_uri.cluster == "outbound|8080||keys.internal"
    assert http.http_uri.timeout.ToTimedelta().total_seconds() == 5
    assert http.cache_duration.seconds == 300


def test_inline_jwks_wins_over_jwks_uri() -> None:
    """The API: "Only one of jwks_uri and jwks should be used. jwks_uri will be ignored if it
    does" (and istiod, by default, inlines `jwks` when it is given)."""
    provider = build_provider(rule(issuer="a", jwks='{"keys": []}', jwksUri="https://keys.example.com/jwks"))
    assert provider.WhichOneof("jwks_source_specifier") == "local_jwks"
    assert jwks_clusters([rule(issuer="a", jwks='{"keys": []}', jwksUri="https://keys.example.com/jwks")]) == []


def test_a_rule_without_keys_gets_a_key_set_that_verifies_nothing() -> None:
    """istiod resolves such a rule's keys through OpenID discovery and, until it has them, sends
    a key set no token verifies against; meshctl does not fetch, so it sends that for good."""
    provider = build_provider(rule(issuer="https://accounts.example.com"))
    assert provider.local_jwks.inline_string == UNRESOLVED_JWKS
    keys = json.loads(UNRESOLVED_JWKS)["keys"]
    assert [(k["kty"], k["crv"]) for k in keys] == [("EC", "P-256")] and "d" not in keys[0]


def test_gateways_clear_the_route_cache() -> None:
    """BuildHTTP: JwtFilter(proxy.Type != SidecarProxy): routes on a gateway may match claims."""
    config = build_jwt_authn([rule(issuer="a")], clear_route_cache=True)
    assert config is not None and config.providers["origins-0"].clear_route_cache


def test_one_rule_requires_its_provider_or_no_token() -> None:
    config = build_jwt_authn([rule(issuer="a")])
    assert config is not None
    assert config.bypass_cors_preflight and not config.providers["origins-0"].failed_status_in_metadata
    (requirement,) = config.rules
    assert requirement.match.prefix == "/"
    assert json_format.MessageToDict(requirement.requires) == {
        "requiresAny": {"requirements": [{"providerName": "origins-0"}, {"allowMissing": {}}]}
    }


def test_several_rules_accept_any_valid_token_and_reject_any_invalid_one() -> None:
    config = build_jwt_authn([rule(issuer="a"), rule(issuer="b")])
    assert config is not None and sorted(config.providers) == ["origins-0", "origins-1"]
    assert [config.providers[n].issuer for n in ("origins-0", "origins-1")] == ["a", "b"]
    (requirement,) = config.rules
    either = [
        {"requiresAny": {"requirements": [{"providerName": n}, {"allowMissing": {}}]}}
        for n in ("origins-0", "origins-1")
    ]
    assert json_format.MessageToDict(requirement.requires) == {
        "requiresAny": {
            "requirements": [
                {"providerName": "origins-0"},
                {"providerName": "origins-1"},
                {"requiresAll": {"requirements": either}},
            ]
        }
    }


def test_a_required_rule_is_anded_without_allow_missing_and_the_shortcut_goes() -> None:
    """istio/istio#60830: REQUIRED -> the bare provider; mixed -> AND(P0, OR(P1, missing));
    no outer alternatives, so the optional token cannot stand in for the required one."""
    config = build_jwt_authn([rule(issuer="a", presence="REQUIRED"), rule(issuer="b")])
    assert config is not None
    (requirement,) = config.rules
    assert json_format.MessageToDict(requirement.requires) == {
        "requiresAll": {
            "requirements": [
                {"providerName": "origins-0"},
                {"requiresAny": {"requirements": [{"providerName": "origins-1"}, {"allowMissing": {}}]}},
            ]
        }
    }
    alone = build_jwt_authn([rule(issuer="a", presence="REQUIRED")])
    assert alone is not None and json_format.MessageToDict(alone.rules[0].requires) == {"providerName": "origins-0"}


def test_the_filter_is_named_as_istio_names_it() -> None:
    http_filter = jwt_authn_filter([FULL_RULE])
    assert http_filter is not None and http_filter.name == FILTER_NAME == "envoy.filters.http.jwt_authn"
    unpacked = config_pb2.JwtAuthentication()
    assert http_filter.typed_config.Unpack(unpacked)
    assert unpacked == build_jwt_authn([FULL_RULE])


# -- the clusters remote key sets come through --------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "host", "port", "tls"),
    [
        ("https://keys.example.com/.well-known/jwks.json", "keys.example.com", 443, True),
        ("http://keys.example.com/jwks", "keys.example.com", 80, False),
        ("https://keys.example.com:8443/jwks", "keys.example.com", 8443, True),
        ("https://Keys.Example.com/jwks", "Keys.Example.com", 443, True),
        ("https://[2001:db8::1]:9443/jwks", "2001:db8::1", 9443, True),
        ("http://user:secret@10.0.0.7:8080/jwks", "10.0.0.7", 8080, False),
    ],
)
def test_jwks_uris_are_taken_apart_as_istio_parse_jwks_uri(uri: str, host: str, port: int, tls: bool) -> None:
    parsed = parse_jwks_uri(uri)
    assert parsed is not None and (parsed.host, parsed.port, parsed.tls) == (host, port, tls)
    assert cluster_name(parsed) == f"outbound|{port}||{host}"


@pytest.mark.parametrize(
    "uri",
    [
        "ftp://keys.example.com/jwks",
        "keys.example.com/jwks",
        "https:///jwks",
        "https://h:0/",
        "https://h:70000/",
        "https://h:8a/",
        # Go's parser takes these; Envoy's jwt_authn filter refuses them (its listener with them).
        "http://keys.example.com:/jwks",
        "http://a|b:80/",
        "http://a b/jwks",
        "http://keys.example.com/a b",
        "http://a\x00b/",
        "http://ex\u00e9.com/",
        "http://keys.example.com/\u00e9",
        "http://u@v@keys.example.com/",
        "http://keys.example.com#fragment",
        "http://key_s.example.com/",
    ],
)
def test_unusable_jwks_uris_are_refused(uri: str) -> None:
    assert parse_jwks_uri(uri) is None


def test_an_https_key_server_is_reached_by_dns_with_tls_checked_against_the_system_cas() -> None:
    jwks = parse_jwks_uri("https://keys.example.com/.well-known/jwks.json")
    assert jwks is not None
    cluster = build_jwks_cluster(jwks, family="v4", connect_timeout=3.0)
    assert cluster.name == "outbound|443||keys.example.com"
    assert discovery_type(cluster) == "LOGICAL_DNS"
    assert cluster.connect_timeout.seconds == 3
    (address,) = [
        e.endpoint.address.socket_address for le in cluster.load_assignment.endpoints for e in le.lb_endpoints
    ]
    assert (address.address, address.port_value) == ("keys.example.com", 443)
    context = tls_pb2.UpstreamTlsContext()
    assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
    assert cluster.transport_socket.typed_config.Unpack(context)
    assert context.sni == "keys.example.com"
    validation = context.common_tls_context.validation_context
    assert validation.trusted_ca.filename == SYSTEM_CA_BUNDLE
    (san,) = validation.match_typed_subject_alt_names
    assert san.matcher.exact == "keys.example.com"


def test_an_http_key_server_at_an_address_is_a_static_plaintext_cluster() -> None:
    jwks = parse_jwks_uri("http://127.0.0.1:9000/jwks")
    assert jwks is not None
    cluster = build_jwks_cluster(jwks)
    assert discovery_type(cluster) == "STATIC" and not cluster.HasField("transport_socket")


def test_one_cluster_per_key_server() -> None:
    rules = [
        rule(issuer="a", jwksUri="https://keys.example.com/a.json"),
        rule(issuer="b", jwksUri="https://keys.example.com/b.json"),
        rule(issuer="c", jwksUri="http://127.0.0.1:9000/jwks"),
        rule(issuer="d", jwks='{"keys": []}'),
    ]
    assert [c.name for c in jwks_clusters(rules)] == ["outbound|443||keys.example.com", "outbound|9000||127.0.0.1"]


# -- real Envoy accepts what is generated --------------------------------------------------------


def static_listener(
    port: int, rules: Sequence[JWTRule], upstream: str, *, clear_route_cache: bool = False
) -> listener_pb2.Listener:
    """A listener whose connection manager runs the rules' jwt_authn filter before the router
    and routes everything to `upstream`."""
    route_config = route_pb2.RouteConfiguration(name="jwt-test")
    host = route_config.virtual_hosts.add(name="all", domains=["*"])
    route = host.routes.add()
    route.match.prefix = "/"
    route.route.cluster = upstream
    hcm = http_connection_manager(stat_prefix="jwt_test", route_config=route_config)
    jwt_filter = jwt_authn_filter(rules, clear_route_cache=clear_route_cache)
    assert jwt_filter is not None
    hcm.http_filters.insert(0, jwt_filter)
    listener = listener_pb2.Listener(name=f"127.0.0.1_{port}")
    listener.address.CopyFrom(
        address_pb2.Address(socket_address=address_pb2.SocketAddress(address="127.0.0.1", port_value=port))
    )
    chain = listener.filter_chains.add()
    chain.filters.append(listener_components_pb2.Filter(name="envoy.filters.network.http_connection_manager"))
    chain.filters[0].typed_config.Pack(hcm)
    return listener


def static_cluster(name: str, host: str, port: int) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.STATIC)
    cluster.connect_timeout.seconds = 1
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    endpoint = assignment.endpoints.add().lb_endpoints.add().endpoint
    endpoint.address.socket_address.address = host
    endpoint.address.socket_address.port_value = port
    cluster.load_assignment.CopyFrom(assignment)
    return cluster


def resources(listener: listener_pb2.Listener, clusters: Sequence[cluster_pb2.Cluster]) -> dict[str, list[Message]]:
    return {types.CLUSTER: list(clusters), types.LISTENER: [listener]}


@needs_envoy
@pytest.mark.parametrize(
    "rules",
    [
        pytest.param([FULL_RULE], id="every-field"),
        pytest.param([rule(issuer="issuer-foo", jwks=UNRESOLVED_JWKS)], id="inline-jwks"),
        pytest.param([rule(issuer="https://accounts.example.com")], id="keys-unknown"),
        pytest.param(
            [
                rule(issuer="a", jwksUri="https://keys.example.com/a.json", timeout="1.5s"),
                rule(issuer="b", jwksUri="http://127.0.0.1:9000/jwks", fromCookies=["token"]),
                rule(
                    issuer="c",
                    jwksUri="https://[2001:db8::1]/jwks",
                    outputClaimToHeaders=[{"header": "x-c", "claim": "c"}],
                ),
                rule(issuer="d", jwks=UNRESOLVED_JWKS, fromHeaders=[{"name": "x-d"}]),
            ],
            id="several-providers-and-key-servers",
        ),
    ],
)
@pytest.mark.parametrize("gateway", [False, True], ids=["sidecar", "gateway"])
def test_envoy_accepts_the_filter_and_the_key_clusters(rules: list[JWTRule], gateway: bool) -> None:
    listener = static_listener(15006, rules, "inbound|8080||", clear_route_cache=gateway)
    clusters = [static_cluster("inbound|8080||", "127.0.0.1", 8080), *jwks_clusters(rules, family="v4")]
    validate_config(bootstrap(resources(listener, clusters)))


# -- real Envoy enforces it ---------------------------------------------------------------------


class _JwksHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@dataclass
class Proxy:
    port: int
    backend: Backend

    def get(self, headers: Mapping[str, str] | None = None, *, method: str = "GET", path: str = "/") -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE)
        try:
            conn.request(method, path, headers=dict(headers or {}))
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()


ISSUER_A = "https://a.example.com"
ISSUER_B = "b@example.com"
ISSUER_REMOTE = "https://remote.example.com"
AUDIENCE = "bookstore"


@dataclass(frozen=True)
class Keys:
    a: SigningKey
    b: SigningKey
    remote: SigningKey
    stranger: SigningKey


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(*(SigningKey.generate(kid) for kid in ("a", "b", "remote", "a")))


def claims(issuer: str, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": issuer, "sub": "alice", "aud": AUDIENCE, "iat": now, "exp": now + 600, **extra}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def proxy(keys: Keys) -> Iterator[Proxy]:
    """Envoy in front of a backend, with three rules: ISSUER_A (inline keys, claims to headers,
    payload to a header, audience checked), ISSUER_B (inline keys, read from `x-b-token`) and
    ISSUER_REMOTE (keys fetched by Envoy from an HTTP key server through its generated cluster)."""
    with ExitStack() as stack:
        jwks_server = ThreadingHTTPServer(("127.0.0.1", 0), _JwksHandler)
        jwks_server.RequestHandlerClass = type("Handler", (_JwksHandler,), {"body": keys.remote.jwks().encode()})
        threading.Thread(target=jwks_server.serve_forever, args=(0.05,), daemon=True).start()
        stack.callback(jwks_server.server_close)
        stack.callback(jwks_server.shutdown)
        backend = stack.enter_context(Backend("api"))
        rules = [
            rule(
                issuer=ISSUER_A,
                audiences=[AUDIENCE],
                jwks=keys.a.jwks(),
                outputClaimToHeaders=[
                    {"header": "x-jwt-sub", "claim": "sub"},
                    {"header": "x-jwt-group", "claim": "group"},
                ],
                outputPayloadToHeader="x-jwt-payload",
            ),
            rule(issuer=ISSUER_B, jwks=keys.b.jwks(), fromHeaders=[{"name": "x-b-token"}], forwardOriginalToken=True),
            rule(issuer=ISSUER_REMOTE, jwksUri=f"http://127.0.0.1:{jwks_server.server_address[1]}/jwks.json"),
        ]
        rules.sort(key=lambda r: r.issuer)
        port = free_port()
        listener = static_listener(port, rules, "backend")
        clusters = [static_cluster("backend", "127.0.0.1", backend.port), *jwks_clusters(rules)]
        envoy = stack.enter_context(EnvoyProcess(bootstrap(resources(listener, clusters))))
        stack.callback(lambda: print(f"--- envoy log:\n{envoy.log()[-6000:]}"))
        front = Proxy(port, backend)
        _wait_until_serving(front)
        yield front


def _wait_until_serving(proxy: Proxy) -> None:
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = proxy.get()
            if last == 200:
                return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"envoy did not serve within {DEADLINE:.0f}s: {last!r}")


@pytest.mark.e2e
@pytest.mark.slow
@needs_envoy
@envoy_log_left_open
class TestEnvoyEnforcesRequestAuthentication:
    def test_a_valid_token_passes_and_its_claims_reach_the_backend(self, proxy: Proxy, keys: Keys) -> None:
        token = keys.a.token(claims(ISSUER_A, group="admins"))
        assert proxy.get(bearer(token)) == 200
        seen = proxy.backend.last_headers
        assert (seen["x-jwt-sub"], seen["x-jwt-group"]) == ("alice", "admins")
        payload = json.loads(base64.urlsafe_b64decode(seen["x-jwt-payload"] + "=" * (-len(seen["x-jwt-payload"]) % 4)))
        assert payload["iss"] == ISSUER_A and payload["group"] == "admins"
        assert "authorization" not in seen, "forwardOriginalToken is false: Envoy strips the token"

    def test_a_request_without_a_token_passes(self, proxy: Proxy) -> None:
        assert proxy.get() == 200
        assert "x-jwt-sub" not in proxy.backend.last_headers

    @pytest.mark.parametrize(
        "case", ["expired", "not-yet-valid", "signed-by-another-key", "tampered", "unknown-issuer", "garbage"]
    )
    def test_an_invalid_token_is_rejected_with_401(self, proxy: Proxy, keys: Keys, case: str) -> None:
        now = int(time.time())
        token = {
            "expired": lambda: keys.a.token(claims(ISSUER_A, iat=now - 7200, exp=now - 3600)),
            "not-yet-valid": lambda: keys.a.token(claims(ISSUER_A, nbf=now + 3600)),
            "signed-by-another-key": lambda: keys.stranger.token(claims(ISSUER_A)),
            "tampered": lambda: _tampered(keys.a.token(claims(ISSUER_A))),
            "unknown-issuer": lambda: keys.a.token(claims("https://unknown.example.com")),
            "garbage": lambda: "not.a.jwt",
        }[case]()
        served = proxy.backend.served
        assert proxy.get(bearer(token)) == 401
        assert proxy.backend.served == served

    def test_a_token_for_another_audience_is_forbidden(self, proxy: Proxy, keys: Keys) -> None:
        """Envoy answers a verified token whose `aud` is not among the rule's audiences with 403
        (its JwtAudienceNotAllowed), in Istio as here."""
        served = proxy.backend.served
        assert proxy.get(bearer(keys.a.token(claims(ISSUER_A, aud="someone-else")))) == 403
        assert proxy.backend.served == served

    def test_each_rule_reads_its_own_location(self, proxy: Proxy, keys: Keys) -> None:
        """ISSUER_B's tokens come in `x-b-token` and are forwarded (forwardOriginalToken); in the
        Authorization header no rule of that issuer looks for them."""
        token = keys.b.token(claims(ISSUER_B))
        assert proxy.get({"x-b-token": token}) == 200
        assert proxy.backend.last_headers["x-b-token"] == token
        assert proxy.get(bearer(token)) == 401
        assert proxy.get({"x-b-token": keys.stranger.token(claims(ISSUER_B))}) == 401

    def test_keys_fetched_by_envoy_from_the_jwks_uri_verify_tokens(self, proxy: Proxy, keys: Keys) -> None:
        assert proxy.get(bearer(keys.remote.token(claims(ISSUER_REMOTE)))) == 200
        assert proxy.get(bearer(keys.stranger.token(claims(ISSUER_REMOTE)))) == 401

    def test_a_cors_preflight_passes_without_checking_the_token(self, proxy: Proxy) -> None:
        """bypass_cors_preflight, as Istio sets it: browsers send no credentials on a preflight."""
        headers = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "GET", **bearer("not.a.jwt")}
        assert proxy.get(headers, method="OPTIONS") != 401


def _tampered(token: str) -> str:
    head, payload, signature = token.split(".")
    claims_ = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims_["sub"] = "mallory"
    return f"{head}.{b64url(json.dumps(claims_).encode())}.{signature}"
