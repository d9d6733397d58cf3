"""Incremental (delta) xDS for one type on one stream (`DeltaSubscription`), without I/O; see
`meshctl.server.subscription` for the protocol rules both kinds of subscription follow."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

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
    _version,
    _version_of,
)
from meshctl.xds.resources import Resource, ResourceSet

#: In `DeltaSubscription.known`: the node may hold the resource, at a version not known (it
#: rejected or may have partly applied a response): it is sent again, and its removal told.
_UNKNOWN = ""


#: A delta response until it is answered: its set version, what it carried, what it said removed.
_Sent = tuple[str, tuple[Resource, ...], tuple[str, ...]]


class DeltaSubscription:
    """Incremental xDS for one type on one stream.

    `known` is what the node holds, name -> version, as far as we know: from its
    `initial_resource_versions`, and from what it is sent, as soon as it is sent. A NACK makes
    what the rejected response carried or removed unknown (`_UNKNOWN`), since Envoy may apply
    part of a response it rejects: such a resource is sent again with its next change (the
    content rejected is not sent again unchanged), and its removal is told again if it is gone.

    Responses are tracked until answered, the newest `_UNANSWERED_KEPT` of them. A NACK of a
    response no longer tracked, once some were forgotten, may be of any of them: then no version
    the node holds is known, and the next push sends everything it watches again. A NACK of the
    response the stream's current NACK names, once more, changes nothing and is `repeated`.

    A first wildcard request (listeners, clusters) that claims no version is answered even when
    there is nothing to send (an empty response): Envoy's initial fetch of a type completes only
    with a response, and meshctl's bootstrap waits for it without a timeout
    (`initial_fetch_timeout: 0s`), so a sidecar the mesh gives no listener never became ready. A
    reconnect that claims versions is not owed one (the node was ready before), nor a request
    by name: the names are sent, or told absent.

    A request that would leave more than `max_names` names subscribed, or a first request with
    more than `max_names` initial versions, raises `SubscriptionLimitError` and changes nothing.

    After each `next_push` of a `ResourceSet` the node is in step with that set (`_basis`): it
    holds, or rejected, every resource of it it watches, and was told of every watched name it
    lacks. The next set is then compared with the basis, not name by name with what the node
    holds: the sets' difference is computed once (`ResourceSet.changed_since`) for every stream
    making the same move, so an endpoint change costs a stream what changed, not every name it
    watches (hundreds of clusters' endpoints, a thousand streams). A request that subscribes,
    unsubscribes or rejects, a `resend`, or a mapping that is not a set loses the basis.

    With `shared` (a `SharedNonces`), a push of such a shared tuple that removes nothing takes
    the nonce every stream sent it gets, as state of the world does, so the whole response is
    encoded once; unless that serial is not above the last shared one this stream took, then
    the stream's own. Nonces stay unique within the stream either way.
    """

    def __init__(
        self,
        type_url: str,
        *,
        wildcard_when_empty: bool,
        nonce_prefix: str = "",
        max_names: int = MAX_NAMES,
        shared: SharedNonces | None = None,
    ) -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._max_names = max_names
        self._nonces = _Nonces(nonce_prefix, shared)
        self.started = False
        self.wildcard = False
        #: Shared with every subscription holding the same names (`_shared_names`): a thousand
        #: sidecars of a namespace watch the same thousand clusters' endpoints.
        self.names: frozenset[str] = frozenset()
        #: What the node holds, name -> version, as far as we know (`_UNKNOWN`: some version).
        self.known: dict[str, str] = {}
        #: watched names told absent (in `removed`) while they do not exist: a subset of `names`
        self._absent_told: set[str] = set()
        #: name -> the version the node rejected, not sent again: a subset of `known`
        self._nacked: dict[str, str] = {}
        #: nonce -> what the response carried, oldest first, until the node answers it
        self._in_flight: dict[str, _Sent] = {}
        #: `_in_flight` was cut short: a NACK of a nonce it lacks may be of a forgotten one
        self._untracked = False
        self._sent_nonce: str | None = None
        self.sent_version: str | None = None
        self.acked_version: str | None = None
        self.nack: Nack | None = None
        #: A ResourceSet found to need no push; the same set needs none until a request comes.
        self._settled: ResourceSet | None = None
        #: initial resource versions the first request claimed
        self._claimed = 0
        #: The set the node is in step with (see the class docstring), if known.
        self._basis: ResourceSet | None = None

    @property
    def held_names(self) -> int:
        """How many names the client made this subscription hold: those subscribed, and the
        initial resource versions it claimed (kept while the stream lives)."""
        return len(self.names) + self._claimed

    def names_after(self, request: discovery_pb2.DeltaDiscoveryRequest) -> int:
        """At most how many names this subscription holds once `request` is applied (raises
        `SubscriptionLimitError` past `max_names`): what a client is charged before it is."""
        claimed = self._claimed if self.started else len(request.initial_resource_versions)
        return self._check_limits(request) + claimed

    def handle(
        self, request: discovery_pb2.DeltaDiscoveryRequest, offered: Mapping[str, Resource] | None = None
    ) -> RequestOutcome:
        """Apply one request; names are kept as the names of the resources `offered` (`_keeper`)."""
        self._check_limits(request)
        keep = _keeper(offered)
        self._settled = None
        if (
            not self.started
            or request.resource_names_subscribe
            or request.resource_names_unsubscribe
            or request.HasField("error_detail")
        ):
            self._basis = None  # what the node watches or holds moved: compared name by name again
        changed = False
        kind = RequestKind.UPDATE
        if not self.started:
            self.started = True
            kind = RequestKind.INITIAL
            changed = True
            # Interned: a thousand proxies resuming on this replica name the same resources.
            self.known.update((keep(n), _version(offered, n, v)) for n, v in request.initial_resource_versions.items())
            self._claimed = len(request.initial_resource_versions)
            if not request.resource_names_subscribe and self._wildcard_when_empty:
                self.wildcard = True
        if request.resource_names_subscribe or request.resource_names_unsubscribe:
            changed = True
            self._watch(request, keep, resubscribe=kind is not RequestKind.INITIAL)
        if not request.response_nonce:
            return RequestOutcome(kind, changed)
        return self._answered(request, kind, changed)

    def _watch(
        self, request: discovery_pb2.DeltaDiscoveryRequest, keep: Callable[[str], str], *, resubscribe: bool
    ) -> None:
        """Apply the request's subscribes, then its unsubscribes (`resubscribe`: a name the node
        had before is sent again)."""
        names = set(self.names)
        for name in request.resource_names_subscribe:
            if name == WILDCARD:
                self.wildcard = True
                continue
            names.add(keep(name))
            if resubscribe and name in self.known:
                # An explicit subscribe asks for the resource even if the node had it before.
                self.known[name] = _UNKNOWN
            self._absent_told.discard(name)
        for name in request.resource_names_unsubscribe:
            if name == WILDCARD:
                self.wildcard = False
                continue
            names.discard(name)
            self.known.pop(name, None)
            self._nacked.pop(name, None)
            self._absent_told.discard(name)
        if names != self.names:
            self.names = _shared_names(frozenset(names))

    def _check_limits(self, request: discovery_pb2.DeltaDiscoveryRequest) -> int:
        """Raise before anything changes if the request would pass `max_names`; else at most
        how many names are subscribed once it is applied."""
        limit = self._max_names
        if not self.started and len(request.initial_resource_versions) > limit:
            count = len(request.initial_resource_versions)
            raise _too_many(self.type_url, count, "initial resource versions", limit)
        subscribe = request.resource_names_subscribe
        if len(self.names) + len(subscribe) <= limit:
            return len(self.names) + len(subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        adding = {n for n in subscribe if n != WILDCARD and n not in self.names and n not in unsubscribe}
        count = len(self.names) - len(unsubscribe & self.names) + len(adding)
        if count > limit:
            raise _too_many(self.type_url, count, "names subscribed", limit)
        return count

    def _answered(
        self, request: discovery_pb2.DeltaDiscoveryRequest, kind: RequestKind, changed: bool
    ) -> RequestOutcome:
        """The node answered a response: an ACK, a NACK, or (a nonce not in flight, no error) neither."""
        nonce = request.response_nonce
        sent = self._in_flight.pop(nonce, None)
        untracked = self._untracked
        if not self._in_flight:
            self._untracked = False  # every response sent is answered: none is unknown
        if not request.HasField("error_detail"):
            if sent is not None:
                kind = RequestKind.ACK
                self.nack = None
                self.acked_version = sent[0]
            return RequestOutcome(kind, changed)
        error = request.error_detail.message or "rejected"
        repeated = False
        if sent is not None:
            version = sent[0]
            self._rejected(sent)
        elif self.nack is not None and nonce == self.nack.nonce:
            version, repeated = self.nack.version, True  # the very same NACK: acted on already
        else:
            version = self.sent_version or ""
            repeated = self.nack is not None and self.nack.version == version
            if untracked:
                # Perhaps of a response forgotten: whatever it carried, the node may lack.
                self.known = dict.fromkeys(self.known, _UNKNOWN)
                self._absent_told.clear()
        self.nack = Nack(version, nonce, error)
        return RequestOutcome(RequestKind.NACK, changed, error, repeated)

    def _rejected(self, sent: _Sent) -> None:
        """The node rejected this response, and may have applied any part of it."""
        _, resources, removed = sent
        for r in resources:
            if not self.wants(r.name):
                continue  # no longer watched: the node dropped it
            self._nacked[r.name] = r.version
            if self.known.get(r.name, r.version) == r.version:  # unless a later response sent another
                self.known[r.name] = _UNKNOWN
        for name in removed:
            if name not in self.known and self.wants(name):
                self.known[name] = _UNKNOWN

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def resend(self, names: Iterable[str]) -> None:
        """Send these resources again even if the node holds their version (see SotwSubscription)."""
        self._settled = None
        self._basis = None
        for name in names:
            if name in self.known and self.wants(name):
                self.known[name] = _UNKNOWN

    @property
    def awaiting_ack(self) -> bool:
        """The latest response is not answered yet (Envoy answers them in order)."""
        return self._sent_nonce in self._in_flight

    def next_push(self, available: Mapping[str, Resource]) -> Push | None:
        if not self.started or available is self._settled:
            return None
        whole = available if isinstance(available, ResourceSet) else None
        if whole is not None and self._basis is not None:
            to_send, removed, absent = self._moved(whole, self._basis)
        else:
            to_send, removed, absent = self._compared(available)
        self._basis = whole
        # A wildcard stream that claimed nothing and was sent nothing is owed its first answer.
        owed = self._sent_nonce is None and self.wildcard and not self._claimed
        if not to_send and not removed and not absent and not owed:
            if not self.awaiting_ack:
                # The node holds every current version (after a reconnect it may have sent
                # them all in initial_resource_versions): it is in sync, though nothing was sent.
                self.sent_version = self.acked_version = _version_of(available)
            if isinstance(available, ResourceSet):
                self._settled = available
            return None
        for r in to_send:
            self.known[r.name] = r.version
            self._nacked.pop(r.name, None)
        for n in removed:
            del self.known[n]
            self._nacked.pop(n, None)
            if n in self.names:
                self._absent_told.add(n)  # told, as an absent name is: not again while it is gone
        self._absent_told.update(absent)
        version = _version_of(available)
        gone = tuple(removed + absent)
        if isinstance(to_send, tuple) and not gone:  # a tuple every stream making the move is given
            resources = to_send
            nonce, shared = self._nonces.for_response(self.type_url, version, resources)
        else:
            resources = tuple(to_send)
            nonce, shared = self._nonces.next(), False
        self._sent_nonce = nonce
        self.sent_version = version
        self._in_flight[nonce] = (self.sent_version, resources, gone)
        while len(self._in_flight) > _UNANSWERED_KEPT:
            del self._in_flight[next(iter(self._in_flight))]
            self._untracked = True
        return Push(self.type_url, version, nonce, resources, gone, shared=shared)

    def _compared(self, available: Mapping[str, Resource]) -> tuple[Sequence[Resource], list[str], list[str]]:
        """What to send, tell removed and tell absent: every watched name compared with what the
        node holds."""
        offered = available.keys()
        scope = offered if self.wildcard else self.names & offered
        known, nacked = self.known, self._nacked
        to_send: Sequence[Resource] = [
            r
            for name in sorted(scope)
            if known.get(name) != (r := available[name]).version and nacked.get(name) != r.version
        ]
        if isinstance(available, ResourceSet) and len(to_send) == len(available):
            to_send = available.ordered  # the set's own tuple: encoded once for every stream sent it
        removed = [n for n in sorted(known) if n not in offered and self.wants(n)]
        # Names the node asked for that do not exist: say so once, so it stops waiting for them.
        absent = sorted(n for n in self.names if n not in offered and n not in known and n not in self._absent_told)
        return to_send, removed, absent

    def _moved(self, whole: ResourceSet, basis: ResourceSet) -> tuple[Sequence[Resource], list[str], list[str]]:
        """As `_compared`, for a node in step with `basis`: only what differs between the sets
        can differ from what the node holds. All of it, most often: then the very tuple every
        stream making the move is given, whose bytes are encoded once."""
        known, nacked = self.known, self._nacked
        fresh = whole.changed_since(basis)
        to_send: Sequence[Resource] = [
            r
            for r in fresh
            if self.wants(r.name) and known.get(r.name) != r.version and nacked.get(r.name) != r.version
        ]
        if len(to_send) == len(fresh):
            to_send = fresh
        gone = whole.gone_since(basis)
        removed = [n for n in gone if n in known and self.wants(n)]
        absent = [n for n in gone if n in self.names and n not in known and n not in self._absent_told]
        return to_send, removed, absent
