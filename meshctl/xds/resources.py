"""The resource model: what the generators' messages become once serialized, shared by the server's
cache and the offline commands (`meshctl dump` prints the same versions the server sends).

A `Resource` is a name, a content version and its bytes, serialized once as a
`google.protobuf.Any` and shared by every stream that sends it. A `ResourceSet` is an immutable
set of them with its set version computed once: the cache hands the same set to every proxy that
gets it, so deciding that an unchanged set needs no push costs a comparison, not a hash of every
name, on each of a thousand streams. Versions are hashes of content, so two replicas fed the same
inputs give Envoy the same versions.
"""

from __future__ import annotations

import hashlib
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field

from google.protobuf.message import Message

from meshctl.xds.names import resource_name


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Resource:
    """One xDS resource: its name, a content version, and its serialized `Any` bytes.

    Weakly referenceable so the cache can intern equal resources without keeping them alive."""

    name: str
    version: str
    body: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Serialized:
    """A message's deterministic serialization, assembled from parts serialized before (a
    route configuration from its virtual hosts: `route_assembly`) rather than by building the
    whole message and serializing it again. `to_resource` takes it as it takes the message it
    stands for, and gives the same bytes and version."""

    name: str
    value: bytes = field(repr=False)


def to_resource(message: Message | Serialized, type_url: str) -> Resource:
    """Serialize once: the `Any` bytes every stream sends, and a content version."""
    if isinstance(message, Serialized):
        name, value = message.name, message.value
    else:
        name, value = resource_name(message), message.SerializeToString(deterministic=True)
    version = hashlib.blake2b(value, digest_size=8).hexdigest()
    return Resource(name, version, encode_any(type_url, value))


def set_version(resources: Iterable[Resource]) -> str:
    """The version of a set of resources: a hash of names and versions, the same on every replica."""
    return _sorted_set_version(sorted(resources, key=lambda r: r.name))


def _sorted_set_version(ordered: Iterable[Resource]) -> str:
    # One string hashed at once: feeding the hash name by name costs more than the hashing.
    text = "".join([f"{r.name}\0{r.version}\0" for r in ordered])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


#: How many older sets `ResourceSet.changed_since` remembers its answer for.
_CHANGES_KEPT = 4


class ResourceSet(Mapping[str, Resource]):
    """Resources by name, immutable, with their set version (`set_version`) computed once."""

    __slots__ = ("__weakref__", "_by_name", "_changes", "ordered", "version")

    def __init__(self, resources: Iterable[Resource]) -> None:
        self._by_name = {r.name: r for r in resources}
        #: the resources sorted by name, as a state-of-the-world response lists them
        self.ordered = tuple(self._by_name[n] for n in sorted(self._by_name))
        self.version = _sorted_set_version(self.ordered)
        #: older set version -> (what changed since it, the names it had that this set lacks)
        self._changes: dict[str, tuple[tuple[Resource, ...], tuple[str, ...]]] = {}

    def changed_since(self, older: ResourceSet) -> tuple[Resource, ...]:
        """The resources of this set that `older` lacks or holds at another version, by name.

        Remembered for the last few older sets: every stream that moves from one set to the same
        next one (the sidecars of a namespace, after an endpoint change) gets the very same tuple,
        so the change is computed once and its bytes are encoded once. A set version stands for
        its names and versions, so it is the key."""
        return self._move(older)[0]

    def gone_since(self, older: ResourceSet) -> tuple[str, ...]:
        """The names `older` has and this set lacks, sorted (remembered as `changed_since`)."""
        return self._move(older)[1]

    def covers(self, older: ResourceSet) -> bool:
        """Whether this set names every resource `older` names (remembered as `changed_since`)."""
        return not self._move(older)[1]

    def _move(self, older: ResourceSet) -> tuple[tuple[Resource, ...], tuple[str, ...]]:
        found = self._changes.get(older.version)
        if found is None:
            before, now = older._by_name, self._by_name
            changed = tuple(r for r in self.ordered if (o := before.get(r.name)) is None or o.version != r.version)
            if len(changed) == len(self.ordered):
                changed = self.ordered
            gone = tuple(r.name for r in older.ordered if r.name not in now)
            while len(self._changes) >= _CHANGES_KEPT:
                del self._changes[next(iter(self._changes))]
            found = self._changes[older.version] = (changed, gone)
        return found

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


_LEN = 2  # wire type: length-delimited


def varint(value: int) -> bytes:
    """A protobuf varint (the wire format's lengths and tags)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field `number` holding `payload` (bytes, a string, a serialized message)."""
    return varint(number << 3 | _LEN) + varint(len(payload)) + payload


def encode_any(type_url: str, value: bytes) -> bytes:
    """google.protobuf.Any: type_url=1, value=2, from already-serialized message bytes."""
    return length_delimited(1, type_url.encode()) + length_delimited(2, value)


def decode_resource(resource: Resource, type_url: str) -> Message:
    """The message a resource holds (the inverse of `to_resource`), for the rare stage that
    reworks generated config after it was serialized (EnvoyFilter patches)."""
    from google.protobuf import any_pb2, descriptor_pool, message_factory

    packed = any_pb2.Any.FromString(resource.body)
    descriptor = descriptor_pool.Default().FindMessageTypeByName(type_url.rpartition("/")[2])
    message: Message = message_factory.GetMessageClass(descriptor).FromString(packed.value)
    return message
