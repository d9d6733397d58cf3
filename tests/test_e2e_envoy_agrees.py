"""`meshctl validate` and Envoy agree on what Envoy refuses: each case is generated into a real
proxy config (validation skipped, as if it had slipped through) and given to `envoy --mode
validate`, and Envoy's verdict must be meshctl's. The cases are the edges the checks were
measured on (`config/jwks_uri.py`, `config/validation/jwks.py`,
`config/validation/access_log_format.py`), so an Envoy that reads them differently fails here
first.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from conftest import needs_envoy
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from meshctl.api.security.v1beta1.request_authentication_pb2 import RequestAuthentication
from meshctl.config.jwks_uri import parse_jwks_uri
from meshctl.config.mesh import MeshSettings
from meshctl.config.model import Config, ConfigKey
from meshctl.config.schema import parse_spec
from meshctl.config.validation.access_log_format import access_log_format_problem
from meshctl.config.validation.jwks import jwks_problem
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.model import build_snapshot
from meshctl.testing.builders import configs_from_yaml, proxy_for
from meshctl.testing.envoy import EnvoyError, bootstrap, validate_config, validate_resources
from meshctl.xds.generate import generate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

MESH = """
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: default}
spec:
  hosts: [web.example.com]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-1, namespace: default}
spec:
  address: 10.0.0.5
  labels: {app: web}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: other, namespace: default}
spec:
  hosts: [other.example.com]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.9}]
"""
NODE = "sidecar~10.0.0.5~web-1.default~default.svc.cluster.local"


def envoy_accepts(mesh: MeshSettings | None = None, *extra: Config) -> bool:
    """Whether Envoy takes the config meshctl generates for the web workload's proxy (inbound
    HTTP listener, outbound listener, both with the mesh's access log)."""
    configs = [*configs_from_yaml(MESH), *extra]
    snapshot = build_snapshot(configs, build_file_model(configs), mesh)
    resources = generate(snapshot, proxy_for(snapshot, NODE, {"INTERCEPTION_MODE": "REDIRECT"}))
    try:
        validate_resources(resources)
    except EnvoyError:
        return False
    return True


def with_rule(rule: dict[str, Any]) -> Config:
    """A RequestAuthentication for the workload, past validation (schema only)."""
    spec, issues = parse_spec({"selector": {"matchLabels": {"app": "web"}}, "jwtRules": [rule]}, RequestAuthentication)
    assert not issues
    return Config(ConfigKey("RequestAuthentication", "default", "keys"), "security.istio.io/v1", spec)


def _b64(number: int, size: int | None = None) -> str:
    data = number.to_bytes(size or (number.bit_length() + 7) // 8 or 1, "big")
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_RSA = rsa.generate_private_key(65537, 2048).public_key().public_numbers()
_EC = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
RSA_KEY = {"kty": "RSA", "n": _b64(_RSA.n), "e": "AQAB"}
EC_KEY = {"kty": "EC", "crv": "P-256", "x": _b64(_EC.x, 32), "y": _b64(_EC.y, 32)}

JWKS_URIS = [
    "https://keys.example.com/.well-known/jwks.json",
    "http://keys.example.com:8080/jwks?x=%zz&y=[]",
    "https://[2001:db8::1]:9443/jwks",
    "http://user:pass@10.0.0.7/jwks",
    "http://@keys.example.com/jwks",
    "HTTP://keys.example.com/jwks",
    "http://keys.example.com/a#b",
    "http://a|b:80/",
    "http://a b/jwks",
    "http://keys.example.com/a b",
    "http://a\x00b/",
    "http://ex\u00e9.com/",
    "http://keys.example.com/\u00e9",
    "http://u@v@keys.example.com/",
    "http://keys.example.com#fragment",
    "http://keys.example.com:/jwks",
    "http://key_s.example.com/",
    "http://key~s.example.com/",
]
KEY_SETS = [
    {"keys": [RSA_KEY]},
    {"keys": [EC_KEY]},
    {"keys": [dict(RSA_KEY, alg="PS256")]},
    {"keys": [dict(RSA_KEY, e="Aw")]},
    {"keys": [dict(RSA_KEY, n=_b64((1 << 511) + 1))]},
    {"keys": [dict(RSA_KEY, n=_b64((1 << 16383) + 1))]},
    {"keys": [{"kty": "oct", "k": "c2VjcmV0MQ=="}]},
    {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _b64(5, 32)}]},
    {"keys": [dict(EC_KEY, x=EC_KEY["x"] + "=")]},
    RSA_KEY,
    {"keys": []},
    {"keys": [dict(RSA_KEY, n=_b64(_RSA.n + 1))]},
    {"keys": [dict(RSA_KEY, n=_b64((1 << 510) + 1))]},
    {"keys": [dict(RSA_KEY, n=_b64((1 << 16400) + 1))]},
    {"keys": [dict(RSA_KEY, n=RSA_KEY["n"] + "=")]},
    {"keys": [dict(RSA_KEY, e=_b64(5))]},
    {"keys": [dict(RSA_KEY, alg="ES256")]},
    {"keys": [dict(EC_KEY, crv="secp256k1")]},
    {"keys": [dict(EC_KEY, crv="P-384")]},
    {"keys": [dict(EC_KEY, y=_b64(_EC.y ^ 1, 32))]},
    {"keys": [dict(EC_KEY, alg="ES384")]},
    {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": _b64(5, 31)}]},
    {"keys": [{"kty": "OKP", "crv": "X25519", "x": _b64(5, 32)}]},
    {"keys": [{"kty": "oct", "k": "c2VjcmV0M"}]},
    {"keys": [{"kty": "oct", "k": "c2VjcmV0", "alg": "RS256"}]},
]
FORMATS = [
    "100%% %START_TIME(%s)% %REQ(x-id):5% %REQ(:path):0%",
    "%DYNAMIC_METADATA(a)% %FILTER_STATE(a:PLAIN)% %ENVIRONMENT(HOME)% %METADATA(ROUTE:a)%",
    "%GRPC_STATUS(CAMEL_STRING)% %PATH(WQ)% %CEL(x)% %COMMON_DURATION(DS_RX_BEG:DS_RX_END:ms)%",
    "%UPSTREAM_CLUSTER_RAW% %RESPONSE_FLAGS_LONG% %TRACE_ID% %DOWNSTREAM_PEER_CHAIN_SERIALS%",
    "50%",
    "%start_time%",
    "%REQ%",
    "%REQ(x)",
    "%REQ(x)%%",
    "%REQ(:path):abc%",
    "%FOO(x)%",
    "%RESPONSE_FLAGS(x)%",
    "%BYTES_SENT:5%",
    "%START_TIME(%s):5%",
    "%REQ(a b)%",
    "%REQ(x?y?z)%",
    "%PER_REQUEST_STATE(a)%",
    "%DYNAMIC_METADATA%",
]


@pytest.mark.parametrize("uri", JWKS_URIS)
def test_jwks_uris(uri: str) -> None:
    assert (parse_jwks_uri(uri) is not None) == envoy_takes_jwks_uri(uri), uri


def envoy_takes_jwks_uri(uri: str) -> bool:
    """Envoy's verdict on `uri` as a provider's remote key set URI: the config generated for a
    valid URI, with `uri` put in its place in the filter (the generator itself never writes a URI
    it cannot parse: it falls back to a key set no token verifies)."""
    placeholder = "https://placeholder.example/jwks"
    configs = [*configs_from_yaml(MESH), with_rule({"issuer": "iss", "jwksUri": placeholder})]
    snapshot = build_snapshot(configs, build_file_model(configs))
    boot = bootstrap(generate(snapshot, proxy_for(snapshot, NODE, {"INTERCEPTION_MODE": "REDIRECT"})))
    text = json.dumps(boot)
    assert json.dumps(placeholder) in text
    try:
        validate_config(json.loads(text.replace(json.dumps(placeholder), json.dumps(uri))))
    except EnvoyError:
        return False
    return True


def key_set_ids() -> list[str]:
    """Ids naming each key set by position and its keys' kinds, never by their material: the RSA
    and EC keys are made at import, so ids from their bytes would differ between processes (and
    pytest-xdist's workers must collect the same tests)."""
    ids = []
    for index, key_set in enumerate(KEY_SETS):
        keys = key_set.get("keys", [key_set])
        kinds = "+".join("-".join(str(k.get(f, "")) for f in ("kty", "crv", "alg") if k.get(f)) for k in keys)
        ids.append(f"{index}-{kinds or 'empty'}")
    return ids


@pytest.mark.parametrize("key_set", KEY_SETS, ids=key_set_ids())
def test_inline_key_sets(key_set: dict[str, Any]) -> None:
    text = json.dumps(key_set)
    assert (jwks_problem(text) is None) == envoy_accepts(None, with_rule({"issuer": "iss", "jwks": text})), text


@pytest.mark.parametrize("text", FORMATS)
def test_access_log_formats(text: str) -> None:
    mesh = MeshSettings(access_log_file="/dev/stdout", access_log_format=text)
    assert (access_log_format_problem(text) is None) == envoy_accepts(mesh), text


@pytest.mark.parametrize("size", [1, 2, 3, 4, 9, 65537])
def test_maglev_table_sizes(size: int) -> None:
    """Istio takes a maglev table of 1 (its isPrime says yes); Envoy refuses the cluster, so
    meshctl refuses it too (docs/validation.md): meshctl's verdict is Envoy's."""
    from meshctl.api.networking.v1alpha3.destination_rule_pb2 import DestinationRule
    from meshctl.config.loader import load_text  # the verdict `meshctl validate` gives

    spec = {"host": "other.example.com", "trafficPolicy": {"loadBalancer": {"consistentHash": {
        "useSourceIp": True, "maglev": {"tableSize": size}}}}}  # fmt: skip
    parsed, issues = parse_spec(spec, DestinationRule)
    assert not issues
    rule = Config(ConfigKey("DestinationRule", "default", "maglev"), "networking.istio.io/v1", parsed)
    head = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: maglev}\n"
    text = f"{head}spec: {json.dumps(spec)}\n"
    assert load_text(text, "dr.yaml").ok == envoy_accepts(None, rule), size
