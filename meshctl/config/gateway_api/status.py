"""Gateway API status conditions, as Istio writes them, for users who have no cluster to read them.

Istio reports what became of each Gateway API resource in its `status`: a route's `Accepted`
and `ResolvedRefs` per parent, a Gateway's listeners' `Accepted`, `ResolvedRefs` and
`Programmed`. meshctl has no status to write, so each condition that is False (something the
user must fix) becomes a finding at the field it is about, with Istio's type and reason, and
each route that did attach is kept as an `Attachment` for `dump` and `/debug/configz`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from meshctl.config.findings import FieldPath, Severity
from meshctl.config.model import ConfigKey

ACCEPTED: Final = "Accepted"
RESOLVED_REFS: Final = "ResolvedRefs"
PROGRAMMED: Final = "Programmed"
CONFLICTED: Final = "Conflicted"

# Reasons, as in the Gateway API and Istio.
NO_MATCHING_PARENT: Final = "NoMatchingParent"
NOT_ALLOWED_BY_LISTENERS: Final = "NotAllowedByListeners"
NO_MATCHING_LISTENER_HOSTNAME: Final = "NoMatchingListenerHostname"
UNSUPPORTED_VALUE: Final = "UnsupportedValue"
REF_NOT_PERMITTED: Final = "RefNotPermitted"
BACKEND_NOT_FOUND: Final = "BackendNotFound"
INVALID_KIND: Final = "InvalidKind"
INVALID_CERTIFICATE_REF: Final = "InvalidCertificateRef"
INVALID_ROUTE_KINDS: Final = "InvalidRouteKinds"
UNSUPPORTED_PROTOCOL: Final = "UnsupportedProtocol"
PROTOCOL_CONFLICT: Final = "ProtocolConflict"
INVALID_CLASS: Final = "InvalidParameters"

#: The finding code of each condition type.
CODES: Final = {ACCEPTED: "MC0801", RESOLVED_REFS: "MC0802", PROGRAMMED: "MC0803", CONFLICTED: "MC0804"}


@dataclass(frozen=True, slots=True)
class Condition:
    """A condition that is False: `key` is the Gateway API resource, `path` the field at fault."""

    key: ConfigKey
    path: FieldPath
    type: str
    reason: str
    message: str
    severity: Severity = Severity.WARNING

    @property
    def code(self) -> str:
        return CODES[self.type]

    def text(self) -> str:
        return f"{self.type}=False ({self.reason}): {self.message}"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A route bound to one listener of a Gateway (`listener` is None for the mesh, GAMMA)."""

    route: ConfigKey
    gateway: ConfigKey | None
    listener: str | None
    #: The host the route answers for there (`*` when the route names none).
    hosts: tuple[str, ...]
