"""Where a proxyless gRPC call goes: the walk of `simulator`, started and ended as a gRPC
library's xDS client does it (gRFC A27, A28), on what a gRPC node is sent
(`meshctl.xds.grpc_gen.generate_grpc`).

A gRPC client differs from an Envoy at both ends of the walk:

- the channel's target names its listener: `xds:///HOST:PORT` subscribes to the listener named
  exactly `HOST:PORT`, an API listener (no address, no filter chain) whose connection manager
  names the route config; a name the server does not have fails every call of the channel;
- the virtual host is chosen by that same name as the authority (what was dialed; gRPC sends no
  Host of the application's choosing and rewrites none), and a route matches the call's `:path`,
  `/SERVICE/METHOD`, and its metadata as headers (`content-type: application/grpc`, the method
  POST, never a query string);
- what fails, fails with a status code: no listener, route config, virtual host, route or
  cluster, no healthy endpoint, and a route that does not forward (a redirect, a direct
  response) fail the call UNAVAILABLE; a fault abort's HTTP status becomes the code gRPC maps
  it to (its HTTP-to-status table), a `grpc_status` abort is that code.

The answer is a `Simulation` like Envoy's: its outcome's `flag` holds the gRPC status code and
`status` (an HTTP status) is None; the action's `timeout` is the route's `max_stream_duration`,
the only deadline gRPC takes from a route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from meshctl.errors import UsageError
from meshctl.simulate import http
from meshctl.simulate.request import Request, parse_headers
from meshctl.simulate.result import Outcome, Simulation
from meshctl.simulate.simulator import Target, _http, _Walk
from meshctl.simulate.upstream import SourceLookup
from meshctl.xds import types

SCHEME: Final = "xds:///"
UNAVAILABLE: Final = "UNAVAILABLE"
#: gRPC's mapping of an HTTP status to a call's status (doc/http-grpc-status-mapping.md).
_HTTP_TO_GRPC: Final = MappingProxyType(
    {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
     429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: UNAVAILABLE}
)  # fmt: skip
#: Status codes by number, for a fault's `grpc_status`.
CODES: Final = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class GrpcCall:
    """A call: the channel's target (`HOST:PORT` as dialed) and the request the routes see."""

    target: str
    request: Request


def parse_call(url: str, headers: Sequence[str] = ()) -> GrpcCall:
    """A call from `xds:///HOST[:PORT]/SERVICE/METHOD` and `-H NAME:VALUE` metadata. Raises
    UsageError for what gRPC could not dial or call."""
    if not url.startswith(SCHEME):
        raise UsageError(
            f"{url!r}: a gRPC call is xds:///HOST:PORT/SERVICE/METHOD (e.g. xds:///echo.shop.mesh:7070/pkg.Echo/Say)"
        )
    target, _, method = url[len(SCHEME) :].partition("/")
    service, slash, name = method.partition("/")
    if not target or not service or not slash or not name or "/" in name:
        raise UsageError(f"{url!r}: give the target and the method, xds:///HOST:PORT/SERVICE/METHOD")
    host, sep, port = target.rpartition(":")
    if sep and not (port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"{url!r}: {port!r} is not a port")
    metadata = parse_headers(headers)
    for reserved in ("host", ":authority", ":path", "content-type"):
        if reserved in metadata:
            raise UsageError(f"-H {reserved}: gRPC sets it itself; give the call's metadata only")
    # gRPC sends the target as the authority, with its port as dialed (none if none).
    metadata.update({"host": target, "content-type": "application/grpc", "te": "trailers"})
    request = Request(
        method="POST",
        scheme="http",
        host=(host if sep else target).strip("[]"),
        port=int(port) if sep else 80,
        path=f"/{service}/{name}",
        headers=MappingProxyType(metadata),
    )
    return GrpcCall(target, request)


def simulate_grpc(
    resources: Mapping[str, Sequence[Any]], call: GrpcCall, target: Target, lookup: SourceLookup | None = None
) -> Simulation:
    """Where `call`, made by the gRPC node `resources` were generated for, goes."""
    walk = _Walk(call.request, target)
    listener = next((ln for ln in resources.get(types.LISTENER, ()) if ln.name == call.target), None)
    if listener is None or not listener.HasField("api_listener"):
        return _as_called(
            _failed(
                walk.end(None, "", "", False),
                f"the node is sent no listener named {call.target}: every call of the channel fails "
                f"(gRPC: LDS resource {call.target} does not exist)",
            ),
            call,
        )
    walk.fields["listener"] = listener.name
    walk.fields["filter_chain"] = "(API listener)"
    hcm = hcm_pb2.HttpConnectionManager()
    listener.api_listener.api_listener.Unpack(hcm)
    result = _http(walk, hcm, resources, lookup)
    return _as_called(_in_grpc_terms(result, resources, call.request), call)


def _as_called(result: Simulation, call: GrpcCall) -> Simulation:
    """The request shown as the call was given: its target and method, not an HTTP URL."""
    shown = {**result.request, "url": f"{SCHEME}{call.target}{call.request.path}", "method": "gRPC"}
    return dataclasses.replace(result, request=shown)


def _in_grpc_terms(result: Simulation, resources: Mapping[str, Sequence[Any]], request: Request) -> Simulation:
    outcome = result.outcome
    action = dict(result.action) if result.action is not None else None
    if action is not None and action.get("kind") == "route":
        action["timeout"] = _stream_duration(result, resources, request)
        result = dataclasses.replace(result, action=action)
    abort = ((action or {}).get("fault") or {}).get("abort") or {}
    if "grpc_status" in abort and abort.get("percent", 0) >= 100:
        code = _code(abort["grpc_status"])
        return dataclasses.replace(
            result, outcome=Outcome(None, code, f"the fault filter aborts every call with {code}", True)
        )
    if outcome.flag == "FI" and outcome.status is not None:
        code = _HTTP_TO_GRPC.get(outcome.status, "UNKNOWN")
        return dataclasses.replace(
            result,
            outcome=Outcome(None, code, f"the fault filter aborts every call with HTTP {outcome.status}: {code}", True),
        )
    if action is not None and action.get("kind") in ("redirect", "direct_response", "non_forwarding_action"):
        return _failed(result, f"route action {action['kind']} does not forward: gRPC fails calls that match it")
    if not outcome.routed or outcome.status is not None:
        return _failed(result, outcome.reason)
    return result


def _failed(result: Simulation, reason: str) -> Simulation:
    return dataclasses.replace(result, outcome=Outcome(None, UNAVAILABLE, reason, False))


def _stream_duration(result: Simulation, resources: Mapping[str, Sequence[Any]], request: Request) -> str:
    """The chosen route's `max_stream_duration` ("none": gRPC has no default deadline)."""
    config = next((r for r in resources.get(types.ROUTE, ()) if r.name == result.route_config), None)
    vhost = http.choose_virtual_host(config, request.authority) if config is not None else None
    route = http.choose_route(vhost, request) if vhost is not None else None
    if route is None or not route.route.max_stream_duration.HasField("max_stream_duration"):
        return "none"
    duration = route.route.max_stream_duration.max_stream_duration
    return f"{duration.seconds + duration.nanos / 1e9:g}s"


def _code(value: Any) -> str:
    number = int(value)
    return CODES[number] if 0 <= number < len(CODES) else str(number)


__all__ = ["CODES", "GrpcCall", "parse_call", "simulate_grpc"]
