"""Istio's host names: exact hosts, `*.suffix` wildcards, and short names relative to a namespace.

Every part of meshctl that compares hosts (analysis, sidecar scope, route and cluster
generation) uses these, so a host means the same thing everywhere.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final


def host_matches(pattern: str, host: str) -> bool:
    """True when `pattern` (an exact host, `*.suffix`, or `*`) covers `host`; a wildcard host is
    covered by a wider wildcard (`*.a.com` covers `*.b.a.com`)."""
    if pattern in ("*", host):
        return True
    if pattern.startswith("*"):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return False


def hosts_overlap(a: str, b: str) -> bool:
    return host_matches(a, b) or host_matches(b, a)


def is_short_name(host: str) -> bool:
    """A host with no dot other than `*`: Kubernetes users write `reviews` for `reviews.<ns>...`."""
    return "." not in host and host != "*"


def resolve_host(host: str, namespace: str, known: Iterable[str]) -> list[str]:
    """The hosts `host`, as written in `namespace`, stands for among `known` service hosts.

    A short name `reviews` in namespace `bookinfo` stands for every known host that starts with
    `reviews.bookinfo.` (`reviews.bookinfo.mesh`, `reviews.bookinfo.svc.cluster.local`), and for
    itself. Any other host stands for itself; wildcards are matched by the caller.
    """
    if not is_short_name(host):
        return [host]
    prefix = f"{host}.{namespace}."
    return [host, *sorted(h for h in known if h.startswith(prefix))]


def most_specific(pattern_hosts: Iterable[str], host: str) -> str | None:
    """Of the patterns that cover `host`, the most specific: the exact one, else the longest
    wildcard (Istio's rule for picking a VirtualService or DestinationRule for a service)."""
    best: str | None = None
    for p in pattern_hosts:
        if not host_matches(p, host):
            continue
        if p == host:
            return p
        if best is None or len(p) > len(best):
            best = p
    return best


_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4: Final = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def is_ip(address: str) -> bool:
    """True for an IPv4 or IPv6 address (not a CIDR, not a hostname)."""
    # Most addresses in a mesh are plain IPv4, which one regex settles; anything else (IPv6, or
    # not an address) is left to `ipaddress`, the reference.
    if _IPV4.fullmatch(address) is not None:
        return True
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True
