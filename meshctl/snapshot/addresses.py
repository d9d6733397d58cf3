"""Every endpoint of the mesh by its address, with its service: how a proxy finds the services
its workload serves without scanning every endpoint.

Built once per snapshot, on the first binding that asks, and from the table of the snapshot
before where only some services changed (an endpoint added or removed): the addresses of those
services alone are redone. Apart from the snapshot index (`snapshot/index.py`), which decides
when to build it and which table before it may start from.
"""

from __future__ import annotations

from collections import defaultdict

from meshctl.registry.model import Endpoint, Service, ServiceModel, patched_hosts
from meshctl.snapshot.model_changes import INCREMENTAL_HOSTS

#: address -> every (service, endpoint) there, by service hostname
ByAddress = dict[str, list[tuple[Service, Endpoint]]]


def endpoints_by_address(
    model: ServiceModel, before: ServiceModel | None = None, old: ByAddress | None = None
) -> ByAddress:
    """The lookup by address for `model`; from `old` (the lookup for the model `before`), where
    only some services changed, by redoing the addresses of those services alone."""
    if before is None or old is None:
        by_address: ByAddress = defaultdict(list)
        for host in sorted(model.services):
            for ep in model.endpoints_of(host):
                by_address[ep.address].append((model.services[host], ep))
        return by_address
    changed = {
        host
        for host in patched_hosts(before, model) or before.services.keys() | model.services.keys()
        if before.services.get(host) is not model.services.get(host)
        or before.endpoints.get(host) is not model.endpoints.get(host)
    }
    if not changed:
        return old
    if len(changed) > INCREMENTAL_HOSTS:
        return endpoints_by_address(model)
    touched = {ep.address for host in changed for ep in before.endpoints_of(host)}
    touched.update(ep.address for host in changed for ep in model.endpoints_of(host))
    by_address = dict(old)
    for address in touched:
        kept = [(s, ep) for s, ep in old.get(address, ()) if s.hostname not in changed]
        for host in changed:
            service = model.services.get(host)
            if service is not None:
                kept.extend((service, ep) for ep in model.endpoints_of(host) if ep.address == address)
        kept.sort(key=lambda pair: pair[0].hostname)
        if kept:
            by_address[address] = kept
        else:
            by_address.pop(address, None)
    return by_address
