"""The ADS servicer: gRPC streams in, pre-serialized responses out (grpc.aio, one task per stream).

It knows nothing of Istio kinds, nor of snapshots: each stream is a `Connection` (sans-IO
state); this module only reads requests, asks its `ConfigSource` (the shared `ResourceCache`)
to resolve the node in the state last published (bound proxy and resources), and writes what
`Connection.pushes()` says, encoded from shared bytes (`encode`). The published state is opaque
here: it goes from `publish` to the source untouched. A new snapshot is resolved for every
stream; only a stream offered sets other than those it holds is woken (`Connection.update`),
and it then decides alone what to send, so a change outside a proxy's scope sends it nothing.

A stream is served only within the bounds of `limits`: streams, node ids and names per client
(its TLS client certificate, else its peer address) and names in total; past one it ends with
RESOURCE_EXHAUSTED. An attested node whose binding a new snapshot changes (`BindingError`: its
workload deleted, another at its IP, another service account) has its stream ended with
PERMISSION_DENIED, never re-bound; Envoy reconnects and is checked again.

Binding and generation run on one worker thread, never on the event loop. Generating a large
proxy's config takes a good fraction of a second; on the loop, a fleet connecting at once would
keep it busy for minutes, during which gRPC accepts no new call (and cancels those it has held
unaccepted for 30 s, or past its pending-call bounds: `server.app` raises both), and no ACK or
push of an already served proxy moves. One thread keeps the work in order (a stream's first
binding before the snapshots published after it) and the loop free; each stream applies only
results newer than the ones it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from cryptography import x509
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import json_format

from meshctl.errors import BindingError, NodeIdError, SubscriptionLimitError
from meshctl.logs import untrusted
from meshctl.server.collector import QuietFreezer
from meshctl.server.connection import Connection
from meshctl.server.encode import BlockCache, encode_delta, encode_sotw
from meshctl.server.limits import ClientLedger, StreamLimits, release_free_memory
from meshctl.server.node_address import with_peer_address
from meshctl.server.pacing import TokenBucket
from meshctl.server.proxy_resources import ProxyResources, Resolved
from meshctl.server.subscription import Push, RequestKind
from meshctl.server.subscription_common import SharedNonces
from meshctl.server.write_budget import WriteBudget
from meshctl.snapshot.node import METADATA_KEYS, ProxyNode, parse_node_id
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types

logger = logging.getLogger("meshctl.server.ads")

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
#: The UNAVAILABLE message of a stream refused by `--max-new-streams-per-second`.
TOO_MANY_NEW_STREAMS = "too many new streams on this replica; retry"

#: Unsupported type URLs logged per stream; a client asking for more is not worth more lines.
_UNSUPPORTED_LOGGED = 8
#: How long a refused stream waits for its first request before the refusal is sent anyway.
_FIRST_REQUEST_WAIT = 1.0
#: Seconds of resolving per trip of a publication to the worker thread (`AdsServicer.publish`).
_PUBLISH_BUDGET = 0.01


#: A status to end a stream with, and its message.
Ending = tuple[grpc.StatusCode, str]


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
    #: Who holds the stream, for its bounds (`limits`): a certificate's digest or a peer address.
    client: str = ""
    certified: bool = False
    #: When its TLS client certificate expires (Unix seconds); 0 without one.
    certificate_not_after: float = 0.0
    #: Counted in the ledger (and in the servicer's node ids) once admitted.
    counted: bool = False
    #: Set to end the stream with this status (its binding changed): the serving task does.
    ending: Ending | None = None
    #: While the serving task writes: the reader ending then cancels the write.
    writing: bool = False
    #: Type URLs a response of which was written: later ones are changes (`write_budget`).
    written_types: set[str] = field(default_factory=set)


class PushObserver:
    """What the servicer reports as it works; the metrics implement it (no-ops by default)."""

    def pushed(self, stream: Stream, push: Push, size: int) -> None:
        """`push` is about to be written to `stream` (before the write, so before any reply)."""

    def rejected(self, stream: Stream, type_url: str, error: str) -> None: ...

    def acked(self, stream: Stream, type_url: str) -> None: ...

    def disconnected(self, stream: Stream) -> None: ...

    def connected(self, count: int) -> None: ...

    def converged(self, stream: Stream, seconds: float) -> None: ...

    def certificate_seen(self, stream: Stream) -> None: ...


#: Decides whether a stream may ask for a node's config: the node as attested (`ProxyNode.attested`,
#: with what its certificate proved) to allow, else why not (the stream is then refused with
#: PERMISSION_DENIED and the reason is logged).
Authorizer = Callable[[ProxyNode, "grpc.aio.ServicerContext[Any, Any]"], ProxyNode | str]


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
        limits: StreamLimits | None = None,
        left: Callable[[str], None] | None = None,
        write_budget: WriteBudget | None = None,
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
        self.ledger = ClientLedger(limits)
        #: Called with a node id once its last stream ended (its workload certificate can go).
        self._left = left
        #: node id -> its streams open
        self._nodes: Counter[str] = Counter()
        self._trim: asyncio.TimerHandle | None = None
        self._blocks = BlockCache()
        #: one nonce per SotW response sent to several streams, so its bytes are made once
        self._nonces = SharedNonces()
        #: Response bytes in gRPC's hands at once (`meshctl.server.write_budget`); None: unbounded.
        self.write_budget = write_budget
        #: Told of every publication, connect and write, to freeze the collector's objects once
        #: quiet (`collector.QuietFreezer`); set by the server that owns the process's collector.
        self.quiet_freezer: QuietFreezer | None = None

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
        client, certified = client_of(context)
        connection = Connection(
            conn_id,
            delta=delta,
            max_names=self.ledger.limits.max_names_per_stream or sys.maxsize,  # 0: no limit
            ledger=self.ledger,
            client=client,
            shared_nonces=self._nonces,
        )
        stream = Stream(connection, client=client, certified=certified, certificate_not_after=certificate_end(context))
        reader = asyncio.create_task(self._read(stream, requests, context))
        serving = asyncio.current_task()

        def reader_ended(_: object) -> None:
            # The reader ending wakes the stream too: one event to wait on, no task per wake-up.
            stream.wake.set()
            # A client that stops reading blocks the writes for good: the reader ending (the
            # stream aborted for abuse, or the client gone) must still end the stream.
            if stream.writing and serving is not None:
                serving.cancel()

        reader.add_done_callback(reader_ended)
        try:
            while True:
                await stream.wake.wait()
                if reader.done():
                    reader.result()  # raises what ended the reader (an abort), else the client left
                    return
                stream.wake.clear()
                if stream.ending is not None:
                    await context.abort(*stream.ending)
                # Decided here, so a wake-up with nothing to send costs no task: only writes need
                # watching. (A plain ACK, after which there is nothing new, wakes nothing.)
                pushes = stream.connection.pushes()
                if not pushes:
                    stream.change_seen = None
                    continue
                # Written here, not by a task of its own (a task and a wait per push cost more
                # than the write of a small one): `reader_ended` cancels a write in progress.
                stream.writing = True
                try:
                    await self._flush(stream, pushes, context)
                except asyncio.CancelledError:
                    if not reader.done() or serving is None:
                        raise  # the call itself was cancelled: the client left
                    serving.uncancel()
                    reader.result()
                    return
                finally:
                    stream.writing = False
        finally:
            # The client leaving cancels this coroutine, not the reader: it is cancelled here.
            reader.cancel()
            reader.add_done_callback(_consume)
            self._release(stream)
            if self.streams.pop(conn_id, None) is not None:
                self._observer.connected(len(self.streams))
                self._observer.disconnected(stream)
                logger.info("proxy %s disconnected", stream.label or conn_id)

    def _release(self, stream: Stream) -> None:
        """What an ending stream held goes back: its names, its place in its client's bounds,
        and (its node's last stream) what the source keeps for the node."""
        stream.connection.close()
        if not stream.counted or stream.node is None:
            return
        stream.counted = False
        node_id = stream.node.id
        self.ledger.close(stream.client, node_id)
        self._nodes[node_id] -= 1
        if self._nodes[node_id] <= 0:
            del self._nodes[node_id]
            if self._left is not None:
                self._left(node_id)

    async def _read(
        self, stream: Stream, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Apply the stream's requests until it ends or one of them ends it. The abort is raised
        here, where no request is in reach: gRPC keeps the abort's exception while it finishes
        the call, and with it everything its traceback reaches (a request of 100,000 names is
        tens of MB parsed)."""
        ending = await self._apply_requests(stream, requests, context)
        if ending is None:
            return
        # gRPC's request iterator is an async generator holding the last request it yielded,
        # and lives as long as the call: closed, it lets go of it.
        aclose = getattr(requests.__aiter__(), "aclose", None)
        del requests
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if ending[0] is grpc.StatusCode.RESOURCE_EXHAUSTED:
            self._trim_soon()
        await context.abort(*ending)

    def _trim_soon(self) -> None:
        """Release the free memory a refused stream's requests took, a second after (once for a
        burst of refusals): see `limits.release_free_memory`."""
        if self._trim is None:
            self._trim = asyncio.get_running_loop().call_later(1.0, self._release_free_memory)

    def _release_free_memory(self) -> None:
        self._trim = None
        release_free_memory()

    async def _apply_requests(
        self, stream: Stream, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> Ending | None:
        """The requests of a stream applied to its connection; the status to end it with, if any."""
        conn = stream.connection
        async for request in requests:
            if stream.node is None:
                refusal = await self._admit(stream, request, context)
                if refusal is not None:
                    return refusal
            type_url = request.type_url
            if type_url not in types.SHORT_NAMES:
                if len(stream.unsupported) < _UNSUPPORTED_LOGGED and type_url not in stream.unsupported:
                    stream.unsupported.add(type_url)
                    logger.warning("proxy %s asked for unsupported type %s", stream.label, untrusted(type_url))
                continue
            try:
                outcome = conn.handle(type_url, request)
            except SubscriptionLimitError as exc:
                logger.warning(
                    "ended the stream of proxy %s: %s", stream.label, str(exc)
                )  # not the exception: a kept record would keep its request
                return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
            if outcome.kind is RequestKind.NACK and not outcome.repeated:
                short = types.SHORT_NAMES[type_url]
                logger.warning("proxy %s rejected %s: %s", stream.label, short, untrusted(outcome.error, 2000))
                self._observer.rejected(stream, type_url, outcome.error)
            elif outcome.kind is RequestKind.ACK:
                self._observer.acked(stream, type_url)
            if conn.push_due:
                stream.wake.set()
        return None

    async def _admit(self, stream: Stream, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Ending | None:
        """The first request: parse and authorize its node, then bind it and generate its config;
        the status to end the stream with when it may not be served."""
        if not request.HasField("node") or not request.node.id:
            return grpc.StatusCode.INVALID_ARGUMENT, "the first request must carry node.id"
        try:
            node = parse_node_id(request.node.id, _metadata(request.node.metadata), _envoy_version(request.node))
        except NodeIdError as exc:
            logger.warning("refused a stream from %s: %s", context.peer(), str(exc))
            return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        stream.label = untrusted(node.id)
        if self.quiet_freezer is not None:
            self.quiet_freezer.busy()
        addressed = with_peer_address(node, context.peer())  # a registering VM that gave no IP
        if isinstance(addressed, str):
            logger.warning("refused node %s: %s", stream.label, addressed)
            return grpc.StatusCode.INVALID_ARGUMENT, addressed
        node = addressed
        if self._authorize is not None:
            attested = self._authorize(node, context)
            if isinstance(attested, str):
                logger.warning("refused node %s from %s: %s", stream.label, context.peer(), attested)
                return grpc.StatusCode.PERMISSION_DENIED, attested
            node = attested
        over = self.ledger.open(stream.client, node.id, certified=stream.certified)
        if over is not None:
            logger.warning("refused node %s from %s: %s", stream.label, context.peer(), over)
            return grpc.StatusCode.RESOURCE_EXHAUSTED, over
        conn = stream.connection
        stream.node = node
        stream.counted = True
        self._nodes[node.id] += 1
        conn.node_id = node.id
        self.streams[conn.id] = stream
        self._observer.connected(len(self.streams))
        self._observer.certificate_seen(stream)
        logger.info("proxy %s connected (%s)", stream.label, "delta" if conn.delta else "sotw")
        try:
            await self._bind(stream, self._snapshot())
        except BindingError as exc:
            logger.warning("ended the stream of proxy %s: %s", stream.label, str(exc))
            return grpc.StatusCode.PERMISSION_DENIED, str(exc)
        except Exception:
            logger.exception("generating config for %s failed", stream.label)
            return grpc.StatusCode.INTERNAL, "config generation failed; see the server log"
        return None

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
        self, streams: Sequence[Stream], start: int, snapshot: object, budget: float
    ) -> list[tuple[Proxy, ProxyResources] | BaseException]:
        """On the worker thread: `streams` from `start` resolved in `snapshot`, as many as
        `budget` seconds allow (one at least), each result or what it raised."""
        out: list[tuple[Proxy, ProxyResources] | BaseException] = []
        deadline = time.monotonic() + budget
        for stream in itertools.islice(streams, start, None):
            try:
                assert stream.node is not None  # only admitted streams are in self.streams
                out.append(self._resolve(stream.node, snapshot))
            except Exception as exc:
                out.append(exc)
            if time.monotonic() >= deadline:
                break
        return out

    def _apply(self, stream: Stream, epoch: int, proxy: Proxy, resources: ProxyResources) -> bool:
        """On the loop: take the result for publication `epoch`, unless a newer one was taken.
        True when the stream has something new to push (`Connection.update`)."""
        if stream.epoch > epoch:
            return False
        stream.epoch = epoch
        stream.proxy = proxy
        return stream.connection.update(resources)

    async def _flush(self, stream: Stream, pushes: Sequence[Push], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        conn = stream.connection
        budget = self.write_budget
        for push in pushes:
            # Room is taken before encoding (the encoded bytes are what the budget bounds): the
            # resources, plus a little for the envelope.
            first = push.type_url not in stream.written_types
            size = self._blocks.size(push.resources) + 256
            hold = await budget.take(size, first=first) if budget is not None else None
            try:
                encode = encode_delta if conn.delta else encode_sotw
                data = encode(push, blocks=self._blocks)
                # Said before the write: the stream's reader can take Envoy's ACK of it (on this
                # loop) before the write returns, and an ACK of a push not yet recorded as sent
                # would be lost to the history and the rollout.
                self._observer.pushed(stream, push, len(data))
                await context.write(data)
                stream.written_types.add(push.type_url)
                if self.quiet_freezer is not None:
                    self.quiet_freezer.busy()
            finally:
                if budget is not None and hold is not None:
                    budget.give_back(hold)
        if stream.change_seen is not None:
            self._observer.converged(stream, time.monotonic() - stream.change_seen)
        stream.change_seen = None

    # -- snapshots ---------------------------------------------------------------------------

    async def publish(
        self,
        snapshot: object,
        seen: float | None = None,
        *,
        budget: float = _PUBLISH_BUDGET,
        nodes: Collection[str] | None = None,
    ) -> None:
        """Give every stream (or those of `nodes` only: a state that changed for them alone, as a
        renewed certificate) the new snapshot, resolved on the worker thread `budget` seconds of
        streams per trip: a change that generates nothing (an endpoint moved) resolves a
        thousand streams in a few trips, not one per handful of them, and the streams of each
        trip are woken as it returns."""
        seen = seen or time.monotonic()
        if self.quiet_freezer is not None:
            self.quiet_freezer.busy()
        self._epoch += 1
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        streams = [s for s in self.streams.values() if nodes is None or (s.node is not None and s.node.id in nodes)]
        start = 0
        while start < len(streams):
            results = await loop.run_in_executor(self._worker, self._resolve_many, streams, start, snapshot, budget)
            chunk = streams[start : start + len(results)]
            start += len(results)
            for stream, result in zip(chunk, results, strict=True):
                if isinstance(result, BindingError):
                    if stream.ending is None:
                        logger.warning("ended the stream of proxy %s: %s", stream.label, str(result))
                        stream.ending = (grpc.StatusCode.PERMISSION_DENIED, str(result))
                        stream.wake.set()
                    continue
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


def _consume(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def client_of(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str, bool]:
    """Who holds a stream, for its bounds: the digest of its TLS client certificate (and True),
    else its peer address without the port (and False): what a client cannot change by opening
    another stream."""
    pem = b"".join(context.auth_context().get("x509_pem_cert", ()))
    if pem:
        return f"certificate sha256:{hashlib.sha256(pem).hexdigest()[:16]}", True
    peer = context.peer()
    return peer.rpartition(":")[0] or peer, False


def certificate_end(context: grpc.aio.ServicerContext[Any, Any]) -> float:
    """When the stream's verified client certificate expires (Unix seconds), 0 without one: a VM
    whose renewal fails shows here, and in `proxy-status`, before its certificate ends."""
    pem = b"".join(context.auth_context().get("x509_pem_cert", ()))
    if not pem:
        return 0.0
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    except ValueError:
        return 0.0


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


def _envoy_version(node: Any) -> str:
    """The Envoy version a node reports (`1.40.0`), "" when it reports none."""
    if node.HasField("user_agent_build_version") and node.user_agent_build_version.HasField("version"):
        v = node.user_agent_build_version.version
        return f"{v.major_number}.{v.minor_number}.{v.patch}"
    return ""


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
