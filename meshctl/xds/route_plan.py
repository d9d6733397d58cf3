"""Which virtual host of a sidecar route configuration gets which domains, worked out once per
the hosts in order and, after a change that only adds services, from the plan before.

Envoy refuses two virtual hosts with one domain, so domains are handed out first come, first
served in the hosts' order (`DomainAllocator`): in general one host more can change what any
host after it gets. A service added whose domains no host took, and whose name and hostname no
host's domains hold, changes nothing of the others: its own virtual host is then all that is
worked out, and the plan before (a thousand hosts' at a namespace of a thousand services) is
taken over with its indices moved. Anything else (a host gone or changed, a VirtualService's
own host, a collision) is planned whole, which gives the same plan by construction.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from meshctl.xds.route_domains import NO_PORT, DomainAllocator, domain_name, ipv6_compliant, service_domains

#: A host in order: a service's hostname with its addresses, or a VirtualService host naming no
#: service, with None.
Host = tuple[str, tuple[str, ...] | None]
#: A planned virtual host: the index of its host, its name, its domains.
Entry = tuple[int, str, tuple[str, ...]]

#: Plans of fewer hosts are made whole each time and keep no state to be updated from.
MIN_HOSTS_UPDATED = 256
#: More hosts added than this at once: planned whole.
_MAX_ADDED = 16


@dataclass(frozen=True, slots=True, eq=False)
class DomainPlan:
    """The virtual hosts of `hosts`, sorted by name (`entries`); for a plan updated later, what
    the allocation ended with: the domains taken (lowercase), the known service names and every
    virtual host name asked for."""

    hosts: tuple[Host, ...]
    entries: tuple[Entry, ...]
    used: frozenset[str] = frozenset()
    known: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()


def domain_plan(port: int, proxy_domain: str, hosts: tuple[Host, ...]) -> DomainPlan:
    """For `hosts` in order, the virtual hosts they get, sorted by name: which host (by index),
    its name and its domains. A host whose name came before, or left with no domain, gets none."""
    known = {h for host, addresses in hosts if addresses is not None for h in (host, domain_name(host, port))}
    allocator = DomainAllocator(known)
    names: set[str] = set()
    out: list[Entry] = []
    for index, (host, addresses) in enumerate(hosts):
        name = domain_name(host, port)
        if name in names:
            continue
        names.add(name)
        if addresses is None:
            domains = allocator.claim([ipv6_compliant(host)])
        else:
            wanted, expanded = service_domains(host, addresses, NO_PORT, proxy_domain)
            domains = allocator.claim(wanted, expanded)
        if domains:
            out.append((index, name, tuple(domains)))
    out.sort(key=lambda entry: entry[1])
    if len(hosts) < MIN_HOSTS_UPDATED:
        return DomainPlan(hosts, tuple(out))
    return DomainPlan(hosts, tuple(out), allocator.used, frozenset(known), frozenset(names))


def updated_plan(before: DomainPlan, port: int, proxy_domain: str, hosts: tuple[Host, ...]) -> DomainPlan | None:
    """`domain_plan(port, proxy_domain, hosts)` from `before` (a plan of the same port and proxy
    domain), where `hosts` are its hosts with a few services added and nothing they want is
    anyone's already; None where that is not so."""
    if not before.used or not 0 < len(hosts) - len(before.hosts) <= _MAX_ADDED:
        return None
    was = set(before.hosts)
    added = [i for i, host in enumerate(hosts) if host not in was]
    if len(added) != len(hosts) - len(before.hosts):
        return None  # a host twice, or one gone
    skipped = set(added)
    moved = [i for i in range(len(hosts)) if i not in skipped]  # new index of each host before
    if tuple(hosts[i] for i in moved) != before.hosts:
        return None
    fresh = [hosts[i] for i in added]
    if any(addresses is None for _, addresses in fresh):
        return None
    known = set(before.known)
    known.update(h for host, _ in fresh for h in (host, domain_name(host, port)))
    allocator = DomainAllocator(known)
    names = set(before.names)
    made: list[Entry] = []
    for index, (host, addresses) in zip(added, fresh, strict=True):
        name = domain_name(host, port)
        assert addresses is not None
        wanted, expanded = service_domains(host, addresses, NO_PORT, proxy_domain)
        if name in names or name.lower() in before.used or any(d.lower() in before.used for d in wanted):
            return None
        names.add(name)
        domains = allocator.claim(wanted, expanded)
        if domains:
            made.append((index, name, tuple(domains)))
    entries = [(moved[i], name, domains) for i, name, domains in before.entries]
    order = [name for _, name, _ in before.entries]
    for entry in made:
        at = bisect.bisect(order, entry[1])
        order.insert(at, entry[1])
        entries.insert(at, entry)
    return DomainPlan(hosts, tuple(entries), before.used | allocator.used, frozenset(known), frozenset(names))
