"""Several registries seen as one: what the snapshot and the server read.

Members are ordered by precedence: the ServiceEntry files first, then Consul. A hostname that two
members define belongs to the first; the other definition and its endpoints are dropped and a
note names both, so a person can see why Consul's instances of a host are not used. (Istio's
aggregate controller also lets the first registry win, for the same reason: the config a person
wrote by hand says what they meant.)

A change in one member is re-merged and compared as a whole, so listeners get exactly one event
per member change, describing the merged model, and never an event for a change that the merge
hides (Consul's endpoints of a host the files own).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence

from meshctl.registry.base import Listener, Registry
from meshctl.registry.model import (
    Endpoint,
    RegistryChange,
    RegistryStatus,
    Resolution,
    Service,
    ServiceModel,
    diff_models,
    make_model,
)

logger = logging.getLogger("meshctl.registry.aggregate")

_DNS_RESOLUTIONS = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})


def model_change(old: ServiceModel, new: ServiceModel) -> RegistryChange | None:
    """`diff_models`, except that new endpoints of a DNS-resolved service are not endpoint-only.

    Envoy's DNS clusters (STRICT_DNS, LOGICAL_DNS) carry their endpoints inside the cluster, not
    in EDS, so such a change needs CDS pushed too (Istio does a full push for it, istio#39505).
    """
    change = diff_models(old, new)
    if change is None or not change.endpoint_only:
        return change
    if any(_is_dns(old, host) or _is_dns(new, host) for host in change.hosts):
        return RegistryChange(change.hosts, endpoint_only=False)
    return change


def _is_dns(model: ServiceModel, host: str) -> bool:
    service = model.services.get(host)
    return service is not None and service.resolution in _DNS_RESOLUTIONS


def merge_models(members: Iterable[tuple[str, ServiceModel]], previous: ServiceModel | None = None) -> ServiceModel:
    """One model from `(registry name, model)` pairs in precedence order; members' notes are kept
    and each hostname defined twice adds one. Digests known to the members or to the `previous`
    merge carry over (`make_model`). A single member is its own merge: its model is taken as
    it is, so a change to it costs no pass over the mesh here (nor in `diff_models`)."""
    members = list(members)
    if len(members) == 1:
        return members[0][1]
    services: dict[str, Service] = {}
    owners: dict[str, str] = {}
    endpoints: dict[str, tuple[Endpoint, ...]] = {}
    notes: list[str] = []
    for registry, model in members:
        notes.extend(model.notes)
        for host, service in model.services.items():
            if host in services:
                first = _describe(services[host], owners[host])
                notes.append(f"host {host} is defined by {first} and {_describe(service, registry)}; using {first}")
                continue
            services[host] = service
            owners[host] = registry
            endpoints[host] = model.endpoints_of(host)
    known = [m for _, m in members] + ([previous] if previous is not None else [])
    return make_model(services.values(), endpoints, notes, previous=known)


def _describe(service: Service, registry: str) -> str:
    origin = service.origin or service.registry
    return origin if origin == registry else f"{origin} ({registry})"


class AggregateRegistry:
    """A Registry made of others; earlier members win a hostname both define (files before Consul)."""

    def __init__(self, members: Sequence[Registry], *, name: str = "aggregate") -> None:
        self._name = name
        self._members = tuple(members)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        for member in self._members:
            member.subscribe(self._member_changed)
        with self._lock:
            self._model = self._merge()

    @property
    def name(self) -> str:
        return self._name

    @property
    def members(self) -> tuple[Registry, ...]:
        return self._members

    def model(self) -> ServiceModel:
        return self._model

    def status(self) -> RegistryStatus:
        """Healthy only when every member is; the message names each member that is not."""
        statuses = self.member_statuses()
        unhealthy = [s for s in statuses if not s.healthy]
        model = self._model
        return RegistryStatus(
            name=self._name,
            healthy=not unhealthy,
            message="; ".join(f"{s.name}: {s.message or 'unhealthy'}" for s in unhealthy),
            services=len(model.services),
            endpoints=sum(len(e) for e in model.endpoints.values()),
        )

    def member_statuses(self) -> tuple[RegistryStatus, ...]:
        return tuple(m.status() for m in self._members)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _merge(self, previous: ServiceModel | None = None) -> ServiceModel:
        return merge_models(((m.name, m.model()) for m in self._members), previous)

    def _member_changed(self, member_change: RegistryChange) -> None:
        # The member's own change is not enough: a host it changed may be owned by another
        # member, and a host it dropped may now fall to another. Re-merge and compare.
        with self._lock:
            new = self._merge(self._model)
            change = model_change(self._model, new)
            self._model = new
            if change is None:
                return
            change = dataclasses.replace(change, settled=member_change.settled)
            # Under the lock, so that listeners see changes in the order the models were built.
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:
                    # One broken consumer must not keep the others from seeing the change.
                    logger.exception("an aggregate registry listener failed")
