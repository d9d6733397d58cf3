"""One ADS stream's state and push decisions, without I/O.

The servicer feeds every request of a stream to `Connection.handle` and hands it each new set of
resources with `update`; `pushes()` then says what to send, in make-before-break order:

1. CDS, then EDS, then LDS, then RDS: routes never name a cluster Envoy lacks.
2. After a CDS push that changed clusters, their endpoints are sent again at once, even when the
   assignment is unchanged: an updated cluster stays warming (up to 15 s) until a fresh EDS
   response arrives, and Envoy does not ask again for names it already watches.
3. A cluster that disappears is kept in CDS until LDS and RDS built without it are ACKed, so
   no route points at a missing cluster in between; then it is dropped.
4. In state of the world, EDS and RDS responses carry only what the node does not hold yet
   (`SotwSubscription`, `partial`): Envoy keeps the assignments and route configs a response
   leaves out. CDS and LDS responses are always the complete set, as the protocol requires:
   Envoy removes any cluster or listener a response does not name.

What one stream makes the server hold is bounded, whatever its client sends: `max_names` names
per type (`subscription`), subscriptions of the types the server serves only, at most
`max_names` retained clusters, the last `_SENT_VERSIONS_KEPT` versions sent per type, and
changed clusters only while they exist or are retained. The names it subscribes also count
against its client's and the server's (`limits.ClientLedger`, charged before a request is
applied, released by `close`).

Everything here is driven directly by tests, with no gRPC and no clock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.errors import SubscriptionLimitError
from meshctl.server.limits import ClientLedger
from meshctl.server.proxy_resources import ProxyResources
from meshctl.server.subscription import (
    MAX_NAMES,
    DeltaSubscription,
    Push,
    RequestKind,
    RequestOutcome,
    SotwSubscription,
)
from meshctl.server.subscription_common import SharedNonces, names_cover
from meshctl.xds import types
from meshctl.xds.resources import Resource, ResourceSet

Subscription = SotwSubscription | DeltaSubscription

#: State-of-the-world types whose responses may leave out what the node already holds.
PARTIAL_SOTW_TYPES = frozenset((types.ENDPOINT, types.ROUTE, types.SECRET))

#: How many versions sent per type are remembered until the node ACKs one (a node that never
#: ACKs would otherwise make a long-lived stream keep one per push).
_SENT_VERSIONS_KEPT = 64


@dataclass(frozen=True, slots=True)
class TypeStatus:
    """Sync state of one type on one stream, for /debug/syncz and `meshctl proxy-status`."""

    type_url: str
    sent_version: str
    acked_version: str
    nonce: str
    nack: str


class Connection:
    """The state of one ADS stream: its node, one subscription per type, and what it was sent.

    `max_names` bounds the names each subscription may have (`SubscriptionLimitError`) and the
    clusters kept for the routes that still name them."""

    def __init__(
        self,
        conn_id: str,
        *,
        delta: bool,
        max_names: int = MAX_NAMES,
        ledger: ClientLedger | None = None,
        client: str = "",
        shared_nonces: SharedNonces | None = None,
    ) -> None:
        self.id = conn_id
        #: nonces shared by the streams sent the same SotW response (`SotwSubscription`)
        self._shared_nonces = shared_nonces
        self._ledger = ledger
        self.client = client
        #: per type: the names charged to the client for it (`ClientLedger.charge`)
        self._charged: dict[str, int] = {}
        self.delta = delta
        self.max_names = max_names
        self.node_id = ""
        self.node_metadata: Mapping[str, Any] = {}
        self.connected_at = time.time()
        self.subscriptions: dict[str, Subscription] = {}
        self.resources: ProxyResources | None = None
        self.nacks = 0
        self._generation = 0
        self._retained: dict[str, Resource] = {}
        #: the endpoints of retained clusters, so they keep serving until dropped
        self._retained_eds: dict[str, Resource] = {}
        self._removal_generation = 0
        self._changed_clusters: frozenset[str] = frozenset()
        #: per type: set version -> the newest generation it was sent in
        self._sent_generation: dict[str, dict[str, int]] = {}
        self._acked_generation: dict[str, int] = {}
        #: Whether the last request handled may have given `pushes()` more to say (see `handle`).
        self.push_due = False

    # -- requests ----------------------------------------------------------------------------

    def subscription(self, type_url: str) -> Subscription:
        """The subscription of `type_url`, one the server serves (`types.SHORT_NAMES`): the
        caller drops requests of other types, so a client cannot make a stream hold one per
        type URL it invents. Raises ValueError for another type."""
        found = self.subscriptions.get(type_url)
        if found is not None:
            return found
        short = types.SHORT_NAMES.get(type_url)
        if short is None:
            raise ValueError(f"not a type this server serves: {type_url[:200]!r}")
        wildcard = type_url in types.WILDCARD_TYPES
        prefix = short[0].lower()
        sub: Subscription
        if self.delta:
            sub = DeltaSubscription(
                type_url,
                wildcard_when_empty=wildcard,
                nonce_prefix=prefix,
                max_names=self.max_names,
                shared=self._shared_nonces,
            )
        else:
            sub = SotwSubscription(
                type_url,
                wildcard_when_empty=wildcard,
                nonce_prefix=prefix,
                partial=type_url in PARTIAL_SOTW_TYPES,
                max_names=self.max_names,
                shared=self._shared_nonces,
            )
        self.subscriptions[type_url] = sub
        return sub

    def handle(self, type_url: str, request: Any) -> RequestOutcome:
        """Apply one DiscoveryRequest or DeltaDiscoveryRequest of `type_url`.

        Raises `SubscriptionLimitError` for a request that would pass `max_names`, leaving the
        connection as it was (the servicer ends the stream); ValueError for a type not served.
        A `repeated` NACK is not counted in `nacks` again.

        Sets `push_due`: False for a plain ACK (the names as they were, no cluster retained),
        after which `pushes()` says what it said before the ACK, so the servicer need not ask it
        again. Every push to a fleet comes back as one such ACK per stream."""
        self.push_due = True
        retained = bool(self._retained)
        new = type_url not in self.subscriptions
        sub = self.subscription(type_url)
        charged = self._charged.get(type_url, 0)
        try:
            if self._ledger is not None:
                need = sub.names_after(request)
                if need > charged:
                    self._ledger.charge(self.client, need - charged, type_url)
                    charged = self._charged[type_url] = need
            # Names are kept as the offered resources' own strings: shared, never interned.
            offered = self.resources.of(type_url) if self.resources is not None else {}
            outcome = sub.handle(request, offered)
        except SubscriptionLimitError:
            if new:
                del self.subscriptions[type_url]
            raise
        if self._ledger is not None and sub.held_names != charged:
            # What the request left held (the charge was at most that): the rest goes back.
            self._ledger.charge(self.client, sub.held_names - charged, type_url)
            self._charged[type_url] = sub.held_names
        if outcome.kind is RequestKind.NACK:
            if not outcome.repeated:
                self.nacks += 1
        elif outcome.kind is RequestKind.ACK and sub.acked_version is not None:
            sent = self._sent_generation.get(type_url, {})
            generation = sent.get(sub.acked_version)
            if generation is not None:
                acked = self._acked_generation[type_url] = max(self._acked_generation.get(type_url, 0), generation)
                # What was sent before the acknowledged version can no longer move anything:
                # forgotten, or a stream that lives for weeks keeps one entry per push it got
                # (and one that never ACKs keeps the last `_SENT_VERSIONS_KEPT`, see `pushes`).
                if len(sent) > 1 or generation < acked:  # (a version alone, the one ACKed: kept as it is)
                    self._sent_generation[type_url] = {v: g for v, g in sent.items() if g >= acked}
            self._release_retained()
            # With a cluster retained, an ACK may release it (a CDS push then follows): asked.
            self.push_due = outcome.subscription_changed or retained
        return outcome

    def close(self) -> None:
        """The stream ended: give back the names charged to its client."""
        if self._ledger is not None:
            self._ledger.charge(self.client, -sum(self._charged.values()), "")
            self._charged.clear()

    # -- resources ---------------------------------------------------------------------------

    def update(self, resources: ProxyResources) -> bool:
        """Take a new set of resources; `pushes()` then says what to send. False when nothing the
        node may be sent moved: every type's set is the very one held (the cache hands out the
        same sets for what a change leaves alone), so `pushes()` has nothing new to say and a
        change outside the proxy's scope need not wake its stream."""
        old = self.resources
        if old is not None and _same_sets(old, resources):
            self.resources = resources  # the snapshot it is at, for the debug pages
            return False
        self._generation += 1
        if old is not None:
            old_clusters, new_clusters = old.of(types.CLUSTER), resources.of(types.CLUSTER)
            # The cache hands out the very same set when clusters did not change (an endpoint
            # change, or a change outside this proxy's scope): nothing to compare then.
            same = old_clusters is new_clusters
            # The clusters still retained, then those removed now: the newest last.
            removed = {n: r for n, r in self._retained.items() if n not in new_clusters}
            if not same:
                removed.update((n, r) for n, r in old_clusters.items() if n not in new_clusters)
            # A node that never ACKs its routes would keep every cluster ever removed: it keeps
            # the newest `max_names`, as many as it may subscribe to.
            if len(removed) > self.max_names:
                removed = dict(itertools.islice(removed.items(), len(removed) - self.max_names, None))
            self._retained = removed if self._routes_subscribed() else {}
            if self._retained:
                old_eds = {**self._retained_eds, **old.of(types.ENDPOINT)}
                self._retained_eds = {n: old_eds[n] for n in self._retained if n in old_eds}
            else:
                self._retained_eds = {}
            if removed:
                self._removal_generation = self._generation
            if not same:
                # Only clusters the node may still be sent: a stream without EDS never sends
                # their endpoints, and would otherwise keep every cluster that ever changed.
                kept = {n for n in self._changed_clusters if n in new_clusters or n in self._retained}
                self._changed_clusters = frozenset(kept).union(
                    n for n, r in new_clusters.items() if n in old_clusters and old_clusters[n].version != r.version
                )
        self.resources = resources
        return True

    def _routes_subscribed(self) -> bool:
        return any(t in self.subscriptions for t in (types.LISTENER, types.ROUTE))

    def _release_retained(self) -> None:
        if not self._retained:
            return
        for t in (types.LISTENER, types.ROUTE):
            if t in self.subscriptions and self._acked_generation.get(t, 0) < self._removal_generation:
                return
        self._retained = {}
        self._retained_eds = {}

    @property
    def retained_clusters(self) -> frozenset[str]:
        """Clusters kept only until the routes that named them are replaced (debug pages)."""
        return frozenset(self._retained)

    def pushes(self) -> list[Push]:
        """What to send now, in push order; empty when the node is up to date."""
        if self.resources is None:
            return []
        out: list[Push] = []
        cds_pushed = False
        pending: bool | None = None  # `_endpoints_pending`, asked once (for LDS and RDS alike)
        for type_url in types.PUSH_ORDER:
            sub = self.subscriptions.get(type_url)
            if sub is None:
                continue
            if type_url in (types.LISTENER, types.ROUTE):
                if pending is None:
                    pending = self._endpoints_pending()
                if pending:
                    break
            available = self.resources.of(type_url)
            if type_url == types.CLUSTER and self._retained:
                available = {**self._retained, **available}
            elif type_url == types.ENDPOINT and self._retained_eds:
                available = {**self._retained_eds, **available}
            if type_url == types.ENDPOINT and cds_pushed and self._changed_clusters:
                sub.resend(self._changed_clusters)
                self._changed_clusters = frozenset()
            push = sub.next_push(available)
            if push is not None:
                out.append(push)
                sent = self._sent_generation.setdefault(type_url, {})
                sent.pop(push.version, None)  # the newest last, so the oldest go first
                sent[push.version] = self._generation
                while len(sent) > _SENT_VERSIONS_KEPT:
                    del sent[next(iter(sent))]
                cds_pushed = cds_pushed or type_url == types.CLUSTER
            elif not sub.awaiting_ack:
                self._acked_generation[type_url] = self._generation
        self._release_retained()
        return out

    def _endpoints_pending(self) -> bool:
        """True while a cluster the node was sent has no EDS subscription yet: Envoy keeps a new
        EDS cluster warming (a route naming it answers 503) until its endpoints arrive, and it
        asks for them only after applying the CDS push, so routes wait for that request."""
        cds = self.subscriptions.get(types.CLUSTER)
        eds = self.subscriptions.get(types.ENDPOINT)
        if cds is None or eds is None or cds.nack is not None or self.resources is None or eds.wildcard:
            return False
        offered = self.resources.of(types.ENDPOINT)
        if cds.wildcard:  # as Envoy subscribes: then only a set comparison, on every push
            if isinstance(offered, ResourceSet):
                return not names_cover(offered, eds.names)  # once per namespace's set and names
            return not offered.keys() <= eds.names
        return any(cds.wants(n) and not eds.wants(n) for n in offered)

    def settled(self) -> bool:
        """Whether the node ACKed every type it was sent, at the version sent, and NACKed none
        (what `status()` says, without making it: the rollout asks it of every stream)."""
        found = False
        for type_url in types.PUSH_ORDER:
            sub = self.subscriptions.get(type_url)
            if sub is None:
                continue
            if (sub.sent_version or "") != (sub.acked_version or "") or sub.nack is not None:
                return False
            found = True
        return found

    def status(self) -> list[TypeStatus]:
        out = []
        for type_url in types.PUSH_ORDER:
            sub = self.subscriptions.get(type_url)
            if sub is None:
                continue
            nonce = sub.sent_nonce if isinstance(sub, SotwSubscription) else ""
            out.append(
                TypeStatus(
                    type_url,
                    sub.sent_version or "",
                    sub.acked_version or "",
                    nonce or "",
                    sub.nack.message if sub.nack is not None else "",
                )
            )
        return out


def _same_sets(old: ProxyResources, new: ProxyResources) -> bool:
    """Whether `new` offers, type by type, the very mappings `old` does."""
    a, b = old.by_type, new.by_type
    return len(a) == len(b) and all(b.get(t) is m for t, m in a.items())
