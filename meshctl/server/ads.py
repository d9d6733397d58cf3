"""The ADS servicer: gRPC streams in, pre-serialized responses out (grpc.aio, one task per stream).

It knows nothing of Istio kinds, nor of snapshots: each stream is a `Connection` (sans-IO
state); this module only reads requests, asks its `ConfigSource` (the shared `ResourceCache`)
to resolve the node in the state last published (bound proxy and resources), and writes what
`Connection.pushes()` says, encoded from shared bytes (`encode`). The published state is opaque
here: it goes from `publish` to the source untouched. A new snapshot is resolved for every
stream; only a stream offered sets other than those it holds is woken (`Connection.update`),
and it then decides alone what to send, so a change outside a proxy's scope sends it nothing.

Binding and generation run on one worker thread, never on the event loop. Generating a large
proxy's config takes a good fraction of a second; on the loop, a fleet connecting at once would
keep it busy for minutes, during which gRPC accepts no new call (and cancels those it has held
unaccepted for 30 s), and no ACK or push of an already served proxy moves. One thread keeps the
work in order (a stream's first binding before the snapshots published after it) and the loop
free; each stream applies only results newer than the ones it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import json_format

from meshctl.errors import NodeIdError, SubscriptionLimitError
from meshctl.logs import untrusted
from meshctl.server.cache import ProxyResources, Resolved
from meshctl.server.connection import Connection
from meshctl.server.encode import BlockCache, encode_delta, encode_sotw
from meshctl.server.pacing import TokenBucket
from meshctl.server.subscription import Push, RequestKind
from meshctl.snapshot.proxy import METADATA_KEYS, Proxy, ProxyNode, parse_node_id
from meshctl.xds import types

logger = logging.getLogger("meshctl.server.ads")

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
#: The UNAVAILABLE message of a stream refused by `--max-new-streams-per-second`.
TOO_MANY_NEW_STREAMS = "too many new streams on this replica; retry"

#: Unsupported type URLs logged per stream; a client asking for more is not worth more lines.
_UNSUPPORTED_LOGGED = 8
#: How long a refused stream waits for its first request before the refusal is sent anyway.
_FIRST_REQUEST_WAIT = 1.0


@dataclass(eq=False)
class Stream:
    """A live stream: its protocol state, the proxy it is bound to, and its wake-up event."""

    connection: Connection
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: The node as its first request named it (attested when a client certificate proved it).
    node: ProxyNode | None = None
    proxy: Proxy | None = None
    #: When the change being pushed was first seen (for pilot_proxy_convergence_time).
    change_seen: float | None = None
    #: The publication the stream's resources come from: older results are not applied.
    epoch: int = -1
    #: The node id as logs show it: escaped and shortened (`untrusted`).
    label: str = ""
    #: Unsupported type URLs already logged for this stream (at most `_UNSUPPORTED_LOGGED`).
    unsupported: set[str] = field(default_factory=set)


class PushObserver:
    """What the servicer reports as it works; the metrics implement it (no-ops by default)."""

    def pushed(self, stream: Stream, push: Push, size: int) -> None: ...

    def rejected(self, stream: Stream, type_url: str, error: str) -> None: ...

    def connected(self, count: int) -> None: ...

    def converged(self, stream: Stream, seconds: float) -> None: ...


#: Decides whether a stream may ask for a node's config: None to allow, else why not (the
#: stream is then refused with PERMISSION_DENIED and the reason is logged). A node an authorizer
#: allowed is bound as attested (`ProxyNode.attested`).
Authorizer = Callable[[ProxyNode, "grpc.aio.ServicerContext[Any, Any]"], str | None]


class ConfigSource(Protocol):
    """Where the servicer gets a node's config: the seam between serving and generation
    (`ResourceCache` implements it). `state` is what was published (a snapshot), opaque here."""

    def resolve(self, node: ProxyNode, state: Any) -> Resolved: ...


class AdsServicer:
    """Serves State-of-the-World and Delta ADS from the latest published state."""

    def __init__(
        self,
        cache: ConfigSource,
        snapshot: Callable[[], object | None],
        observer: PushObserver | None = None,
        authorize: Authorizer | None = None,
        admit: Callable[[], str | None] | None = None,
        *,
        pace: TokenBucket | None = None,
    ) -> None:
        self._cache = cache
        self._snapshot = snapshot
        self._observer = observer or PushObserver()
        self._authorize = authorize
        #: None when a new stream may be served, else why not (it is refused with UNAVAILABLE).
        self._admission = admit
        #: New streams a second, beyond which they are refused with UNAVAILABLE (`meshctl.server.pacing`).
        self._pace = pace
        self._ids = itertools.count(1)
        self.streams: dict[str, Stream] = {}
        self._epoch = 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-generate")
        self._blocks = BlockCache()

    def handlers(self) -> grpc.GenericRpcHandler[Any, Any]:
        return ads_handlers(self.stream_sotw, self.stream_delta)

    async def stream_sotw(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await self._serve(requests, context, delta=False)

    async def stream_delta(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await self._serve(requests, context, delta=True)

    # -- one stream --------------------------------------------------------------------------

    async def _serve(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any], *, delta: bool
    ) -> None:
        refusal = self._admission() if self._admission is not None else None
        if refusal is not None:
            logger.debug("refused a stream from %s: %s", context.peer(), refusal)
            await _refuse(requests, context, refusal)
        if self._pace is not None and not self._pace.take():
            # Envoy retries with jittered backoff; the streams already open are not slowed down.
            logger.debug("refused a stream from %s: over %g new streams a second", context.peer(), self._pace.rate)
            await _refuse(requests, context, TOO_MANY_NEW_STREAMS)
        conn_id = f"{context.peer()}-{next(self._ids)}"
        stream = Stream(Connection(conn_id, delta=delta))
        reader = asyncio.create_task(self._read(stream, requests, context))
        # The reader ending wakes the stream too: one event to wait on, no task per wake-up.
        reader.add_done_callback(lambda _: stream.wake.set())
        try:
            while True:
                await stream.wake.wait()
                if reader.done():
                    reader.result()  # raises what ended the reader (an abort), else the client left
                    return
                stream.wake.clear()
                # Decided here, so a wake-up with nothing to send (an ACK, most of them) costs no
                # task: only writes need watching.
                pushes = stream.connection.pushes()
                if not pushes:
                    stream.change_seen = None
                    continue
                # A client that stops reading blocks the writes for good: the reader ending (the
                # stream aborted for abuse, or the client gone) must still end the stream.
                flush = asyncio.ensure_future(self._flush(stream, pushes, context))
                await asyncio.wait((flush, reader), return_when=asyncio.FIRST_COMPLETED)
                if not flush.done():
                    flush.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await flush
                    reader.result()
                    return
                flush.result()
        finally:
            reader.cancel()
            if self.streams.pop(conn_id, None) is not None:
                self._observer.connected(len(self.streams))
                logger.info("proxy %s disconnected", stream.label or conn_id)

    async def _read(
        self, stream: Stream, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        conn = stream.connection
        async for request in requests:
            if stream.node is None:
                await self._admit(stream, request, context)
            type_url = request.type_url
            if type_url not in types.SHORT_NAMES:
                if len(stream.unsupported) < _UNSUPPORTED_LOGGED and type_url not in stream.unsupported:
                    stream.unsupported.add(type_url)
                    logger.warning("proxy %s asked for unsupported type %s", stream.label, untrusted(type_url))
                continue
            try:
                outcome = conn.handle(type_url, request)
            except SubscriptionLimitError as exc:
                logger.warning("ended the stream of proxy %s: %s", stream.label, exc)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            if outcome.kind is RequestKind.NACK and not outcome.repeated:
                short = types.SHORT_NAMES[type_url]
                logger.warning("proxy %s rejected %s: %s", stream.label, short, untrusted(outcome.error, 2000))
                self._observer.rejected(stream, type_url, outcome.error)
            stream.wake.set()

    async def _admit(self, stream: Stream, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """The first request: parse and authorize its node, then bind it and generate its config."""
        if not request.HasField("node") or not request.node.id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first request must carry node.id")
        try:
            node = parse_node_id(request.node.id, _metadata(request.node.metadata))
        except NodeIdError as exc:
            logger.warning("refused a stream from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        stream.label = untrusted(node.id)
        if self._authorize is not None:
            refusal = self._authorize(node, context)
            if refusal is not None:
                logger.warning("refused node %s from %s: %s", stream.label, context.peer(), refusal)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
            node = replace(node, attested=True)
        conn = stream.connection
        stream.node = node
        conn.node_id = node.id
        self.streams[conn.id] = stream
        self._observer.connected(len(self.streams))
        logger.info("proxy %s connected (%s)", stream.label, "delta" if conn.delta else "sotw")
        try:
            await self._bind(stream, self._snapshot())
        except Exception:
            logger.exception("generating config for %s failed", stream.label)
            await context.abort(grpc.StatusCode.INTERNAL, "config generation failed; see the server log")

    async def _bind(self, stream: Stream, snapshot: object | None) -> None:
        node = stream.node
        if snapshot is None or node is None:
            return
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        proxy, resources = await loop.run_in_executor(self._worker, self._resolve, node, snapshot)
        self._apply(stream, epoch, proxy, resources)

    def _resolve(self, node: ProxyNode, snapshot: object) -> tuple[Proxy, ProxyResources]:
        """On the worker thread: the node bound in `snapshot`, and its resources."""
        resolved = self._cache.resolve(node, snapshot)
        return resolved.proxy, resolved.resources

    def _resolve_many(
        self, streams: Sequence[Stream], snapshot: object
    ) -> list[tuple[Proxy, ProxyResources] | BaseException]:
        out: list[tuple[Proxy, ProxyResources] | BaseException] = []
        for stream in streams:
            try:
                assert stream.node is not None  # only admitted streams are in self.streams
                out.append(self._resolve(stream.node, snapshot))
            except Exception as exc:
                out.append(exc)
        return out

    def _apply(self, stream: Stream, epoch: int, proxy: Proxy, resources: ProxyResources) -> bool:
        """On the loop: take the result for publication `epoch`, unless a newer one was taken.
        True when the stream has something new to push (`Connection.update`)."""
        if stream.epoch > epoch:
            return False
        stream.epoch = epoch
        stream.proxy = proxy
        return stream.connection.update(resources)

    async def _flush(
        self, stream: Stream, pushes: Sequence[Push], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        conn = stream.connection
        for push in pushes:
            data = encode_delta(push) if conn.delta else encode_sotw(push, blocks=self._blocks)
            await context.write(data)
            self._observer.pushed(stream, push, len(data))
        if stream.change_seen is not None:
            self._observer.converged(stream, time.monotonic() - stream.change_seen)
        stream.change_seen = None

    # -- snapshots ---------------------------------------------------------------------------

    async def publish(
        self, snapshot: object, seen: float | None = None, *, batch: int = 16, nodes: Collection[str] | None = None
    ) -> None:
        """Give every stream (or those of `nodes` only: a state that changed for them alone, as a
        renewed certificate) the new snapshot, `batch` streams per trip to the worker thread."""
        seen = seen or time.monotonic()
        self._epoch += 1
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        streams = [
            s for s in self.streams.values() if nodes is None or (s.node is not None and s.node.id in nodes)
        ]
        for start in range(0, len(streams), batch):
            chunk = streams[start : start + batch]
            results = await loop.run_in_executor(self._worker, self._resolve_many, chunk, snapshot)
            for stream, result in zip(chunk, results, strict=True):
                if isinstance(result, BaseException):
                    # One proxy whose config cannot be generated must not stop the others' pushes.
                    logger.error(
                        "generating config for %s failed; it keeps its last config", stream.label, exc_info=result
                    )
                    continue
                if not self._apply(stream, epoch, *result):
                    continue
                if stream.change_seen is None:
                    stream.change_seen = seen
                stream.wake.set()


async def _refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any], why: str) -> None:
    """End a stream with UNAVAILABLE once its first request is in (or after a second without one).

    A status sent while the client is still writing its first request fails that write, and
    gRPC's asyncio client then reports INTERNAL "Internal error from Core" in place of our
    UNAVAILABLE, which a client must retry (grpc/grpc#36066). Envoy sends its first request at
    once and nothing more until answered, so waiting for it makes the refusal arrive whole.
    """
    with contextlib.suppress(Exception):
        await asyncio.wait_for(anext(aiter(requests)), _FIRST_REQUEST_WAIT)
    await context.abort(grpc.StatusCode.UNAVAILABLE, why)


def _metadata(struct: Any) -> dict[str, Any]:
    """The node metadata keys meshctl reads, as plain values; the rest is the node's business and
    is neither converted nor kept. Raises NodeIdError for values JSON cannot hold (Infinity)."""
    fields = struct.fields
    try:
        return {k: json_format.MessageToDict(fields[k]) for k in METADATA_KEYS if k in fields}
    except (ValueError, TypeError) as exc:
        raise NodeIdError(f"node metadata cannot be read: {exc}") from None


def ads_handlers(sotw: Callable[..., Any], delta: Callable[..., Any]) -> grpc.GenericRpcHandler[Any, Any]:
    """The ADS service's two streaming methods, taking requests as protobuf and sending
    responses as bytes already encoded (`encode.py`)."""
    identity: Callable[[bytes], bytes] = bytes
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                sotw,
                request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                response_serializer=identity,
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                delta,
                request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
                response_serializer=identity,
            ),
        },
    )
