"""Per-stream, per-type xDS subscription state, without I/O.

The ADS servicer feeds each DiscoveryRequest of a stream to the subscription of its type and asks
it what to send whenever the resources change. Everything the xDS protocol says about requests
lives here, so it is tested by driving these objects directly (no gRPC, no clock):

- State of the world (`SotwSubscription`): the node asks for a whole set. A request carrying the
  nonce of the last response is an ACK (or a NACK when `error_detail` is set); a request carrying
  an older nonce is stale and ignored. LDS and CDS are wildcard (an empty name list, or `*`); RDS
  and EDS name what they want, and names that do not exist yet are remembered and sent once they
  appear. A NACKed version is never sent again; the next different one is.
- Incremental (`DeltaSubscription`): the node subscribes and unsubscribes names at any time, even
  on a stale nonce; it may start with the versions it already has (`initial_resource_versions`,
  after a reconnect); the server sends only what changed and names what was removed.

A `Resource` is a name, a content version and its bytes, serialized once as a
`google.protobuf.Any` and shared by every stream that sends it. A `ResourceSet` is an immutable
set of them with its set version computed once: the cache hands the same set to every proxy that
gets it, so deciding that an unchanged set needs no push costs a comparison, not a hash of every
name, on each of a thousand streams.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

WILDCARD = "*"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Resource:
    """One xDS resource: its name, a content version, and its serialized `Any` bytes.

    Weakly referenceable so the cache can intern equal resources without keeping them alive."""

    name: str
    version: str
    body: bytes = field(repr=False)


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


def set_version(resources: Iterable[Resource]) -> str:
    """The version of a set of resources: a hash of names and versions, the same on every replica."""
    h = hashlib.blake2b(digest_size=8)
    for r in sorted(resources, key=lambda r: r.name):
        h.update(r.name.encode())
        h.update(b"\0")
        h.update(r.version.encode())
        h.update(b"\0")
    return h.hexdigest()


class ResourceSet(Mapping[str, Resource]):
    """Resources by name, immutable, with their set version (`set_version`) computed once."""

    __slots__ = ("__weakref__", "_by_name", "ordered", "version")

    def __init__(self, resources: Iterable[Resource]) -> None:
        self._by_name = {r.name: r for r in resources}
        #: the resources sorted by name, as a state-of-the-world response lists them
        self.ordered = tuple(self._by_name[n] for n in sorted(self._by_name))
        self.version = set_version(self.ordered)

    def __getitem__(self, name: str) -> Resource:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    # The dict's own views: Mapping's generic ones go through __getitem__ name by name.
    def keys(self) -> KeysView[str]:
        return self._by_name.keys()

    def values(self) -> ValuesView[Resource]:
        return self._by_name.values()

    def items(self) -> ItemsView[str, Resource]:
        return self._by_name.items()

    def __repr__(self) -> str:
        return f"ResourceSet({len(self)} resources, version {self.version})"


def _version_of(available: Mapping[str, Resource]) -> str:
    return available.version if isinstance(available, ResourceSet) else set_version(available.values())


class _Nonces:
    """Nonces unique within a stream: a counter, readable in logs and debug pages."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


class SotwSubscription:
    """State of the world for one type on one stream."""

    def __init__(self, type_url: str, *, wildcard_when_empty: bool, nonce_prefix: str = "") -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._nonces = _Nonces(nonce_prefix)
        self.started = False
        self.wildcard = False
        self.names: frozenset[str] = frozenset()
        self.sent_version: str | None = None
        self.sent_nonce: str | None = None
        self.acked_version: str | None = None
        self.nack: Nack | None = None

    def handle(self, request: discovery_pb2.DiscoveryRequest) -> RequestOutcome:
        names = frozenset(request.resource_names)
        if not self.started:
            self.started = True
            self._subscribe(names)
            if request.version_info:
                # A reconnect: the node already runs this version; nothing to resend if it is current.
                self.sent_version = self.acked_version = request.version_info
            return RequestOutcome(RequestKind.INITIAL, subscription_changed=True)
        if request.response_nonce != self.sent_nonce:
            return RequestOutcome(RequestKind.STALE)
        changed = self._subscribe(names)
        if request.HasField("error_detail"):
            message = request.error_detail.message or "rejected"
            self.nack = Nack(self.sent_version or "", request.response_nonce, message)
            return RequestOutcome(RequestKind.NACK, changed, message)
        self.acked_version = request.version_info
        self.nack = None
        return RequestOutcome(RequestKind.ACK, changed)

    def _subscribe(self, names: frozenset[str]) -> bool:
        wildcard = WILDCARD in names or (not names and self._wildcard_when_empty)
        names = names - {WILDCARD}
        changed = wildcard != self.wildcard or names != self.names
        self.wildcard, self.names = wildcard, names
        return changed

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def resend(self, names: Iterable[str]) -> None:
        """Send the set again even if unchanged when it holds any of `names`: an updated cluster
        stays warming until it receives a fresh EDS response, whatever its version."""
        if any(self.wants(n) for n in names):
            self.sent_version = None

    @property
    def awaiting_ack(self) -> bool:
        return self.sent_version is not None and self.sent_version != self.acked_version and self.nack is None

    def next_push(self, available: Mapping[str, Resource]) -> Push | None:
        """The response to send now, or None when the node already has (or rejected) this set."""
        if not self.started:
            return None
        if isinstance(available, ResourceSet) and (self.wildcard or available.keys() <= self.names):
            chosen, version = available.ordered, available.version  # the whole set: hashed already
        else:
            if self.wildcard:
                chosen = tuple(available[n] for n in sorted(available))
            else:
                chosen = tuple(available[n] for n in sorted(self.names) if n in available)
            version = set_version(chosen)
        if version == self.sent_version:
            return None
        if self.nack is not None and version == self.nack.version:
            return None
        self.sent_version = version
        self.sent_nonce = self._nonces.next()
        return Push(self.type_url, version, self.sent_nonce, chosen)


class DeltaSubscription:
    """Incremental xDS for one type on one stream."""

    def __init__(self, type_url: str, *, wildcard_when_empty: bool, nonce_prefix: str = "") -> None:
        self.type_url = type_url
        self._wildcard_when_empty = wildcard_when_empty
        self._nonces = _Nonces(nonce_prefix)
        self.started = False
        self.wildcard = False
        self.names: set[str] = set()
        #: What the node holds, name -> version, as far as we know.
        self.known: dict[str, str] = {}
        self._absent_told: set[str] = set()
        self._nacked: dict[str, str] = {}
        self._in_flight: dict[str, tuple[Resource, ...]] = {}
        self.sent_version: str | None = None
        self.acked_version: str | None = None
        self.nack: Nack | None = None
        #: A ResourceSet found to need no push; the same set needs none until a request comes.
        self._settled: ResourceSet | None = None

    def handle(self, request: discovery_pb2.DeltaDiscoveryRequest) -> RequestOutcome:
        self._settled = None
        changed = False
        kind = RequestKind.UPDATE
        if not self.started:
            self.started = True
            kind = RequestKind.INITIAL
            changed = True
            self.known.update(request.initial_resource_versions)
            if not request.resource_names_subscribe and self._wildcard_when_empty:
                self.wildcard = True
        for name in request.resource_names_subscribe:
            changed = True
            if name == WILDCARD:
                self.wildcard = True
                continue
            self.names.add(name)
            if kind is not RequestKind.INITIAL:
                # An explicit subscribe asks for the resource even if the node had it before.
                self.known.pop(name, None)
            self._absent_told.discard(name)
        for name in request.resource_names_unsubscribe:
            changed = True
            if name == WILDCARD:
                self.wildcard = False
                continue
            self.names.discard(name)
            self.known.pop(name, None)
            self._absent_told.discard(name)

        error = ""
        if request.response_nonce:
            sent = self._in_flight.pop(request.response_nonce, None)
            if request.HasField("error_detail"):
                kind = RequestKind.NACK
                error = request.error_detail.message or "rejected"
                self.nack = Nack(self.sent_version or "", request.response_nonce, error)
                for r in sent or ():
                    # The node did not apply these: forget them, and never resend this content.
                    self._nacked[r.name] = r.version
                    if self.known.get(r.name) == r.version:
                        del self.known[r.name]
            elif sent is not None:
                kind = RequestKind.ACK
                self.nack = None
                self.acked_version = self.sent_version
        return RequestOutcome(kind, changed, error)

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def resend(self, names: Iterable[str]) -> None:
        """Send these resources again even if the node holds their version (see SotwSubscription)."""
        self._settled = None
        for name in names:
            if self.wants(name):
                self.known.pop(name, None)

    @property
    def awaiting_ack(self) -> bool:
        return bool(self._in_flight)

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
            if not self._in_flight:
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
        self._absent_told.update(absent)
        nonce = self._nonces.next()
        self._in_flight[nonce] = tuple(to_send)
        self.sent_version = _version_of(available)
        return Push(self.type_url, self.sent_version, nonce, tuple(to_send), tuple(removed + absent))
