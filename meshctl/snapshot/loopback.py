"""A loopback address of its own for every TCP-level service: how a VM without iptables reaches
two TCP services on one port by name.

Without iptables the app connects to where the proxy listens. HTTP services share
`127.0.0.1:PORT` (the proxy routes by `Host`), but nothing in a plain TCP or TLS connection
says which service it is for, so two databases on 5432 cannot share `127.0.0.1:5432`. On Linux
all of 127.0.0.0/8 is local, so each host with a TCP-level port (TCP, TLS, HTTPS, MongoDB, MySQL,
Redis, or undeclared and sniffed) gets an address of its own in a range (`MeshSettings.
loopback_range`, 127.240.0.0/16 unless the MeshConfig says otherwise); its DNS answer is that
address (`xds/dns_table.py`).

The allocation is a pure function of the mesh (the service hosts and the range), so every
replica and every run allocates alike and a failover moves no listener: a host's first choice is
a hash of its name; hosts whose choices collide are settled in sorted host order, the later one
taking the next free address. An address changes only when a host sorting before it comes to
want the same one, which a /16 makes rare. 127.0.0.1, the range's first and last address are
never handed out. When the range is full the remaining hosts get none and stay on 127.0.0.1;
`loopbackRange: ""` turns the allocation off.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from meshctl.config.mesh import DEFAULT_LOOPBACK_RANGE
from meshctl.registry.model import Protocol, Service

_LOCALHOST: Final = ipaddress.IPv4Address("127.0.0.1")


def is_tcp_level(protocol: Protocol) -> bool:
    """A protocol nothing in whose connections names the service on a shared loopback port."""
    return not protocol.is_http and protocol is not Protocol.UDP


def wants_loopback(service: Service) -> bool:
    """A host that gets an address of its own: an exact name with a TCP-level port."""
    return not service.hostname.startswith("*") and any(is_tcp_level(p.protocol) for p in service.ports)


def allocate(hosts: Iterable[str], cidr: str = DEFAULT_LOOPBACK_RANGE) -> Mapping[str, str]:
    """host -> its loopback address, for every host of `hosts` the range has room for; none
    when `cidr` is "" (the allocation turned off: every service on 127.0.0.1, as before it)."""
    if not cidr:
        return MappingProxyType({})
    network = ipaddress.IPv4Network(cidr)
    first = int(network.network_address) + 1
    size = network.num_addresses - 2
    skip = int(_LOCALHOST) - first if _LOCALHOST in network else -1
    taken: set[int] = set()
    out: dict[str, str] = {}
    for host in sorted(set(hosts)):
        if len(taken) >= size - (skip >= 0):
            break
        digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
        slot = int.from_bytes(digest, "big") % size
        while slot in taken or slot == skip:
            slot = (slot + 1) % size
        taken.add(slot)
        out[host] = str(ipaddress.IPv4Address(first + slot))
    return MappingProxyType(out)


def allocate_services(services: Iterable[Service], cidr: str = DEFAULT_LOOPBACK_RANGE) -> Mapping[str, str]:
    """The allocation for the services of a registry model that want an address."""
    return allocate((s.hostname for s in services if wants_loopback(s)), cidr)
