"""What the state-of-the-world and incremental subscriptions share: the request kinds and
outcomes, what a push is, the bounds on what a stream may make the server hold, and how names
and versions a client sends are kept (`meshctl.server.subscription` says how it all fits)."""

from __future__ import annotations

import enum
import itertools
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshctl.errors import SubscriptionLimitError
from meshctl.xds.resources import Resource, ResourceSet, set_version

WILDCARD = "*"

#: The most names of one type one stream may subscribe to (or claim in initial_resource_versions).
#: Far more than any proxy needs (a sidecar watches one assignment per cluster), far less than
#: the millions a client could send to make the server hold them.
MAX_NAMES = 100_000


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
    #: the nonce is a `SharedNonces` one: every stream sent this response is sent the same bytes
    shared: bool = False


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


#: The last few (set, names) pairs `names_cover` answered, by their ids (each entry holds both,
#: so the ids stay theirs).
_COVERED: dict[tuple[int, int], tuple[ResourceSet, frozenset[str], bool]] = {}
_COVERED_KEPT = 64


def names_cover(offered: ResourceSet, names: frozenset[str]) -> bool:
    """Whether `names` holds every name `offered` has: asked at every push of every stream (is
    the set all the stream subscribes to? does the stream watch every assignment it is sent
    clusters for?), a comparison of a thousand names at 10,000 services. The sidecars of a
    namespace are offered the very same set and hold the very same names (`_shared_names`), so
    it is answered once per pair. Used from one thread (the event loop)."""
    key = (id(offered), id(names))
    found = _COVERED.get(key)
    if found is not None and found[0] is offered and found[1] is names:
        return found[2]
    covered = offered.keys() <= names
    while len(_COVERED) >= _COVERED_KEPT:
        del _COVERED[next(iter(_COVERED))]
    _COVERED[key] = (offered, names, covered)
    return covered


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


class SharedNonces:
    """Nonces shared by the streams sent the same state-of-the-world response, so that its
    bytes can be encoded once and handed to each of them (`encode.BlockCache.envelope`): a
    change sends one 400 KB route configuration to every sidecar of a namespace, and a nonce of
    each stream's own would make each response a copy of its own.

    Keyed by type, version and the identity of the resources tuple (a `ResourceSet`'s, or a
    difference shared by the streams making the same move); an entry holds its tuple, so the id
    cannot be reused while it lives. A serial comes from one counter, so a later response never
    gets an earlier one's: a subscription takes a serial only above the last it took
    (`SotwSubscription.next_push`), which keeps nonces unique within its stream. Bounded like
    the block cache, and as large (the tuples it holds keep their resources alive): an entry
    dropped only costs the streams still to be sent it the sharing. Used from one thread (the
    event loop)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._serials = itertools.count(1)
        self._entries: dict[tuple[str, str, int], tuple[tuple[Resource, ...], int]] = {}

    def serial(self, type_url: str, version: str, resources: tuple[Resource, ...]) -> int:
        """The serial of this response, the same for every stream asking while it is kept."""
        key = (type_url, version, id(resources))
        found = self._entries.get(key)
        if found is not None and found[0] is resources:
            return found[1]
        serial = next(self._serials)
        self._entries.pop(key, None)  # an id reused by another tuple: its entry is replaced
        self._entries[key] = (resources, serial)
        while len(self._entries) > self._size:
            del self._entries[next(iter(self._entries))]
        return serial


#: What follows a subscription's prefix in a shared nonce: a stream's own nonces are the prefix
#: and digits alone, so the two never meet.
SHARED_MARK = "s"


class _Nonces:
    """Nonces unique within a stream: a counter, readable in logs and debug pages; and, with
    `shared`, the nonce every stream sent the same response takes (`SharedNonces`), unless its
    serial is not above the last shared one this stream took (the same response again, or an
    older one back): then the stream's own, so nonces stay unique within the stream."""

    def __init__(self, prefix: str, shared: SharedNonces | None = None) -> None:
        self._prefix = prefix
        self._counter = itertools.count(1)
        self._shared = shared
        #: the last serial taken from `_shared`: the next must be above it
        self._shared_serial = 0

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"

    def for_response(self, type_url: str, version: str, resources: tuple[Resource, ...]) -> tuple[str, bool]:
        """The nonce of a response of `resources` at `version`, and whether it is the shared one."""
        if self._shared is not None:
            serial = self._shared.serial(type_url, version, resources)
            if serial > self._shared_serial:
                self._shared_serial = serial
                return f"{self._prefix}{SHARED_MARK}{serial}", True
        return self.next(), False
