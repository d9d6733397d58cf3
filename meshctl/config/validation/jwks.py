"""An inline JSON Web Key Set read as Envoy reads it (its jwt_authn filter, through
jwt_verify_lib and BoringSSL): a key set Envoy cannot read makes every proxy with the rule
refuse its listener, so `meshctl validate` refuses it first.

What Envoy requires, measured against it:

- strict JSON (no duplicate member names, no NaN) whose top level is an object with a `keys`
  list holding at least one key; every key must read, the first that does not fails the set;
- each key an object with a string `kty` of RSA, EC, oct or OKP, and an `alg`, when given,
  of its family (RS*/PS*, ES*, HS256/384/512, EdDSA);
- RSA: `n` and `e` in unpadded base64url; `e` 3 or 65537; `n` odd, 512 to 16384 bits;
- EC: `crv` P-256, P-384 or P-521 (matching an ES256/384/512 `alg`), and `x`, `y` a point on it;
- oct: `k` decoding to at least one byte; OKP: `crv` Ed25519 and `x` decoding to 32 bytes.

meshctl keeps Istio's stricter rules where Istio has them: a key set of one bare key, a key
that is not an object and an EC key without `crv` are refused as well.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric import ec

_B64URL = re.compile(r"[A-Za-z0-9_\-]*")
_CURVES: Final = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}
_EC_ALGS: Final = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
_HMAC_ALGS: Final = frozenset({"HS256", "HS384", "HS512"})
_MIN_RSA_BITS, _MAX_RSA_BITS = 512, 16384


class _Refused(ValueError):
    """A key set Envoy would refuse; the message says why."""


def jwks_problem(text: str) -> str | None:
    """Why Envoy (or Istio) would refuse `text` as a rule's `jwks`, or None."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant)
    except _Refused as exc:
        return f"jwks parse error: {exc}"
    except ValueError as exc:
        return f"jwks parse error: not JSON ({exc})"
    if not isinstance(data, dict):
        return 'jwks parse error: a key set is a JSON object with a "keys" list'
    if "keys" not in data:
        return 'jwks parse error: no "keys" list (Envoy reads a key set, not a single key: wrap it as {"keys": [...]})'
    keys = data["keys"]
    if not isinstance(keys, list):
        return 'jwks parse error: "keys" must be a list of keys'
    if not keys:
        return "jwks parse error: the key set has no keys"
    for i, key in enumerate(keys):
        if not isinstance(key, dict):
            return f"jwks parse error: key {i} is not an object"
        try:
            _key(key)
        except _Refused as exc:
            return f"jwks parse error: key {i}: {exc}"
    return None


def _key(key: dict[str, Any]) -> None:
    kty = key.get("kty")
    if not isinstance(kty, str):
        raise _Refused(f"kty must be a string (RSA, EC, oct or OKP), found {kty!r}")
    given = key.get("alg")
    alg = given if isinstance(given, str) else ""  # Envoy ignores an alg that is not a string
    check = {"RSA": _rsa, "EC": _ec, "oct": _oct, "OKP": _okp}.get(kty)
    if check is None:
        raise _Refused(f"unknown kty {kty!r} (use RSA, EC, oct or OKP)")
    check(key, alg)


def _rsa(key: dict[str, Any], alg: str) -> None:
    if alg and not alg.startswith(("RS", "PS")):
        raise _Refused(f'alg "{alg}" is not an RSA algorithm (RS256, PS256, ...)')
    n = int.from_bytes(_decoded(key, "n", padded=False), "big")
    e = int.from_bytes(_decoded(key, "e", padded=False), "big")
    if e not in (3, 65537):
        raise _Refused(f"RSA exponent e={e} is not 3 or 65537, the only ones Envoy takes")
    if not n % 2 or not _MIN_RSA_BITS <= n.bit_length() <= _MAX_RSA_BITS:
        raise _Refused(
            f"RSA modulus n ({n.bit_length()} bits{', even' if not n % 2 else ''}) is not a valid key: "
            f"Envoy takes an odd modulus of {_MIN_RSA_BITS} to {_MAX_RSA_BITS} bits"
        )


def _ec(key: dict[str, Any], alg: str) -> None:
    if alg and not alg.startswith("ES"):
        raise _Refused(f'alg "{alg}" is not an EC algorithm (ES256, ES384, ES512)')
    crv = key.get("crv")
    if not isinstance(crv, str) or not crv:
        raise _Refused("an EC key needs crv (P-256, P-384 or P-521)")
    if crv not in _CURVES or (alg and _EC_ALGS.get(alg) != crv):
        detail = f' with alg "{alg}"' if alg and crv in _CURVES else ""
        raise _Refused(f'curve "{crv}"{detail} is not supported: use P-256 (ES256), P-384 (ES384) or P-521 (ES512)')
    x = int.from_bytes(_decoded(key, "x"), "big")
    y = int.from_bytes(_decoded(key, "y"), "big")
    try:
        ec.EllipticCurvePublicNumbers(x, y, _CURVES[crv]).public_key()
    except ValueError:
        raise _Refused(f"x and y are not a point on {crv}") from None


def _oct(key: dict[str, Any], alg: str) -> None:
    if alg and alg not in _HMAC_ALGS:
        raise _Refused(f'alg "{alg}" is not an HMAC algorithm (HS256, HS384, HS512)')
    if not _decoded(key, "k"):
        raise _Refused("k is empty")


def _okp(key: dict[str, Any], alg: str) -> None:
    if alg and alg != "EdDSA":
        raise _Refused(f'alg "{alg}" is not EdDSA')
    if key.get("crv") != "Ed25519":
        raise _Refused(f"curve {key.get('crv')!r} is not supported for an OKP key: use Ed25519")
    if len(_decoded(key, "x")) != 32:
        raise _Refused("x is not a 32-byte Ed25519 public key")


def _decoded(key: dict[str, Any], member: str, *, padded: bool = True) -> bytes:
    """A base64url member: Envoy takes `=` padding on some members and not on RSA's."""
    value = key.get(member)
    if not isinstance(value, str):
        raise _Refused(f"{key.get('kty')} key lacks {member}" if value is None else f"{member} must be a string")
    text = value
    if padded and text.endswith("="):
        stripped = text.rstrip("=")
        if len(text) % 4 or len(text) - len(stripped) > 2:
            raise _Refused(f"{member} is not base64url")
        text = stripped
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        hint = " without = padding" if "=" in text and not padded else ""
        raise _Refused(f"{member} is not base64url{hint} (A-Z, a-z, 0-9, - and _)")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise _Refused(f"{member} is not base64url") from None


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise _Refused(f'member "{name}" is written twice (Envoy refuses the key set)')
        out[name] = value
    return out


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")
