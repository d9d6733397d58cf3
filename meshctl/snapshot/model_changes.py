"""Which hosts differ between a service model and the one before it, in the terms each reader
of the registry cares about.

A model patched from the one before (`patch_model`) names the only hosts that may differ, so a
change of a few endpoints is compared on those hosts, not the mesh. Apart from the snapshot
index (`snapshot/index.py`), which remembers each answer per model before and decides from them
what it carries to the next snapshot: these are pure functions of the two models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from meshctl.registry.model import Resolution, Service, ServiceModel, patched_hosts

#: Past this many changed services, a lookup is built anew rather than updated.
INCREMENTAL_HOSTS: Final = 64


def touch_none(before: ServiceModel, after: ServiceModel, test: Callable[[Service], bool]) -> bool:
    """Whether `after` is known to be patched from `before` on hosts none of whose services,
    before or after, passes `test` (what depends on those services alone is then the same)."""
    touched = patched_hosts(before, after)
    if touched is None:
        return False
    for host in touched:
        for service in (before.services.get(host), after.services.get(host)):
            if service is not None and test(service):
                return False
    return True


def hosts_moved(before: ServiceModel, services: ServiceModel) -> set[str] | None:
    """The hostnames added or removed since `before`, when few are known to be (the model
    patched from the one before, or the same hostnames); None: build the name lookups anew."""
    if before is services:
        return set()
    touched = patched_hosts(before, services)
    if touched is None:
        return set() if before.services.keys() == services.services.keys() else None
    if len(touched) > INCREMENTAL_HOSTS:
        return None
    return {host for host in touched if (host in before.services) != (host in services.services)}


def changed_hosts(
    before: ServiceModel, now: ServiceModel, before_loopback: Mapping[str, str], loopback: Mapping[str, str]
) -> frozenset[str]:
    """The hosts whose part of the registry generation may read differently in `now` than in
    `before` (whose loopback allocations are `before_loopback` and `loopback`): the service
    itself (came, went or changed), its endpoints where its clusters or listeners carry them
    (resolution not STATIC), its workloads' identities, its loopback address."""
    was, cur = before.services, now.services
    out: set[str] = set()
    if before is not now:
        # A model patched from `before` names the only hosts that may differ.
        patched = patched_hosts(before, now)
        for host in patched if patched is not None else was.keys() | cur.keys():
            a, b = was.get(host), cur.get(host)
            if a is not b and a != b:
                out.add(host)
                continue
            if b is None:
                continue
            ea, eb = before.endpoints.get(host, ()), now.endpoints.get(host, ())
            if ea is eb:
                continue
            carried = b.resolution is not Resolution.STATIC  # its endpoints are in CDS or LDS
            if (carried and ea != eb) or before.identities(host) != now.identities(host):
                out.add(host)
    if loopback is not before_loopback:
        out.update(h for h in before_loopback.keys() | loopback.keys() if before_loopback.get(h) != loopback.get(h))
    return frozenset(out)


def endpoints_changed(before: ServiceModel, now: ServiceModel) -> frozenset[str]:
    """The hosts whose service or endpoints differ in `now` from `before`: what a load
    assignment reads of the registry."""
    out: set[str] = set()
    if before is not now:
        was, cur = before.services, now.services
        patched = patched_hosts(before, now)
        for host in patched if patched is not None else was.keys() | cur.keys():
            a, b = was.get(host), cur.get(host)
            ea, eb = before.endpoints.get(host, ()), now.endpoints.get(host, ())
            if (a is not b and a != b) or (ea is not eb and ea != eb):
                out.add(host)
    return frozenset(out)
