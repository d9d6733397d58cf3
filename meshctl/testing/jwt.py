"""JSON Web Tokens for tests: an RSA key that signs RS256 tokens and publishes its JWKS.

Tokens are made by hand (header.payload.signature, base64url) with `cryptography`, so the tests
need no JWT library, and can make the broken tokens a library would refuse to sign.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class SigningKey:
    """An RSA key that signs RS256 tokens, and its public half as a JWKS."""

    kid: str
    private: rsa.RSAPrivateKey

    @classmethod
    def generate(cls, kid: str) -> SigningKey:
        return cls(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def jwks(self) -> str:
        numbers = self.private.public_key().public_numbers()
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        key = {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid, "n": b64url(n), "e": b64url(e)}
        return json.dumps({"keys": [key]})

    def token(self, claims: Mapping[str, Any], *, kid: str | None = None) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": kid or self.kid}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        signature = self.private.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64url(signature)}"
