"""State-of-the-world xDS for one type on one stream (`SotwSubscription`), without I/O; see
`meshctl.server.subscription` for the protocol rules both kinds of subscription follow."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.service.discovery.v3 import discovery_pb2

from meshctl.server.subscription_common import (
    _UNANSWERED_KEPT,
    MAX_NAMES,
    WILDCARD,
    Nack,
    Push,
    RequestKind,
    RequestOutcome,
    SharedNonces,
    _keeper,
    _Nonces,
    _shared_names,
    _too_many,
    names_cover,
)
from meshctl.xds.resources import Resource, ResourceSet, set_version


class SotwSubscription:
    """State of the world for one type on one stream.

    With `partial` (EDS and RDS), a response carries only the resources the node does not hold
    at their current version. The xDS protocol allows it for every type but Listener and Cluster
    ("grouping resources into responses": those two must always be the complete set), and Envoy
    applies a SotW EDS or RDS response only to the watches it names: an assignment or route
    config a response leaves out keeps what it had. An endpoint change then costs each proxy the
    assignments of that one service, not all of its assignments again.

    What the node holds is tracked per name, from what was sent (ACKed or still unanswered):

    - Each response is labelled with the version of the whole set it completes, as a full
      response would be, so ACK matching, /debug/syncz and the `version_info` of a reconnect
      mean what they did: a node that ACKed version V holds set V. A push happens exactly when a
      full one would (the set's version moved, or `resend` asked for names) and carries only the
      difference. When names only left the set the difference is empty, and the empty response
      is still sent: it moves the node's version to the set's.
    - Names the node starts watching are sent on their own. Istio answers a new subscription
      with every watched assignment, because its SotW path does not know what each stream
      holds; here it is known, and Envoy applies the new names and keeps the rest. A name the
      node stops watching is forgotten: Envoy dropped it with its cluster or listener, so
      watching it again sends it again.
    - A NACK forgets what the rejected response carried, and what any earlier unanswered one
      did (Envoy may apply part of a response it rejects, and coalesces requests): the next push
      sends them again with the change that triggers it. The version the node rejected is not
      sent again unchanged, as for a full set. A NACK on an older nonce than the last response's
      is stale, but still forgets: a later response that leaves those resources out may be
      ACKed without them, so they are sent again at once.
    - A resource that leaves the snapshot while the node still watches it is not sent, as in a
      full response: SotW EDS has no removal, and Envoy keeps what it had (a cluster without
      endpoints has an empty assignment, which is a change like any other).
    - A new stream holds nothing, so its first response is the whole set; a reconnect whose
      request carries the current version holds this very set and gets nothing.

    A request naming more than `max_names` names (the wildcard aside) raises
    `SubscriptionLimitError`, whatever its nonce, and changes nothing.

    With `shared` (a `SharedNonces`), a push takes the nonce every stream sent the same response
    gets, so its bytes are encoded once for all of them, unless that serial is not above the
    last shared one this stream took (the same response again, or an older one back): then the
    stream's own nonce, as without. Nonces stay unique within the stream either way.
    """

    def __init__(
        self,
        type_url: str,
        *,
        wildcard_when_empty: bool,
        nonce_prefix: str = "",
        partial: bool = False,
        max_names: int = MAX_NAMES,
        shared: SharedNonces | None = None,
    ) -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._max_names = max_names
        self._nonces = _Nonces(nonce_prefix, shared)
        self.partial = partial
        self.started = False
        self.wildcard = False
        self.names: frozenset[str] = frozenset()
        self.sent_version: str | None = None
        self.sent_nonce: str | None = None
        self.acked_version: str | None = None
        self.nack: Nack | None = None
        # Partial only:
        #: name -> the version the node was sent and has not rejected; None while the node holds
        #: exactly `_basis`, which is then the record (a thousand sidecars of a namespace hold
        #: the same set: one copy of its names, not one dict each)
        self._held: dict[str, str] | None = {}
        #: a ResourceSet the node holds all of, at these versions: the next push is its change
        self._basis: ResourceSet | None = None
        #: `_held` lost names at the version sent: a push is due even if the set is unchanged
        self._short = False
        #: nonce -> what the response carried, oldest first, until the node answers it
        self._unanswered: dict[str, tuple[Resource, ...]] = {}
        #: `_unanswered` was cut short: a NACK of a nonce it lacks may be of a forgotten one
        self._untracked = False
        #: started by a reconnect naming a version: if it is the current one, the node holds it
        self._resumed = False
        #: `_names_key` of the last request, and the names it asked for
        self._last_key: tuple[int, int] | None = None
        self._last_names: frozenset[str] | None = None
        #: the set `next_push` last found nothing to send from, with no request or `resend`
        #: since: asked again for the very same set (a change that left this type alone, as an
        #: endpoint change leaves clusters, listeners and routes), nothing still
        self._idle_on: Mapping[str, Resource] | None = None

    @property
    def held_names(self) -> int:
        """How many names the client made this subscription hold (the wildcard aside)."""
        return len(self.names)

    def names_after(self, request: discovery_pb2.DiscoveryRequest) -> int:
        """At most how many names this subscription holds once `request` is applied: what a
        client is charged before it is (`limits.ClientLedger`)."""
        return len(request.resource_names)

    def handle(
        self, request: discovery_pb2.DiscoveryRequest, offered: Mapping[str, Resource] | None = None
    ) -> RequestOutcome:
        """Apply one request. A NACK of the version already rejected (the node says it again, as
        Envoy does when it changes its names after a NACK) is `repeated`. Names are kept as the
        names of the resources `offered` (`_keeper`): one copy for all proxies."""
        key = _names_key(request)
        names = self._names_of(request, key, offered)
        if len(names) - (WILDCARD in names) > self._max_names:
            raise _too_many(self.type_url, len(names) - (WILDCARD in names), "names requested", self._max_names)
        self._idle_on = None
        self._last_key, self._last_names = key, names
        if not self.started:
            self.started = True
            self._subscribe(names)
            if request.version_info:
                # A reconnect: the node already runs this version; nothing to resend if it is current.
                self.sent_version = self.acked_version = request.version_info
                self._resumed = True
            return RequestOutcome(RequestKind.INITIAL, subscription_changed=True)
        # Each field read of the request is a string made: read once (a fleet ACKs every push).
        nonce = request.response_nonce
        rejected = request.HasField("error_detail")
        if self.partial and nonce:
            self._answered(nonce, rejected=rejected)
        # Nothing sent on this stream yet (a resumed subscription whose versions were current):
        # the node's requests carry no nonce, and are its subscription, not stale replies.
        if nonce != (self.sent_nonce or ""):
            return _STALE
        changed = self._subscribe(names)
        if rejected:
            message = request.error_detail.message or "rejected"
            version = self.sent_version or ""
            repeated = self.nack is not None and self.nack.version == version
            self.nack = Nack(version, nonce, message)
            return RequestOutcome(RequestKind.NACK, changed, message, repeated)
        self.acked_version = request.version_info
        self.nack = None
        return _ACKED_CHANGED if changed else _ACKED

    def _names_of(
        self,
        request: discovery_pb2.DiscoveryRequest,
        key: tuple[int, int],
        offered: Mapping[str, Resource] | None,
    ) -> frozenset[str]:
        """The names the request asks for. Every ACK names the whole subscription again (150
        assignments for a sidecar of a scoped namespace, ten thousand for one that sees ten
        thousand services): when it names them as the last request did (`key`, its `_names_key`),
        the set made of that one is the answer, found without making a string of any name; else the
        names held, if equal, by one comparison in C rather than a lookup per name in `offered`."""
        raw = request.resource_names
        if key == self._last_key and self._last_names is not None:
            return self._last_names
        names: frozenset[str] | None = None
        if self.started and len(raw) == len(self.names):
            same = frozenset(raw)
            if same == self.names:
                names = self.names
        if names is None:
            names = frozenset(map(_keeper(offered), raw))
        return names

    def _subscribe(self, names: frozenset[str]) -> bool:
        wildcard = WILDCARD in names or (not names and self._wildcard_when_empty)
        if WILDCARD in names:
            names = names - {WILDCARD}
        changed = wildcard != self.wildcard or (names is not self.names and names != self.names)
        if not changed:
            return False  # the set held stays: every ACK names it again
        shared = _shared_names(names)
        if self._last_names is names:
            self._last_names = shared  # the next ACK's names are then the set held, by identity
        self.wildcard, self.names = wildcard, shared
        if self.partial and not wildcard:
            gone = [n for n in self._held_names() if n not in names]
            if gone:
                held = self._holding()
                for n in gone:
                    del held[n]
                self._basis = None
        return changed

    def _held_names(self) -> Iterable[str]:
        return self._held if self._held is not None else self._basis or ()

    def _holding(self) -> dict[str, str]:
        """What the node holds, as this subscription's own dict (made from `_basis` if that was
        the record), to change it."""
        if self._held is None:
            basis = self._basis
            self._held = {r.name: r.version for r in basis.ordered} if basis is not None else {}
        return self._held

    def _answered(self, nonce: str, *, rejected: bool) -> None:
        """The node answered `nonce`, and so every response before it: on a NACK, forget what they
        carried (see the class docstring)."""
        if nonce not in self._unanswered:
            # Answered already, or so old it is no longer tracked: then nothing held is certain.
            if rejected and self._untracked:
                self._held = {}
                self._basis = None
                self._short = True
            return
        while self._unanswered:
            sent_nonce = next(iter(self._unanswered))
            sent = self._unanswered.pop(sent_nonce)
            if rejected:
                held = self._holding()
                for r in sent:
                    if held.get(r.name) == r.version:
                        del held[r.name]
                self._basis = None
                self._short = True
            if sent_nonce == nonce:
                break
        if not self._unanswered:
            self._untracked = False  # every response sent is answered: none is unknown

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def resend(self, names: Iterable[str]) -> None:
        """Send the set again even if unchanged when it holds any of `names`: an updated cluster
        stays warming until it receives a fresh EDS response, whatever its version. A partial
        subscription sends those names again, and not the rest."""
        wanted = [n for n in names if self.wants(n)]
        if not wanted:
            return
        self._idle_on = None
        if not self.partial:
            self.sent_version = None
            return
        held = self._holding()
        for n in wanted:
            held.pop(n, None)
        self._basis = None
        self._short = True

    @property
    def awaiting_ack(self) -> bool:
        return self.sent_version is not None and self.sent_version != self.acked_version and self.nack is None

    def next_push(self, available: Mapping[str, Resource]) -> Push | None:
        """The response to send now, or None when the node already has (or rejected) this set.
        `available` is never changed once given (the cache's sets are immutable; a stream's
        retained clusters make a new mapping): the same object is the same set."""
        if not self.started or available is self._idle_on:
            return None
        whole = available if isinstance(available, ResourceSet) else None
        if whole is not None and not (self.wildcard or names_cover(whole, self.names)):
            whole = None
        if whole is not None:
            chosen, version = whole.ordered, whole.version  # the whole set: hashed already
        else:
            if self.wildcard:
                chosen = tuple(available[n] for n in sorted(available))
            else:
                chosen = tuple(available[n] for n in sorted(self.names) if n in available)
            version = set_version(chosen)
        resumed, self._resumed = self._resumed, False
        if version == self.sent_version and not self._short:
            if resumed and self.partial:
                self._held = {r.name: r.version for r in chosen} if whole is None else None
                self._basis = whole
            self._idle_on = available
            return None
        if self.nack is not None and version == self.nack.version:
            self._idle_on = available
            return None
        resources = chosen
        if self.partial:
            resources = self._unheld(chosen, whole)
            self._short = False
            if not resources and version == self.sent_version:
                self._idle_on = available
                return None
        self.sent_version = version
        self.sent_nonce, shared = self._nonces.for_response(self.type_url, version, resources)
        if self.partial:
            self._unanswered[self.sent_nonce] = resources
            while len(self._unanswered) > _UNANSWERED_KEPT:
                del self._unanswered[next(iter(self._unanswered))]
                self._untracked = True
        return Push(self.type_url, version, self.sent_nonce, resources, shared=shared)

    def _unheld(self, chosen: tuple[Resource, ...], whole: ResourceSet | None) -> tuple[Resource, ...]:
        """Those of `chosen` the node does not hold at their version, now taken as held. `whole` is
        the set `chosen` is all of, if it is one."""
        basis = self._basis
        if whole is not None and basis is not None:
            fresh = whole.changed_since(basis)  # shared by the streams making the same move
            if whole.covers(basis):  # the node now holds exactly `whole`: it is the record
                self._held, self._basis = None, whole
                return fresh
            held = self._holding()
        else:
            held = self._holding()
            fresh = tuple(r for r in chosen if held.get(r.name) != r.version)
            if len(fresh) == len(chosen):
                fresh = chosen  # the set's own tuple: encoded once for every stream sent it
        for r in fresh:
            held[r.name] = r.version
        # The basis must be exactly what is held: a name held beyond the set (one that left the
        # snapshot) would come back from a comparison with the set even at the version held.
        if whole is not None and len(held) == len(whole):
            self._held, self._basis = None, whole
        else:
            self._basis = None
        return fresh


#: The outcomes that say nothing but their kind, one of each (they are frozen).
_ACKED = RequestOutcome(RequestKind.ACK)
_ACKED_CHANGED = RequestOutcome(RequestKind.ACK, subscription_changed=True)
_STALE = RequestOutcome(RequestKind.STALE)


def _names_key(request: discovery_pb2.DiscoveryRequest) -> tuple[int, int]:
    """The length and hash of the request's names as protobuf encodes them, in order: equal for
    two requests naming the same names in the same order (as Envoy's ACKs do), made in C. A
    set of 150 names made of the request costs 30 us, a thousand streams ACKing one push 30 ms;
    this costs 4 us. Only the names are encoded: a copy with every other field cleared (ACKs
    differ by version and nonce). Names sent in another order only miss this and are compared
    as a set. Two different lists with one key need a 64-bit hash collision under a key
    random per process."""
    names = discovery_pb2.DiscoveryRequest()
    names.CopyFrom(request)
    for field in _OTHER_FIELDS:
        names.ClearField(field)
    encoded = names.SerializeToString()
    return len(encoded), hash(encoded)


#: Every field of DiscoveryRequest but `resource_names` (what `_names_key` leaves out).
_OTHER_FIELDS = tuple(f.name for f in discovery_pb2.DiscoveryRequest.DESCRIPTOR.fields if f.name != "resource_names")
