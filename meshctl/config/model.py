"""Plain data for loaded Istio config: what a resource is, where it came from, and its typed spec.

A `Config` is the unit the store keeps and the snapshot reads. It is built once by the loader and
never mutated afterwards (the protobuf spec is treated as frozen by convention), so it can be
shared by every snapshot and every proxy's generation without copying.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from google.protobuf.message import Message

NETWORKING_GROUP: Final = "networking.istio.io"
#: The group whose kinds decide who may call whom (every one of them enforced).
SECURITY_GROUP: Final = "security.istio.io"
#: The group of Telemetry (access logging; tracing and metrics are refused or warned of).
TELEMETRY_GROUP: Final = "telemetry.istio.io"
#: The group of WasmPlugin (local modules only: meshctl downloads no code).
EXTENSIONS_GROUP: Final = "extensions.istio.io"
#: The Kubernetes Gateway API's group: its kinds are translated into Istio's (`config/gateway_api`).
GATEWAY_API_GROUP: Final = "gateway.networking.k8s.io"
#: The versions accepted of each group with kinds meshctl loads, exactly as users write them for
#: Kubernetes. All versions of a group share one schema, as in Istio (where networking's v1beta1
#: and v1 re-export its v1alpha3 messages, and security's v1 its v1beta1 ones).
GROUP_VERSIONS: Final[Mapping[str, tuple[str, ...]]] = {
    NETWORKING_GROUP: ("v1alpha3", "v1beta1", "v1"),
    SECURITY_GROUP: ("v1beta1", "v1"),
    TELEMETRY_GROUP: ("v1alpha1", "v1"),
    EXTENSIONS_GROUP: ("v1alpha1",),
    GATEWAY_API_GROUP: ("v1alpha2", "v1alpha3", "v1beta1", "v1"),
}

#: Kind -> (generated module under meshctl.api, message name) of its `spec`, for every kind with
#: a schema (the kinds meshctl loads).
_SCHEMAS: Final[Mapping[str, tuple[str, str]]] = {
    "VirtualService": ("networking.v1alpha3.virtual_service_pb2", "VirtualService"),
    "DestinationRule": ("networking.v1alpha3.destination_rule_pb2", "DestinationRule"),
    "Gateway": ("networking.v1alpha3.gateway_pb2", "Gateway"),
    "ServiceEntry": ("networking.v1alpha3.service_entry_pb2", "ServiceEntry"),
    "WorkloadEntry": ("networking.v1alpha3.workload_entry_pb2", "WorkloadEntry"),
    "WorkloadGroup": ("networking.v1alpha3.workload_group_pb2", "WorkloadGroup"),
    "Sidecar": ("networking.v1alpha3.sidecar_pb2", "Sidecar"),
    "EnvoyFilter": ("networking.v1alpha3.envoy_filter_pb2", "EnvoyFilter"),
    "PeerAuthentication": ("security.v1beta1.peer_authentication_pb2", "PeerAuthentication"),
    "AuthorizationPolicy": ("security.v1beta1.authorization_policy_pb2", "AuthorizationPolicy"),
    "RequestAuthentication": ("security.v1beta1.request_authentication_pb2", "RequestAuthentication"),
    "Telemetry": ("telemetry.v1alpha1.telemetry_pb2", "Telemetry"),
    "WasmPlugin": ("extensions.v1alpha1.wasm_pb2", "WasmPlugin"),
    # The Gateway API has no protobuf schema: specs are kept as Structs, read by `gateway_api.model`.
    **dict.fromkeys(
        ("KubernetesGateway", "GatewayClass", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute", "ReferenceGrant"),
        ("google.protobuf.struct_pb2", "Struct"),
    ),
}

#: Kind -> API group of the kinds meshctl loads (serves). A security kind is here only once
#: meshctl enforces it: loading a policy that does nothing would let through what it denies.
_SERVED: Final[Mapping[str, str]] = {
    "VirtualService": NETWORKING_GROUP,
    "DestinationRule": NETWORKING_GROUP,
    "Gateway": NETWORKING_GROUP,
    "ServiceEntry": NETWORKING_GROUP,
    "WorkloadEntry": NETWORKING_GROUP,
    "WorkloadGroup": NETWORKING_GROUP,
    "Sidecar": NETWORKING_GROUP,
    "EnvoyFilter": NETWORKING_GROUP,
    "PeerAuthentication": SECURITY_GROUP,
    "AuthorizationPolicy": SECURITY_GROUP,
    "RequestAuthentication": SECURITY_GROUP,
    "Telemetry": TELEMETRY_GROUP,
    "WasmPlugin": EXTENSIONS_GROUP,
    **dict.fromkeys(("KubernetesGateway", "GatewayClass", "HTTPRoute", "GRPCRoute"), GATEWAY_API_GROUP),
    **dict.fromkeys(("TCPRoute", "TLSRoute", "ReferenceGrant"), GATEWAY_API_GROUP),
}

#: Gateway API kinds as written -> as keyed: Istio's networking group has a `Gateway` too, so the
#: Gateway API's is keyed `KubernetesGateway`, as in Istio's own registry.
GATEWAY_API_KINDS: Final[Mapping[str, str]] = {"Gateway": "KubernetesGateway"}

KINDS: Final = tuple(_SERVED)

#: Why each kind of Istio's own API groups that meshctl does not serve is refused: with the
#: served kinds above, every kind of Istio's API (istio/api's custom resources) is in one of the
#: two, so none is ever skipped in silence. `meshctl validate` reports a refused kind as an error
#: (config that would silently do nothing must fail CI); `serve`, `dump` and `diff` warn and serve
#: the rest of the file (the loader's `LoadOptions.refuse_unserved`).
REFUSED: Final[Mapping[str, tuple[str, str]]] = {
    "ProxyConfig": (
        NETWORKING_GROUP,
        "Istio's agent reads it to start Envoy, and meshctl serves no bootstrap; "
        "`meshctl bootstrap --config` applies it to the bootstrap it writes",
    ),
    "BackendTLSPolicy": (GATEWAY_API_GROUP, "TLS origination to a backend is set by a DestinationRule in meshctl"),
    "BackendLBPolicy": (GATEWAY_API_GROUP, "load balancing is set by a DestinationRule in meshctl"),
    "UDPRoute": (GATEWAY_API_GROUP, "Envoy gateways generated by meshctl proxy no UDP"),
    "ListenerSet": (GATEWAY_API_GROUP, "listeners are served from the Gateway's own spec only"),
}

#: Why a WasmPlugin whose `url` names a module to fetch is refused (file:// modules are served).
WASM_DOWNLOAD_REFUSED: Final = "meshctl does not download code: copy the module to the VM and give a file:// url"


#: Every kind of Istio's own API groups, served or not: a kind of these groups that is in none of
#: them is a typo (`VirtualSevice`) that Kubernetes would refuse too, not someone else's config.
ISTIO_KINDS: Final[Mapping[str, frozenset[str]]] = {
    group: frozenset({k for k, g in _SERVED.items() if g == group} | {k for k, (g, _) in REFUSED.items() if g == group})
    for group in (NETWORKING_GROUP, SECURITY_GROUP, TELEMETRY_GROUP, EXTENSIONS_GROUP, GATEWAY_API_GROUP)
}

#: API groups of kinds that are no Istio config but are often found beside it, and what is said of them.
NOT_SERVED_YET: Final[Mapping[str, str]] = {
    "gateway.networking.x-k8s.io": "the Gateway API's experimental kinds are not served",
}


def served_group(kind: str) -> str | None:
    """The API group of a kind meshctl loads, None for any other kind."""
    return _SERVED.get(kind)


def spec_class(kind: str) -> type[Message]:
    """The protobuf message class for a kind's `spec`, imported on first use."""
    module_name, message = _SCHEMAS[kind]
    module = importlib.import_module(module_name if module_name.startswith("google.") else f"meshctl.api.{module_name}")
    cls: type[Message] = getattr(module, message)
    return cls


#: `spec_class` imports on every call; packed specs ask on every read.
_spec_class = cache(spec_class)


def is_istio_kind(api_version: str, kind: str) -> bool:
    """True for the `apiVersion`/`kind` pairs meshctl loads; anything else is skipped."""
    group, _, version = api_version.partition("/")
    return group == _SERVED.get(kind) and version in GROUP_VERSIONS[group]


class ConfigKey(NamedTuple):
    """Identity of a resource in the store: two resources with the same key cannot coexist.

    A named tuple rather than a dataclass: keys are hashed and compared hundreds of thousands
    of times per reload of a large tree, and a tuple does both in C."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Source:
    """Where a resource was read: the file, the 1-based line and column of its document, and
    the 0-based index of that document in the file (to find field positions again on demand)."""

    file: str
    line: int = 1
    column: int = 1
    document: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


#: The one empty mapping shared by every Config without labels (or annotations): most have none.
_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})


def _frozen(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    """A read-only copy with its keys and values interned: a mesh repeats the same few label
    keys and values in thousands of resources, and each read from YAML is a string of its own."""
    if not mapping:
        return _EMPTY
    return MappingProxyType({_intern(k): _intern(v) for k, v in mapping.items()})


def _intern(text: str) -> str:
    # sys.intern takes exact str only; a subclass (possible from code, never from YAML) stays as is.
    return sys.intern(text) if type(text) is str else text


@dataclass(frozen=True, slots=True, eq=False, init=False)
class Config:
    """One Istio resource: Kubernetes envelope, typed spec, and where it came from.

    The spec may be given as its wire form (`SerializeToString(deterministic=True)`, as bytes),
    and is then kept so and parsed again on each read of `spec`. That is for the kinds a mesh has
    by the ten thousand and reads rarely once loaded (the loader packs WorkloadEntries, which the
    registry turns into endpoints): a WorkloadEntry message costs about a kilobyte with upb, its
    wire form some fifty bytes. A packed spec is a new message on every read, so read it once
    per use rather than field by field.
    """

    key: ConfigKey
    api_version: str
    #: The spec message, or a packed spec's wire form.
    _spec: Message | bytes = field(repr=False)
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    source: Source
    #: `metadata.creationTimestamp` in seconds since the epoch, when the YAML gives one (copied
    #: from a cluster): Istio lets the oldest of two conflicting resources win (`istio_order`).
    created: float | None
    #: `content_digest`, computed on first use (configs are immutable; snapshots hash each one).
    _digest: str | None = field(default=None, repr=False)

    def __init__(
        self,
        key: ConfigKey,
        api_version: str,
        spec: Message | bytes,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        source: Source | None = None,
        created: float | None = None,
    ) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "api_version", api_version)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "labels", _frozen(labels))
        object.__setattr__(self, "annotations", _frozen(annotations))
        object.__setattr__(self, "source", source if source is not None else Source(file="<memory>"))
        object.__setattr__(self, "created", created)
        object.__setattr__(self, "_digest", None)

    def with_source(self, source: Source) -> Config:
        """The same resource read at another place (a document that moved within its file)."""
        out = Config.__new__(Config)
        for name in ("key", "api_version", "_spec", "labels", "annotations", "created", "_digest"):
            object.__setattr__(out, name, getattr(self, name))
        object.__setattr__(out, "source", source)
        return out

    def istio_order(self) -> tuple[float, str, str]:
        """Where Istio puts this resource among conflicting ones (`sortConfigByCreationTime`):
        the oldest first, a resource without a creation time (Kubernetes' zero time) before any
        with one, then by name, then by namespace."""
        return (self.created if self.created is not None else -math.inf, self.key.name, self.key.namespace)

    @property
    def spec(self) -> Message:
        spec = self._spec
        if isinstance(spec, bytes):
            return _spec_class(self.key.kind).FromString(spec)
        return spec

    @property
    def packed(self) -> bool:
        """True when the spec is kept as its wire form (see the class docstring)."""
        return isinstance(self._spec, bytes)

    @property
    def kind(self) -> str:
        return self.key.kind

    @property
    def namespace(self) -> str:
        return self.key.namespace

    @property
    def name(self) -> str:
        return self.key.name

    def content_digest(self) -> str:
        """A hash of everything that can change generated config (not the source position):
        two replicas that read the same YAML compute the same digest."""
        if self._digest is not None:
            return self._digest
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.key.kind}\0{self.key.namespace}\0{self.key.name}\0".encode())
        for k, v in sorted(self.labels.items()):
            h.update(f"l\0{k}\0{v}\0".encode())
        for k, v in sorted(self.annotations.items()):
            h.update(f"a\0{k}\0{v}\0".encode())
        if self.created is not None:
            h.update(f"c\0{self.created!r}\0".encode())
        h.update(self.spec_wire())
        digest = h.hexdigest()
        object.__setattr__(self, "_digest", digest)
        return digest

    def same_content(self, other: Config) -> bool:
        """True when replacing `other` by `self` would change nothing a proxy can see."""
        return (
            self.key == other.key
            and self.created == other.created
            and dict(self.labels) == dict(other.labels)
            and dict(self.annotations) == dict(other.annotations)
            and self._same_spec(other)
        )

    def spec_wire(self) -> bytes:
        """The spec's deterministic wire form (what a packed Config keeps)."""
        spec = self._spec
        return spec if isinstance(spec, bytes) else spec.SerializeToString(deterministic=True)

    def _same_spec(self, other: Config) -> bool:
        a, b = self._spec, other._spec
        if isinstance(a, bytes) and isinstance(b, bytes):
            # Deterministic wire forms of one message type differ only where the messages do
            # (or for -0.0 against 0.0, where a needless update is the worst that can happen).
            return a == b
        return self.spec == other.spec


def make_config(
    kind: str,
    name: str,
    namespace: str,
    spec: Message,
    *,
    api_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    source: Source | None = None,
    created: float | None = None,
) -> Config:
    """Build a Config in code (tests, registries); the loader builds them from YAML. The
    apiVersion is the v1 of the kind's group unless given."""
    return Config(
        key=ConfigKey(kind, namespace, name),
        api_version=api_version if api_version is not None else f"{_SERVED.get(kind, NETWORKING_GROUP)}/v1",
        spec=spec,
        labels=labels,
        annotations=annotations,
        source=source,
        created=created,
    )
