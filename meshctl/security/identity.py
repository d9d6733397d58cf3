"""A workload's identity as Istio writes it in certificates: `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SA`.

The URI SAN of a workload certificate is the only name mTLS peers and authorization policies
compare, so the three parts are checked when an identity is made: a part with a `/` (or an empty
one) would make a URI that names some other workload, or none. The characters allowed are
SPIFFE's: lowercase letters, digits, `.`, `-` and `_` in the trust domain; letters too in the path
segments, which must not be `.` or `..`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshctl.errors import CredentialError

_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]{1,255}")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,253}")
_PREFIX = "spiffe://"


@dataclass(frozen=True, slots=True)
class WorkloadIdentity:
    """Who a workload is: the service account it runs as, in a namespace of a trust domain.

    Made with a part SPIFFE does not allow, it raises CredentialError (it is a name a certificate
    would carry), saying which part is wrong.
    """

    trust_domain: str
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        if not _TRUST_DOMAIN.fullmatch(self.trust_domain):
            raise CredentialError(
                f"trust domain {self.trust_domain!r} is not a SPIFFE trust domain "
                "(lowercase letters, digits, '.', '-' and '_')"
            )
        for what, value in (("namespace", self.namespace), ("service account", self.service_account)):
            if not _SEGMENT.fullmatch(value) or value in {".", ".."}:
                raise CredentialError(
                    f"{what} {value!r} cannot be part of a SPIFFE id (letters, digits, '.', '-' and '_')"
                )

    @property
    def uri(self) -> str:
        """The URI SAN of this workload's certificates, as Istio writes it."""
        return f"{_PREFIX}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @classmethod
    def parse(cls, uri: str) -> WorkloadIdentity | None:
        """The identity `uri` names, or None when it is not Istio's `spiffe://TD/ns/NS/sa/SA`.

        None rather than an exception because a peer's certificate may carry other URI SANs that
        are simply not identities; the caller decides whether a missing one is an error.
        """
        if not uri.startswith(_PREFIX):
            return None
        parts = uri.removeprefix(_PREFIX).split("/")
        if len(parts) != 5 or parts[1] != "ns" or parts[3] != "sa":
            return None
        try:
            return cls(parts[0], parts[2], parts[4])
        except CredentialError:
            return None

    def __str__(self) -> str:
        return self.uri
