"""Who is asking: an Envoy's node, as it describes itself, parsed as Istio does.

Envoy sends `node.id` as `TYPE~IP~NAME.NAMESPACE~DOMAIN` (Istio's format: `sidecar~10.10.0.41~
reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local`, `router~...` for a gateway) and may carry
`NAMESPACE`, `LABELS` and `INTERCEPTION_MODE` in `node.metadata`. The node is bound to its
workload afterwards (`snapshot/binding.py`); this module knows nothing of a snapshot.

What a node sends is untrusted and kept small: a node id longer than `MAX_NODE_ID` is refused,
and of the metadata only the keys read here are kept.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from meshctl.errors import NodeIdError
from meshctl.logs import untrusted
from meshctl.snapshot.interception import DNS_METADATA_KEYS, InterceptionMode, dns_settings

#: Istio's node ids are a few hundred characters at most (a Kubernetes name, a namespace, an IP
#: and a domain); a longer one is not a proxy's.
MAX_NODE_ID = 1024
#: Labels a node may claim in its metadata (`LABELS`).
MAX_NODE_LABELS = 256
#: The node metadata keys meshctl reads; the rest is not kept.
METADATA_KEYS = (
    "NAMESPACE",
    "LABELS",
    "INTERCEPTION_MODE",
    "AUTO_REGISTER_GROUP",
    "ISTIO_VERSION",
    "GENERATOR",
    *DNS_METADATA_KEYS,
)
#: `GENERATOR` metadata of a proxyless gRPC client or server (Istio's signal): it gets gRPC's
#: resources (`xds/grpc_gen.py`), not Envoy's.
GRPC_GENERATOR = "grpc"


class ProxyType(enum.StrEnum):
    SIDECAR = "sidecar"
    ROUTER = "router"


@dataclass(frozen=True, slots=True)
class ProxyNode:
    """What the node says about itself, before binding."""

    id: str
    type: ProxyType
    ip: str
    name: str
    namespace: str
    domain: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    interception: InterceptionMode = InterceptionMode.NONE
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: Its identity was proven by a client certificate: bound strictly (`snapshot/binding.py`).
    attested: bool = False
    #: The workload (`Proxy.workload`) and service account its certificate proved, once the server
    #: checked it: an attested node binds to exactly these or not at all (`BindingError`).
    workload: str = ""
    service_account: str = ""
    #: It is sent the mesh's workload certificates over SDS, so its config may use mutual TLS
    #: (ISTIO_MUTUAL, auto mTLS, PeerAuthentication). The server says no for a proxy it may not
    #: send a key to; config that names a secret the proxy never gets would never start.
    mesh_certificates: bool = True
    #: It may be sent the Kubernetes-style secrets a gateway names by `credentialName` (served
    #: from `serve --credentials-dir` to proxies whose connection proved their workload); without
    #: it, servers that name one are left out, as for `mesh_certificates`.
    credentials: bool = True
    #: What an EnvoyFilter's `proxyVersion` regex is matched against: the node's `ISTIO_VERSION`
    #: metadata when it sends one (as in Istio), else the Envoy version it reports ("1.40.0").
    proxy_version: str = ""

    @property
    def proxyless(self) -> bool:
        """A gRPC library, not an Envoy: served by the gRPC generator family."""
        return self.metadata.get("GENERATOR") == GRPC_GENERATOR


def parse_node_id(node_id: str, metadata: Mapping[str, Any] | None = None, envoy_version: str = "") -> ProxyNode:
    """Parse Istio's node id and the metadata keys meshctl reads; raises NodeIdError, whose
    message quotes what the node sent escaped and shortened (`untrusted`)."""
    metadata = {k: metadata[k] for k in METADATA_KEYS if k in metadata} if metadata else {}
    if len(node_id) > MAX_NODE_ID:
        raise NodeIdError(f"node id {untrusted(node_id)} is longer than {MAX_NODE_ID} characters")
    parts = node_id.split("~")
    if len(parts) != 4:
        raise NodeIdError(
            f"node id {untrusted(node_id)} is not TYPE~IP~NAME.NAMESPACE~DOMAIN "
            "(e.g. sidecar~10.0.0.5~reviews-v1.bookinfo~bookinfo.svc.cluster.local)"
        )
    kind, ip, workload, domain = parts
    try:
        proxy_type = ProxyType(kind)
    except ValueError:
        raise NodeIdError(
            f"node id {untrusted(node_id)}: type must be sidecar or router, not {untrusted(kind)}"
        ) from None
    if not ip:
        raise NodeIdError(f"node id {untrusted(node_id)} has no IP")
    name, _, namespace = workload.partition(".")
    namespace = str(metadata.get("NAMESPACE") or namespace or "default")
    raw_labels = metadata.get("LABELS") or {}
    if isinstance(raw_labels, Mapping) and len(raw_labels) > MAX_NODE_LABELS:
        raise NodeIdError(f"node {untrusted(node_id)} claims {len(raw_labels)} LABELS, over {MAX_NODE_LABELS}")
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, Mapping) else {}
    mode_text = str(metadata.get("INTERCEPTION_MODE") or InterceptionMode.NONE.value).upper()
    try:
        mode = InterceptionMode(mode_text)
    except ValueError:
        raise NodeIdError(f"INTERCEPTION_MODE {untrusted(mode_text)} is not NONE, REDIRECT or TPROXY") from None
    try:
        dns_settings(metadata)
    except ValueError as exc:
        raise NodeIdError(f"node {untrusted(node_id)}: {exc}") from None
    return ProxyNode(
        id=node_id,
        type=proxy_type,
        ip=ip,
        name=name,
        namespace=namespace,
        domain=domain,
        labels=MappingProxyType(labels),
        interception=mode,
        metadata=MappingProxyType(metadata),
        proxy_version=str(metadata.get("ISTIO_VERSION") or envoy_version)[:64],
    )
