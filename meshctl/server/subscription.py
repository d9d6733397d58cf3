"""Per-stream, per-type xDS subscription state, without I/O.

The ADS servicer feeds each DiscoveryRequest of a stream to the subscription of its type and asks
it what to send whenever the resources change. Everything the xDS protocol says about requests
lives here, so it is tested by driving these objects directly (no gRPC, no clock):

- State of the world (`SotwSubscription`): the node asks for a whole set. A request carrying the
  nonce of the last response is an ACK (or a NACK when `error_detail` is set); a request carrying
  an older nonce is stale and ignored. LDS and CDS are wildcard (an empty name list, or `*`); RDS
  and EDS name what they want, and names that do not exist yet are remembered and sent once they
  appear. A NACKed version is never sent again; the next different one is. For types whose
  responses may be partial (EDS and RDS, see `SotwSubscription`), a response carries only what
  the node does not hold yet.
- Incremental (`DeltaSubscription`): the node subscribes and unsubscribes names at any time, even
  on a stale nonce; it may start with the versions it already has (`initial_resource_versions`,
  after a reconnect); the server sends only what changed and names what was removed.

What one stream can make the server hold is bounded, so a proxy that misbehaves (or a client that
means harm) costs the others little: at most `MAX_NAMES` names per type (subscribed, or in
`initial_resource_versions`; a request that would pass it raises `SubscriptionLimitError` and is
not applied, and the servicer ends the stream), and at most `_UNANSWERED_KEPT` unanswered
responses tracked per type. Everything else a subscription keeps is a subset of those names or of
the resources the server offers.

What is offered and sent are `Resource`s and `ResourceSet`s (`meshctl.xds.resources`, the
resource model the cache and the offline commands share).
"""

from __future__ import annotations

import enum
import itertools
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from envoy.service.discovery.v3 import discovery_pb2

from meshctl.errors import SubscriptionLimitError
from meshctl.xds.resources import Resource, ResourceSet, set_version

WILDCARD = "*"

#: The most names of one type one stream may subscribe to (or claim in initial_resource_versions).
#: Far more than any proxy needs (a sidecar watches one assignment per cluster), far less than
#: the millions a client could send to make the server hold them.
MAX_NAMES = 100_000

#: In `DeltaSubscription.known`: the node may hold the resource, at a version not known (it
#: rejected or may have partly applied a response): it is sent again, and its removal told.
_UNKNOWN = ""


class RequestKind(enum.Enum):
    INITIAL = "initial"  # first request of this type on the stream
    ACK = "ack"
    NACK = "nack"
    STALE = "stale"  # refers to a response that is no longer the latest (SotW): ignored
    UPDATE = "update"  # delta: a subscription change without an ACK or NACK


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    kind: RequestKind
    subscription_changed: bool = False
    error: str = ""
    #: a NACK that says again what the stream's current NACK said, of the same version: worth
    #: logging and counting once (see `SotwSubscription.handle`, `DeltaSubscription.handle`)
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class Push:
    """What to send on the stream for one type: a whole set (SotW) or a delta."""

    type_url: str
    version: str
    nonce: str
    resources: tuple[Resource, ...]
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Nack:
    version: str
    nonce: str
    message: str


#: How many unanswered responses a subscription keeps track of (partial `SotwSubscription`,
#: `DeltaSubscription`): a node that leaves more unanswered makes it forget the oldest.
_UNANSWERED_KEPT = 64


def _version_of(available: Mapping[str, Resource]) -> str:
    return available.version if isinstance(available, ResourceSet) else set_version(available.values())


#: Name sets subscribed to, one copy of each: the sidecars of a namespace ask for the same
#: assignments (150 names, 8 KB a set), so a thousand streams hold ten sets, not a thousand.
#: Keyed by hash; a collision, or two event loops of one process writing at once, only costs
#: one set its sharing.
_NAME_SETS: weakref.WeakValueDictionary[int, frozenset[str]] = weakref.WeakValueDictionary()


def _shared_names(names: frozenset[str]) -> frozenset[str]:
    """`names`, or an equal set already held by another subscription."""
    key = hash(names)
    found = _NAME_SETS.get(key)
    if found is not None and found == names:
        return found
    _NAME_SETS[key] = names
    return names


def _keeper(offered: Mapping[str, Resource] | None) -> Callable[[str], str]:
    """How a name a client sent is kept. With the resources the stream is `offered`: as the name
    of the resource under it, one string every stream asking for it shares, else as sent. Not
    `sys.intern`, which only a caller without them gets: CPython's table of interned strings
    grows for good, so a client that sends 100,000 made-up names would leave the server bigger
    after its stream ended, and so would each such stream after it."""
    if offered is None:
        return sys.intern

    def keep(name: str) -> str:
        found = offered.get(name)
        return found.name if found is not None else name

    return keep


def _too_many(type_url: str, count: int, what: str, limit: int) -> SubscriptionLimitError:
    return SubscriptionLimitError(
        f"{type_url}: {count} {what}, more than the {limit} one stream may have", type_url=type_url, limit=limit
    )


def _version(offered: Mapping[str, Resource] | None, name: str, version: str) -> str:
    """A version a client says it holds, kept as the offered resource's string when they are
    the same (a thousand proxies resuming hold one copy), else as sent."""
    if offered is None:
        return sys.intern(version)
    found = offered.get(name)
    return found.version if found is not None and found.version == version else version


class _Nonces:
    """Nonces unique within a stream: a counter, readable in logs and debug pages."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


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
    """

    def __init__(
        self,
        type_url: str,
        *,
        wildcard_when_empty: bool,
        nonce_prefix: str = "",
        partial: bool = False,
        max_names: int = MAX_NAMES,
    ) -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._max_names = max_names
        self._nonces = _Nonces(nonce_prefix)
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
        names = self._names_of(request, offered)
        if len(names) - (WILDCARD in names) > self._max_names:
            raise _too_many(self.type_url, len(names) - (WILDCARD in names), "names requested", self._max_names)
        if not self.started:
            self.started = True
            self._subscribe(names)
            if request.version_info:
                # A reconnect: the node already runs this version; nothing to resend if it is current.
                self.sent_version = self.acked_version = request.version_info
                self._resumed = True
            return RequestOutcome(RequestKind.INITIAL, subscription_changed=True)
        if self.partial and request.response_nonce:
            self._answered(request.response_nonce, rejected=request.HasField("error_detail"))
        # Nothing sent on this stream yet (a resumed subscription whose versions were current):
        # the node's requests carry no nonce, and are its subscription, not stale replies.
        if request.response_nonce != (self.sent_nonce or ""):
            return RequestOutcome(RequestKind.STALE)
        changed = self._subscribe(names)
        if request.HasField("error_detail"):
            message = request.error_detail.message or "rejected"
            version = self.sent_version or ""
            repeated = self.nack is not None and self.nack.version == version
            self.nack = Nack(version, request.response_nonce, message)
            return RequestOutcome(RequestKind.NACK, changed, message, repeated)
        self.acked_version = request.version_info
        self.nack = None
        return RequestOutcome(RequestKind.ACK, changed)

    def _names_of(
        self, request: discovery_pb2.DiscoveryRequest, offered: Mapping[str, Resource] | None
    ) -> frozenset[str]:
        """The names the request asks for. Every ACK names the whole subscription again (ten
        thousand assignments for a sidecar that sees ten thousand services): when they are the
        names held, the set held is the answer, found by one comparison in C rather than a
        lookup per name in `offered`."""
        raw = request.resource_names
        if self.started and len(raw) == len(self.names):
            same = frozenset(raw)
            if same == self.names:
                return self.names
        return frozenset(map(_keeper(offered), raw))

    def _subscribe(self, names: frozenset[str]) -> bool:
        wildcard = WILDCARD in names or (not names and self._wildcard_when_empty)
        if WILDCARD in names:
            names = names - {WILDCARD}
        changed = wildcard != self.wildcard or names != self.names
        if not changed:
            return False  # the set held stays: every ACK names it again
        self.wildcard, self.names = wildcard, _shared_names(names)
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
        """The response to send now, or None when the node already has (or rejected) this set."""
        if not self.started:
            return None
        whole = available if isinstance(available, ResourceSet) else None
        if whole is not None and not (self.wildcard or whole.keys() <= self.names):
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
            return None
        if self.nack is not None and version == self.nack.version:
            return None
        resources = chosen
        if self.partial:
            resources = self._unheld(chosen, whole)
            self._short = False
            if not resources and version == self.sent_version:
                return None
        self.sent_version = version
        self.sent_nonce = self._nonces.next()
        if self.partial:
            self._unanswered[self.sent_nonce] = resources
            while len(self._unanswered) > _UNANSWERED_KEPT:
                del self._unanswered[next(iter(self._unanswered))]
                self._untracked = True
        return Push(self.type_url, version, self.sent_nonce, resources)

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

    A request that would leave more than `max_names` names subscribed, or a first request with
    more than `max_names` initial versions, raises `SubscriptionLimitError` and changes nothing.
    """

    def __init__(
        self, type_url: str, *, wildcard_when_empty: bool, nonce_prefix: str = "", max_names: int = MAX_NAMES
    ) -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._max_names = max_names
        self._nonces = _Nonces(nonce_prefix)
        self.started = False
        self.wildcard = False
        self.names: set[str] = set()
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
        for name in request.resource_names_subscribe:
            changed = True
            if name == WILDCARD:
                self.wildcard = True
                continue
            self.names.add(keep(name))
            if kind is not RequestKind.INITIAL and name in self.known:
                # An explicit subscribe asks for the resource even if the node had it before.
                self.known[name] = _UNKNOWN
            self._absent_told.discard(name)
        for name in request.resource_names_unsubscribe:
            changed = True
            if name == WILDCARD:
                self.wildcard = False
                continue
            self.names.discard(name)
            self.known.pop(name, None)
            self._nacked.pop(name, None)
            self._absent_told.discard(name)
        if not request.response_nonce:
            return RequestOutcome(kind, changed)
        return self._answered(request, kind, changed)

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
        scope = available.keys() if self.wildcard else self.names & available.keys()
        to_send = []
        for name in sorted(scope):
            r = available[name]
            if self.known.get(name) == r.version or self._nacked.get(name) == r.version:
                continue
            to_send.append(r)
        removed = [n for n in sorted(self.known) if n not in available and self.wants(n)]
        # Names the node asked for that do not exist: say so once, so it stops waiting for them.
        absent = sorted(
            n for n in self.names if n not in available and n not in self.known and n not in self._absent_told
        )
        if not to_send and not removed and not absent:
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
        resources, gone = tuple(to_send), tuple(removed + absent)
        nonce = self._sent_nonce = self._nonces.next()
        self.sent_version = _version_of(available)
        self._in_flight[nonce] = (self.sent_version, resources, gone)
        while len(self._in_flight) > _UNANSWERED_KEPT:
            del self._in_flight[next(iter(self._in_flight))]
            self._untracked = True
        return Push(self.type_url, self.sent_version, nonce, resources, gone)
