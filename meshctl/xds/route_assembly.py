"""Route configurations as bytes, assembled from virtual hosts serialized once.

A sidecar's route configuration for a port holds a virtual host for every service it can call
on it: about a thousand at 10,000 services, nearly all of them the same in every namespace and
in every config version but the few a change touched. Building the whole message and
serializing it again on each change cost most of a VirtualService change at that size, though
the routes inside were reused (`route_memo`).

The protobuf wire format makes the whole unnecessary: a message's serialization is its fields'
encodings in field-number order, and each element of a repeated message field is encoded as the
field's tag, the element's length and its bytes. RouteConfiguration's `name` is field 1 and its
`virtual_hosts` field 2, every other field comes after; so its deterministic serialization is
the name's field, then each virtual host's field, then the other fields (the same for every
route configuration meshctl makes: `route_context.route_configuration`). A test holds the
assembled bytes to `SerializeToString(deterministic=True)` of the whole message over real
meshes, and so to the same resource version on every replica.

`VirtualHostMemo` keeps each virtual host's field bytes by everything the virtual host is made
of (its name, domains, dynamic forward proxy cache, and the very route messages the route memo
shares), across namespaces and config versions: a VirtualService change serializes the virtual
hosts of the hosts it routes, once, and joins bytes for the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from meshctl.xds.resources import Serialized, length_delimited
from meshctl.xds.route_context import route_configuration
from meshctl.xds.route_plan import DomainPlan, Host, domain_plan, updated_plan

_T = TypeVar("_T")

_NAME_FIELD = route_pb2.RouteConfiguration.NAME_FIELD_NUMBER
_VIRTUAL_HOSTS_FIELD = route_pb2.RouteConfiguration.VIRTUAL_HOSTS_FIELD_NUMBER


def virtual_host_field(virtual_host: rc.VirtualHost) -> bytes:
    """One element of a RouteConfiguration's `virtual_hosts`, encoded: tag, length, bytes."""
    return length_delimited(_VIRTUAL_HOSTS_FIELD, virtual_host.SerializeToString(deterministic=True))


def assemble_route_configuration(name: str, virtual_host_fields: Sequence[bytes]) -> Serialized:
    """`route_configuration(name, virtual_hosts)` serialized, from its virtual hosts' fields
    (`virtual_host_field`) in order: the name's field, theirs, then the rest of the message."""
    head = length_delimited(_NAME_FIELD, name.encode()) if name else b""
    whole = route_configuration(name, []).SerializeToString(deterministic=True)
    if not whole.startswith(head):  # a field numbered before the virtual hosts: not assemblable
        raise AssertionError(f"route configuration {name!r} does not start with its name")
    return Serialized(name, b"".join([head, *virtual_host_fields, whole[len(head) :]]))


class VirtualHostMemo:
    """Virtual hosts' field bytes by what they are made of; thread-safe. Kept like the other
    generation memos: what was not asked for during the last two config versions goes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[Hashable, tuple[object, bytes]] = {}
        self._previous: dict[Hashable, tuple[object, bytes]] = {}
        self._plans: dict[Hashable, object] = {}
        self._plans_previous: dict[Hashable, object] = {}
        #: the last domain plan made per (port, proxy domain), for the next one to be updated
        #: from (`route_plan.updated_plan`): large plans only, one per namespace and port
        self._latest: dict[tuple[int, str], DomainPlan] = {}
        #: domain plans updated from the one before / made whole (for the benchmarks and tests)
        self.plans_updated = 0
        self.plans_made = 0
        #: virtual hosts serialized / reused (for the benchmarks and tests)
        self.made = 0
        self.reused = 0

    def field(self, key: Hashable, keep: object, make: Callable[[], rc.VirtualHost]) -> bytes:
        """The field bytes of the virtual host `make` builds, once per `key`. `keep` is held
        with the bytes: the objects whose identities the key names, so those identities are
        not reused by other objects while the entry lives."""
        with self._lock:
            found = self._current.get(key) or self._previous.get(key)
            if found is not None:
                self._current[key] = found
                self.reused += 1
                return found[1]
        made = virtual_host_field(make())
        with self._lock:
            self._current[key] = (keep, made)
            self.made += 1
        return made

    def plan(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """What `make` works out from `key` alone (which virtual host gets which domains, for a
        route configuration's hosts in order), once per key."""
        with self._lock:
            found = self._plans.get(key)
            if found is None:
                found = self._plans_previous.get(key)
            if found is not None:
                self._plans[key] = found
                return found  # type: ignore[return-value]  # made by `make` for this very key
        made = make()
        with self._lock:
            self._plans[key] = made
        return made

    def planned(self, port: int, proxy_domain: str, hosts: tuple[Host, ...]) -> DomainPlan:
        """`domain_plan(port, proxy_domain, hosts)`, from the last plan of that port and proxy
        domain where it can be (`updated_plan`)."""
        with self._lock:
            before = self._latest.get((port, proxy_domain))
        plan = updated_plan(before, port, proxy_domain, hosts) if before is not None else None
        updated = plan is not None
        if plan is None:
            plan = domain_plan(port, proxy_domain, hosts)
        with self._lock:
            if plan.used:
                self._latest[(port, proxy_domain)] = plan
            else:
                self._latest.pop((port, proxy_domain), None)
            if updated:
                self.plans_updated += 1
            else:
                self.plans_made += 1
        return plan

    def advance(self) -> None:
        """A new config version: what the one before last used and this one has not yet is dropped."""
        with self._lock:
            self._previous, self._current = self._current, {}
            self._plans_previous, self._plans = self._plans, {}
