"""Join tokens: a VM's first xDS client certificate without copying a key to it.

`meshctl ca token --proxy NAME.NAMESPACE --ttl 1h` mints a token on the control plane; the VM
makes its key and exchanges the token for a certificate (`meshctl ca renew --token`), once.

A token is `mjt1.PAYLOAD.MAC`: PAYLOAD is base64url JSON naming the workload, the end of its
validity and a random id; MAC is HMAC-SHA256 over `mjt1.PAYLOAD` with a key derived from the CA's
private key (HKDF, `CertificateAuthority.derive_key`). So every server that holds the CA (the
same `--ca-dir`, or the same state directory) verifies a token any of them minted, no other
secret is kept or distributed, and replacing the CA voids the tokens it minted. The payload is
not secret (it names a workload); the MAC is what a holder proves.

Single use: the first exchange records the token's id under the state directory
(`join-tokens/ID`, made with `O_EXCL`-like linking, so of two exchanges racing one wins) and any
later one is refused. Records outlive their token only until the next exchange prunes them.
Replicas that share the CA but not the state directory each keep their own records: a token
could then be used once per replica within its TTL, which is why tokens are short-lived (an hour
by default).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from meshctl.errors import CredentialError
from meshctl.security.files import PRIVATE_MODE, write_atomically

PREFIX: Final = "mjt1"
#: What the CA key is derived for: a new use gets a new label, never this key.
PURPOSE: Final = b"meshctl join token v1"
#: Where used tokens are recorded, under the state directory.
USED_DIR: Final = "join-tokens"
#: The most a token may be (a few hundred bytes are enough).
MAX_TOKEN: Final = 2048
DEFAULT_TTL: Final = datetime.timedelta(hours=1)


class TokenRefused(Exception):
    """A token that gets nothing; the message is the one line the caller sees."""


@dataclass(frozen=True, slots=True)
class JoinToken:
    workload: str  # NAME.NAMESPACE
    expires: datetime.datetime
    id: str

    @property
    def name(self) -> str:
        return self.workload.partition(".")[0]

    @property
    def namespace(self) -> str:
        return self.workload.partition(".")[2]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint(key: bytes, workload: str, ttl: datetime.timedelta, now: datetime.datetime | None = None) -> str:
    """A token for `workload` (NAME.NAMESPACE) valid for `ttl`, MACed with `key`."""
    at = now or datetime.datetime.now(datetime.UTC)
    payload = {"workload": workload, "exp": int((at + ttl).timestamp()), "id": secrets.token_hex(16)}
    body = f"{PREFIX}.{_b64(json.dumps(payload, separators=(',', ':')).encode())}"
    return f"{body}.{_b64(hmac.new(key, body.encode(), hashlib.sha256).digest())}"


def verify(key: bytes, token: str, now: datetime.datetime | None = None) -> JoinToken:
    """The token's claims once its MAC and validity check; raises TokenRefused. It is not marked
    used here (`use`)."""
    token = token.strip()
    parts = token.split(".")
    if len(token) > MAX_TOKEN or len(parts) != 3 or parts[0] != PREFIX:
        raise TokenRefused("not a meshctl join token")
    body = f"{parts[0]}.{parts[1]}"
    expected = hmac.new(key, body.encode(), hashlib.sha256).digest()
    try:
        mac = _unb64(parts[2])
        claims = json.loads(_unb64(parts[1]))
        parsed = JoinToken(
            str(claims["workload"]),
            datetime.datetime.fromtimestamp(int(claims["exp"]), datetime.UTC),
            str(claims["id"]),
        )
    except (ValueError, KeyError, TypeError, OverflowError):
        raise TokenRefused("not a meshctl join token") from None
    if not hmac.compare_digest(mac, expected):
        raise TokenRefused("the join token was not minted by this mesh's CA")
    if not all(c in "0123456789abcdef" for c in parsed.id) or len(parsed.id) != 32:
        raise TokenRefused("not a meshctl join token")
    at = now or datetime.datetime.now(datetime.UTC)
    if at >= parsed.expires:
        raise TokenRefused(f"the join token for {parsed.workload} expired at {parsed.expires.isoformat()}")
    return parsed


def use(state_dir: Path, token: JoinToken, now: datetime.datetime | None = None) -> None:
    """Record `token` as used; raises TokenRefused when it already was (CredentialError when the
    state directory cannot be written). Expired records are pruned first."""
    directory = state_dir / USED_DIR
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CredentialError(f"{directory}: cannot record used join tokens: {exc.strerror or exc}") from None
    _prune(directory, now or datetime.datetime.now(datetime.UTC))
    try:
        write_atomically(
            directory / token.id, f"{int(token.expires.timestamp())}\n".encode(), mode=PRIVATE_MODE, replace=False
        )
    except FileExistsError:
        raise TokenRefused(f"the join token for {token.workload} was used already: a token is good once") from None
    except OSError as exc:
        raise CredentialError(f"{directory}: cannot record used join tokens: {exc.strerror or exc}") from None


def _prune(directory: Path, now: datetime.datetime) -> None:
    """Forget records whose token has expired: it is refused for its expiry anyway."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                with open(entry.path, "rb") as f:
                    expires = int(f.read(32).strip() or b"0")
                if expires < now.timestamp():
                    os.unlink(entry.path)
            except (OSError, ValueError):
                continue
