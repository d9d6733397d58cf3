"""DiscoveryResponse bytes from pre-serialized resources, without building protobuf objects.

A resource is serialized once per version (as a `google.protobuf.Any`) and shared by every
stream; a response is then only its envelope fields and those shared bytes, concatenated in
protobuf's wire format. With a thousand proxies, this is the difference between serializing each
cluster once and serializing it a thousand times.
"""

from __future__ import annotations

from collections.abc import Callable

from meshctl.server.subscription import Push
from meshctl.xds.resources import Resource, length_delimited, varint

_LEN = 2  # wire type: length-delimited


def _string(number: int, text: str) -> bytes:
    return length_delimited(number, text.encode()) if text else b""


_RESOURCE_TAG = varint(2 << 3 | _LEN)


class BlockCache:
    """The last few encoded `version_info` and `resources` fields, by the version and the
    identity of the tuple they encode.

    The same tuple (a `ResourceSet`'s) is often pushed to many streams in a row, under the same
    version: an endpoint change sends one namespace's assignments to every sidecar there. Under
    a shared nonce the whole response is the same, and kept (`envelope`); under a stream's own,
    the bytes differ only by it, and the block before it is kept (`get`). An entry holds its tuple, so the id cannot be
    reused while it lives. Used from one thread (the event loop).

    The streams of a publication come in no particular order, so the blocks of every namespace
    (each has its own route configs and assignments) are wanted in turn: the cache holds up to
    `size` of them, and `max_bytes` between them, the oldest going first."""

    def __init__(self, size: int = 64, max_bytes: int = 16 << 20) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        #: (id of a tuple, version, type URL, nonce) -> (the tuple, its bytes): a block (`get`)
        #: has no type URL or nonce, an envelope (`envelope`) has both
        self._blocks: dict[tuple[int, str, str, str], tuple[tuple[Resource, ...], bytes]] = {}
        #: id of a tuple -> (the tuple, its bodies' bytes), for `size`
        self._sizes: dict[int, tuple[tuple[Resource, ...], int]] = {}

    def get(self, resources: tuple[Resource, ...], version: str = "") -> bytes:
        """`version_info` (field 1, when `version` is given) and `resources` (field 2), encoded."""
        return self._entry(resources, version, "", "", lambda: _string(1, version) + _resources(resources))

    def delta_resources(self, resources: tuple[Resource, ...]) -> bytes:
        """DeltaDiscoveryResponse's `resources` (field 2), encoded: the subscriptions hand the
        streams making the same move the same tuple (what changed between two sets), so an
        endpoint change encodes a namespace's assignment once, not once per sidecar."""
        return self._entry(resources, "", "", _DELTA_BLOCK, lambda: _delta_resources(resources))

    def delta_envelope(self, push: Push) -> bytes:
        """The whole DeltaDiscoveryResponse of a `shared` push (no removals), one bytes object for
        every stream sent it, as `envelope` is for state of the world: a route configuration
        change otherwise copies 400 KB per sidecar, and a thousand sidecars connecting each
        hold a copy of their namespace's routes and endpoints until gRPC has written them."""
        resources, version, type_url, nonce = push.resources, push.version, push.type_url, push.nonce

        def make() -> bytes:
            parts = [_string(1, version), *_delta_resource_parts(resources), _type_field(type_url), _string(5, nonce)]
            return b"".join(parts)

        return self._entry(resources, version, type_url, _DELTA_BLOCK + nonce, make)

    def envelope(self, push: Push) -> bytes:
        """The whole response of a `shared` push, one bytes object for every stream sent it:
        the streams of a namespace are sent the same response under the same nonce
        (`SharedNonces`), and a response of its own per stream would be 400 KB allocated,
        faulted in and copied per stream of a route configuration change. Made in one copy of
        the bodies, without the block (`get`) a stream's own nonce would need."""
        resources, version, type_url, nonce = push.resources, push.version, push.type_url, push.nonce

        def make() -> bytes:
            parts = [_string(1, version)]
            for r in resources:
                parts += (_RESOURCE_TAG, varint(len(r.body)), r.body)
            parts += (_type_field(type_url), _string(5, nonce))
            return b"".join(parts)

        return self._entry(resources, version, type_url, nonce, make)

    def _entry(
        self, resources: tuple[Resource, ...], version: str, type_url: str, nonce: str, make: Callable[[], bytes]
    ) -> bytes:
        key = (id(resources), version, type_url, nonce)
        found = self._blocks.get(key)
        if found is not None and found[0] is resources:
            return found[1]
        block = make()
        if found is not None:  # an id reused by another tuple: its entry is replaced
            self._bytes -= len(self._blocks.pop(key)[1])
        self._blocks[key] = (resources, block)
        self._bytes += len(block)
        while len(self._blocks) > 1 and (len(self._blocks) > self._size or self._bytes > self._max_bytes):
            self._bytes -= len(self._blocks.pop(next(iter(self._blocks)))[1])
        return block

    def size(self, resources: tuple[Resource, ...]) -> int:
        """The bytes of `resources`' bodies, about what a response of them weighs, counted once
        per tuple: a change sends the same tuple to many streams (the write budget asks each
        time, and at 10,000 services a tuple holds over a thousand resources)."""
        found = self._sizes.get(id(resources))
        if found is not None and found[0] is resources:
            return found[1]
        size = sum(len(r.body) for r in resources)
        self._sizes[id(resources)] = (resources, size)
        while len(self._sizes) > 4 * self._size:
            del self._sizes[next(iter(self._sizes))]
        return size


#: The nonce part of the key of a `delta_resources` block, and the start of a `delta_envelope`'s:
#: no response's nonce starts with it, and only the blocks of `get` have none.
_DELTA_BLOCK = "\0delta"

#: `type_url` (field 4) of each type served, encoded once.
_TYPE_FIELDS: dict[str, bytes] = {}


def _type_field(type_url: str) -> bytes:
    found = _TYPE_FIELDS.get(type_url)
    if found is None:
        found = _string(4, type_url)
        if len(_TYPE_FIELDS) < 64:  # the types served; a made-up one is encoded each time
            _TYPE_FIELDS[type_url] = found
    return found


def _resources(resources: tuple[Resource, ...]) -> bytes:
    """DiscoveryResponse.resources (field 2), each body copied once, into the result."""
    parts: list[bytes] = []
    for r in resources:
        parts += (_RESOURCE_TAG, varint(len(r.body)), r.body)
    return b"".join(parts)


def encode_sotw(push: Push, control_plane: bytes = b"", *, blocks: BlockCache | None = None) -> bytes:
    """envoy.service.discovery.v3.DiscoveryResponse: version_info=1, resources=2, type_url=4,
    nonce=5, control_plane=6 (an already-serialized ControlPlane message)."""
    if blocks is not None and push.shared and not control_plane:
        return blocks.envelope(push)
    if blocks is not None:
        head = blocks.get(push.resources, push.version)
    else:
        head = _string(1, push.version) + _resources(push.resources)
    parts = [head, _type_field(push.type_url), _string(5, push.nonce)]
    if control_plane:
        parts.append(length_delimited(6, control_plane))
    return b"".join(parts)


def encode_delta(push: Push, control_plane: bytes = b"", *, blocks: BlockCache | None = None) -> bytes:
    """envoy.service.discovery.v3.DeltaDiscoveryResponse: system_version_info=1, resources=2
    (Resource: version=1, resource=2, name=3), type_url=4, nonce=5, removed_resources=6,
    control_plane=7. With `blocks`, the resources are encoded once per tuple, and a `shared`
    push's whole response once for every stream sent it."""
    if blocks is not None and push.shared and not push.removed and not control_plane:
        return blocks.delta_envelope(push)
    body = blocks.delta_resources(push.resources) if blocks is not None else _delta_resources(push.resources)
    parts = [_string(1, push.version), body, _type_field(push.type_url), _string(5, push.nonce)]
    parts.extend(length_delimited(6, name.encode()) for name in push.removed)
    if control_plane:
        parts.append(length_delimited(7, control_plane))
    return b"".join(parts)


def _delta_resources(resources: tuple[Resource, ...]) -> bytes:
    """DeltaDiscoveryResponse.resources (field 2), encoded."""
    return b"".join(_delta_resource_parts(resources))


def _delta_resource_parts(resources: tuple[Resource, ...]) -> list[bytes]:
    """The pieces of DeltaDiscoveryResponse.resources (field 2): each a Resource{version=1,
    resource=2, name=3}, framed around the body, which is not copied until they are joined."""
    parts: list[bytes] = []
    for r in resources:
        version, name = _string(1, r.version), _string(3, r.name)
        body_header = varint(2 << 3 | _LEN) + varint(len(r.body))
        size = len(version) + len(body_header) + len(r.body) + len(name)
        parts += (_RESOURCE_TAG, varint(size), version, body_header, r.body, name)
    return parts
