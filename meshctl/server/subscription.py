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

This module is the one to import from; the parts live in `subscription_sotw`,
`subscription_delta` and what both use, `subscription_common`.
"""

from meshctl.server.subscription_common import (
    MAX_NAMES,
    WILDCARD,
    Nack,
    Push,
    RequestKind,
    RequestOutcome,
)
from meshctl.server.subscription_delta import DeltaSubscription
from meshctl.server.subscription_sotw import SotwSubscription

__all__ = [
    "MAX_NAMES",
    "WILDCARD",
    "DeltaSubscription",
    "Nack",
    "Push",
    "RequestKind",
    "RequestOutcome",
    "SotwSubscription",
]
