"""Bounds Envoy puts on values that flow from Istio YAML into its config, which Istio's own
validation does not check: past them a proxy refuses the whole resource (a NACK: it keeps stale
config), or meshctl could not even build it. Each was found against Envoy itself (`envoy --mode
validate` on generated config) and is checked where the value is read, so that `meshctl validate`
and the loader refuse what every proxy would.

- Durations: Envoy turns every duration into int64 nanoseconds, so it takes fewer than
  9,223,372,036 seconds (about 292 years), well inside protobuf's own range (315,576,000,000 s).
  Fields Envoy holds as 32-bit seconds (TCP keepalive time and interval, a JWKS fetch timeout)
  take less again.
- Header names and values Envoy adds to requests or responses: at most 16 KiB each.
- A ring hash's minimum size: at most 8,388,608.
- Paths, hosts and prefixes Envoy writes into requests (rewrites, redirects, JWT header
  prefixes): no NUL, CR or LF.
- Certificate pins (`verifyCertificateHash`, `verifyCertificateSpki`): SHA-256 digests in the
  form Envoy reads.
- Trust domains and service accounts become SPIFFE URIs in certificates and in the matchers of
  every proxy's config: DNS names as Istio and Kubernetes take them.
"""

from __future__ import annotations

import re
from typing import Final

#: Envoy refuses a duration of this many seconds or more (int64 nanoseconds).
DURATION_LIMIT_SECONDS: Final = 9_223_372_036
#: A field Envoy holds as uint32 seconds takes at most this.
UINT32_MAX: Final = 2**32 - 1
#: `HeaderValue.key` and `.value`: Envoy's `max_bytes` on a header it adds.
MAX_HEADER_BYTES: Final = 16384
#: `RingHashLbConfig.minimum_ring_size`: at most 8M entries.
MAX_RING_SIZE: Final = 8_388_608

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def duration_limit_problem(nanos: int, text: str) -> str | None:
    """Why Envoy cannot hold a duration of `nanos` (as written: `text`), or None."""
    if abs(nanos) >= DURATION_LIMIT_SECONDS * 1_000_000_000:
        return f'duration "{text}" is longer than Envoy can hold (less than {DURATION_LIMIT_SECONDS}s, about 292 years)'
    return None


def seconds32_problem(seconds: int, what: str) -> str | None:
    """A duration Envoy holds as 32-bit seconds."""
    if seconds > UINT32_MAX:
        return f"{what} of {seconds}s is longer than Envoy can hold here (at most {UINT32_MAX}s, about 136 years)"
    return None


def header_bytes_problem(text: str, what: str) -> str | None:
    """A header name or value Envoy adds: at most `MAX_HEADER_BYTES` bytes."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_HEADER_BYTES:
        return f"{what} is {size} bytes long: Envoy takes at most {MAX_HEADER_BYTES}"
    return None


def line_break_problem(value: str, what: str) -> str | None:
    """Envoy's rule for a value it writes into a request line or header (a path or host rewrite,
    a redirect, a header prefix): no NUL, carriage return or line feed."""
    if any(c in value for c in "\x00\r\n"):
        return f"{what} {value[:60]!r} contains a NUL, carriage return or line feed, which Envoy refuses"
    return None


def ring_size_problem(size: int) -> str | None:
    """A ring hash's minimum size, which Envoy bounds."""
    if size > MAX_RING_SIZE:
        return f"minimumRingSize {size} is more than Envoy takes (at most {MAX_RING_SIZE})"
    return None


_SHA256_HEX = re.compile(r"[0-9A-Fa-f]{64}|[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31}")
_SHA256_BASE64 = re.compile(r"[A-Za-z0-9+/]{43}=")


def certificate_hash_problem(digest: str) -> str | None:
    """`verifyCertificateHash`: a SHA-256 in hex, bare or colon-separated, as Envoy takes it."""
    if _SHA256_HEX.fullmatch(digest):
        return None
    return f'"{digest[:100]}" is not a hex SHA-256 of a certificate (64 hex digits, colons allowed between pairs)'


def certificate_spki_problem(digest: str) -> str | None:
    """`verifyCertificateSpki`: a SHA-256 of a public key in base64 (44 characters)."""
    if _SHA256_BASE64.fullmatch(digest):
        return None
    return f'"{digest[:100]}" is not a base64 SHA-256 of a public key (44 characters, as Envoy takes it)'


def trust_domain_problem(domain: str) -> str | None:
    """Istio's `ValidateTrustDomain`: dot-separated lowercase DNS-1123 labels (a trailing dot
    allowed). The trust domain is the host of every SPIFFE URI, which must be lowercase."""
    if not domain:
        return "trustDomain must not be empty"
    if len(domain) > 255:
        return f"trustDomain {domain[:40]!r}... is longer than 255 characters"
    labels = domain.split(".")
    if labels[-1] == "" and len(labels) > 1:
        labels = labels[:-1]
    for label in labels:
        if len(label) > 63 or not _DNS1123_LABEL.fullmatch(label):
            return (
                f'trustDomain "{domain}" is invalid: "{label}" is not a lowercase DNS label '
                '(a-z, 0-9 and "-", at most 63 characters), as Istio requires of a trust domain'
            )
    return None


def service_account_name_problem(name: str) -> str | None:
    """A Kubernetes service account name: a DNS-1123 subdomain (lowercase labels joined by dots,
    at most 253 characters). It is the last segment of the workload's SPIFFE URI, so a `/` or an
    uppercase letter would name another identity or none."""
    if len(name) > 253:
        return f"serviceAccount {name[:40]!r}... is longer than 253 characters"
    if not all(_DNS1123_LABEL.fullmatch(label) for label in name.split(".")):
        return (
            f'serviceAccount "{name}" is not a valid service account name: lowercase letters, digits, '
            '"-" and "." (a DNS-1123 subdomain, as Kubernetes names service accounts)'
        )
    return None
