"""What the cache serves a proxyless gRPC node (`ProxyNode.proxyless`), from the parts it
already shares: the outbound generation of the node's `OutboundProxy` (reshaped by
`xds.grpc_gen`) and the shared assignments (each reshaped once, while the Envoy one lives).

A gRPC node asks for listeners, clusters and assignments by name, never the wildcard, so the
view offers every name its services can be dialed by and the subscription sends only those
asked for: a change that touches none of a node's names sends it nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.proxy import OutboundProxy
from meshctl.xds import types
from meshctl.xds.generate import GenerationMemos, generate_outbound
from meshctl.xds.grpc_gen import build_grpc_config, grpc_assignment
from meshctl.xds.grpc_inbound import build_grpc_inbound
from meshctl.xds.inbound_view import InboundView
from meshctl.xds.resources import Resource, to_resource


def grpc_config(
    snapshot: Snapshot, proxy: OutboundProxy, memos: GenerationMemos | None = None
) -> dict[str, tuple[Message, ...]]:
    """A gRPC node's listeners, routes and clusters: the sidecar's outbound config, reshaped."""
    return build_grpc_config(generate_outbound(snapshot, proxy, memos))


def grpc_inbound_listeners(view: InboundView) -> list[Resource]:
    """A gRPC server's listeners (`grpc_inbound`) from its inbound view: the cache keeps them by
    the view, as an Envoy's inbound part."""
    return [to_resource(m, types.LISTENER) for m in build_grpc_inbound(view)]


class GrpcAssignments:
    """Envoy assignments as gRPC takes them (`grpc_assignment`), made once per Envoy resource
    and forgotten with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: weakref.WeakKeyDictionary[Resource, Resource] = weakref.WeakKeyDictionary()

    def of(self, envoy: Iterable[Resource]) -> list[Resource]:
        out = []
        for resource in envoy:
            with self._lock:
                found = self._made.get(resource)
            if found is None:
                found = to_resource(grpc_assignment(_assignment(resource)), types.ENDPOINT)
                with self._lock:
                    self._made[resource] = found
            out.append(found)
        return out


def _assignment(resource: Resource) -> endpoint_pb2.ClusterLoadAssignment:
    wrapped = any_pb2.Any.FromString(resource.body)
    return endpoint_pb2.ClusterLoadAssignment.FromString(wrapped.value)
