"""What the clients of the xDS port may make the server hold, per client and in total; no I/O.

A stream is bounded on its own (`subscription`: names per type); these bounds are across streams,
because a client that opens eight streams each just under the per-stream bound holds eight times
as much, and a server that takes it has nothing left for the others. A client is its TLS client
certificate (with `--client-ca`), else its peer address: what a proxy cannot change by opening
another stream.

- streams per client (`max_streams_per_client`);
- distinct node ids per client certificate (`max_nodes_per_client`): one certificate proves one
  workload, and a VM runs one Envoy (or a few, while one restarts);
- names subscribed per client, summed over its streams and types, initial resource versions
  included (`max_names_per_client`);
- names subscribed by every stream together (`max_names_total`).

A stream over one of them is refused, or ended, with RESOURCE_EXHAUSTED and a message naming the
bound (`SubscriptionLimitError`, `ClientLedger.open`); the streams within them are untouched. 0
turns a bound off. The defaults are many times what a real proxy needs: a sidecar that sees
every service of a 10,000-service mesh watches about as many assignments.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections import Counter
from dataclasses import dataclass, field

from meshctl.errors import SubscriptionLimitError
from meshctl.server.subscription import MAX_NAMES

logger = logging.getLogger("meshctl.server.limits")

#: glibc's `mallopt` parameter for the size from which allocations are mapped on their own.
_M_MMAP_THRESHOLD = -3
#: Allocations from this size on are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 256 * 1024


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """The bounds of this module (0: none); `meshctl serve --max-*` flags set them."""

    #: names of one type one stream may subscribe to
    max_names_per_stream: int = MAX_NAMES
    #: names one client may have subscribed, over all its streams and types
    max_names_per_client: int = 100_000
    #: names every stream together may have subscribed: 2,000 sidecars scoped to a tenth of a
    #: 10,000-service mesh watch about 5.6 million (a bound of 5 million refused a tenth of them);
    #: this leaves four times that, at about a hundred bytes a name held
    max_names_total: int = 25_000_000
    #: streams one client may have open
    max_streams_per_client: int = 100
    #: distinct node ids the streams of one client certificate may name
    max_nodes_per_client: int = 100


@dataclass(slots=True)
class _Client:
    streams: int = 0
    names: int = 0
    nodes: Counter[str] = field(default_factory=Counter)


class ClientLedger:
    """What every client holds: its streams, node ids and names (see the module docstring).

    The servicer opens a stream before serving it and closes it when it ends; each stream's
    `Connection` charges its names before a request is applied (`charge`), so a request over a
    bound changes nothing.
    """

    def __init__(self, limits: StreamLimits | None = None) -> None:
        self.limits = limits or StreamLimits()
        self._clients: dict[str, _Client] = {}
        #: names subscribed by every stream
        self.names = 0

    def open(self, client: str, node_id: str, *, certified: bool) -> str | None:
        """Count a new stream of `client` naming `node_id`; None when it may be served, else why
        not (nothing is counted then). Node ids are bounded per certificate only (`certified`):
        behind one address may be a whole fleet."""
        limits = self.limits
        held = self._clients.get(client) or _Client()
        if limits.max_streams_per_client and held.streams >= limits.max_streams_per_client:
            return (
                f"client {client} already has {held.streams} streams open, the most one client may have "
                "(--max-streams-per-client)"
            )
        if (
            certified
            and limits.max_nodes_per_client
            and node_id not in held.nodes
            and len(held.nodes) >= limits.max_nodes_per_client
        ):
            return (
                f"client {client} already names {len(held.nodes)} node ids, the most one client certificate "
                "may name (--max-nodes-per-client)"
            )
        held.streams += 1
        held.nodes[node_id] += 1
        self._clients[client] = held
        return None

    def close(self, client: str, node_id: str) -> None:
        """A stream of `client` ended (its `Connection.close` gave its names back)."""
        held = self._clients.get(client)
        if held is None:
            return
        held.streams -= 1
        held.nodes[node_id] -= 1
        if held.nodes[node_id] <= 0:
            del held.nodes[node_id]
        if held.streams <= 0:
            self.names -= held.names  # none, once every stream gave its names back
            del self._clients[client]

    def charge(self, client: str, delta: int, type_url: str) -> None:
        """Add `delta` names (negative: released) to `client`'s; raises SubscriptionLimitError,
        charging nothing, when that passes the client's bound or the total."""
        held = self._clients.get(client)
        if held is None:
            return  # not opened (a stream refused meanwhile): nothing to count against
        if delta > 0:
            per_client, total = self.limits.max_names_per_client, self.limits.max_names_total
            if per_client and held.names + delta > per_client:
                raise SubscriptionLimitError(
                    f"{type_url}: {held.names + delta} names subscribed over the streams of client {client}, "
                    f"more than the {per_client} one client may have (--max-names-per-client)",
                    type_url=type_url,
                    limit=per_client,
                )
            if total and self.names + delta > total:
                raise SubscriptionLimitError(
                    f"{type_url}: the server holds {self.names} names subscribed, and {delta} more would pass "
                    f"the {total} all streams may have (--max-names-total)",
                    type_url=type_url,
                    limit=total,
                )
        held.names += delta
        self.names += delta

    def streams_of(self, client: str) -> int:
        held = self._clients.get(client)
        return held.streams if held is not None else 0


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def release_free_memory() -> None:
    """Give the system back the free pages of every glibc arena (`malloc_trim`): after a stream
    refused for sending too much, what parsing its requests took is free but still counted in
    the server's RSS. A no-op elsewhere."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def return_large_allocations() -> bool:
    """Have glibc map every allocation of `MMAP_THRESHOLD` bytes or more on its own, so it goes
    back to the system when freed; True when it was set (glibc only).

    By default glibc raises that threshold to the largest block freed so far (up to 32 MB): after
    a few large requests were parsed and dropped (a client sending 100,000 names at once, refused),
    the blocks of later ones come from the heap, and the heap does not shrink. The server's RSS
    then keeps what a burst of refused requests took (70 MB for eight streams) although nothing
    holds it. A fixed threshold stops that adjustment. For the process that owns its allocator
    (`meshctl serve`), not a server embedded in another program.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc: its allocator has its own ways
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        logger.debug("mallopt(M_MMAP_THRESHOLD) refused; large allocations follow glibc's defaults")
        return False
    return True
