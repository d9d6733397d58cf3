"""The Host headers a service answers to, as virtual host domains (Istio's httproute.go).

Clients call a service by many names: its full hostname, with or without the port, its
addresses, and, for Kubernetes-style hosts (`name.ns.svc.cluster.local`), the short forms a
resolver with search domains accepts (`name`, `name.ns`, `name.ns.svc`). Istio generates these
from the proxy's DNS domain (the last part of its node id), and so does meshctl, so a VM that
resolves `reviews` through a search path reaches the same virtual host as a pod would.

Route configurations set `ignore_port_in_host_matching`, as Istio's do (a gRPC client always
sends `host:port`, and a client may call a service on another port than the listener's), so Envoy
matches the Host without its port and domains carry no port (Istio's SidecarIgnorePort and
portNoAppendPortSuffix); each name also answers as an absolute FQDN (`reviews.bookinfo.mesh.`,
Istio's PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN, on by default).

Envoy rejects a route configuration in which two virtual hosts share a domain, so domains are
handed out first come, first served; an expanded short form never takes a name that is itself a
known service's full hostname.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
from functools import lru_cache
from typing import Final

#: Istio's portNoAppendPortSuffix: a port of 0 asks for the names without `:PORT`.
NO_PORT: Final = 0


def ipv6_compliant(host: str) -> str:
    """An IPv6 address in brackets, as it appears in a Host header."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def domain_name(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets; also the name of a virtual host."""
    return f"{ipv6_compliant(host)}:{port}"


def with_port(host: str, port: int) -> list[str]:
    """Istio's appendDomainPort: the host, and `host:port` unless `port` is NO_PORT."""
    if port == NO_PORT:
        return [ipv6_compliant(host)]
    return [ipv6_compliant(host), domain_name(host, port)]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _absolute_fqdn(hostname: str, port: int) -> list[str]:
    """`host.` (and `host.:port` with a port): Istio adds the absolute form of every name but an
    IP address (GenerateAltVirtualHosts, EnableAbsoluteFqdnVhostDomain, istio/istio#56007)."""
    out = [] if _is_ip(hostname) else [f"{hostname}."]
    if port != NO_PORT:
        out.append(domain_name(f"{hostname}.", port))
    return out


def _kubernetes_alt_hosts(hostname: str, port: int, proxy_domain: str) -> list[str]:
    """`name.ns.svc.DOMAIN` seen from a proxy in `ns.svc.DOMAIN` is also `name`, `name.ns` and
    `name.ns.svc`; from another namespace only the forms that keep the namespace."""
    svc_in_host = hostname.find(".svc.")
    if svc_in_host <= 0:
        return []
    first_dot = hostname.find(".")
    if first_dot + 1 >= len(hostname) or first_dot + 1 > svc_in_host:
        return []
    name = hostname[:first_dot]
    name_ns = hostname[:svc_in_host]
    if hostname[first_dot + 1 : svc_in_host] == proxy_domain[: proxy_domain.find(".svc.")]:
        return [*with_port(name, port), *with_port(f"{name_ns}.svc", port), *with_port(name_ns, port)]
    return [*with_port(name_ns, port), *with_port(f"{name_ns}.svc", port)]


def alt_hosts(hostname: str, port: int, proxy_domain: str) -> list[str]:
    """Istio's GenerateAltVirtualHosts: the absolute FQDN of `hostname`, then the shorter names
    that resolve from a proxy whose DNS domain is `proxy_domain`, each with and without the port
    (without it for NO_PORT)."""
    absolute = _absolute_fqdn(hostname, port)
    if ".svc." in proxy_domain:
        suffix = proxy_domain[proxy_domain.find(".svc.") :]
        kube = _kubernetes_alt_hosts(hostname, port, proxy_domain) if hostname.endswith(suffix) else []
        return [*absolute, *kube]
    host_parts = hostname.split(".")
    domain_parts = proxy_domain.split(".") if proxy_domain else []
    shared = 0
    for a, b in zip(reversed(host_parts), reversed(domain_parts), strict=False):
        if a != b:
            break
        shared += 1
    unique = host_parts[: len(host_parts) - shared]
    if not shared or not unique:
        return absolute
    short = ".".join(unique)
    out = [*absolute, *with_port(short, port)]
    if len(unique) == 2:
        out.extend(with_port(f"{short}.{domain_parts[len(domain_parts) - shared]}", port))
    return out


def _address_host(address: str) -> str | None:
    """A service address as a Host header value; CIDR ranges other than a single host are
    not something a client puts in a Host header, and the unspecified address is not either."""
    text, _, length = address.partition("/")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if ip.is_unspecified or (length and int(length) != ip.max_prefixlen):
        return None
    return text


@lru_cache(maxsize=1 << 16)
def service_domains(
    hostname: str, addresses: tuple[str, ...], port: int, proxy_domain: str
) -> tuple[tuple[str, ...], frozenset[str]]:
    """Istio's generateVirtualHostDomains: all domains of a service on `port` (NO_PORT for the
    names alone), and which of them are alternative forms of its hostname. Remembered: every
    route configuration of a namespace asks again for each of its services."""
    alts = alt_hosts(hostname, port, proxy_domain)
    domains = [*with_port(hostname, port), *alts]
    for address in addresses:
        host = _address_host(address)
        if host is not None:
            domains.extend(with_port(host, port))
    return tuple(domains), frozenset(alts)


class DomainAllocator:
    """Hands out domains so no two virtual hosts of one route configuration share one."""

    def __init__(self, known_fqdns: Collection[str] = ()) -> None:
        self._used: set[str] = set()
        self._known = frozenset(known_fqdns)

    def claim(self, domains: Iterable[str], expanded: Collection[str] = ()) -> list[str]:
        """The domains not yet taken (case-insensitively), now taken; an expanded short form
        that is itself a known hostname is never taken by the expansion."""
        out = []
        for d in domains:
            key = d.lower()
            if key in self._used or (d in expanded and d in self._known):
                continue
            self._used.add(key)
            out.append(d)
        return out

    def taken(self, domain: str) -> bool:
        return domain.lower() in self._used

    @property
    def used(self) -> frozenset[str]:
        """Every domain taken so far, lowercase."""
        return frozenset(self._used)
