"""How one Istio resource names or reaches another, read once for every reader.

A VirtualService names Gateways in three forms that all mean `namespace/name`; validation,
analysis, the Sidecar scope and the generators must read them alike, or a form that validates
binds nothing (a TCP route bound by the legacy FQDN form once got no gateway listener). The same
holds for `exportTo`, read by the registry (services), the snapshot index (VirtualServices and
DestinationRules) and analysis. Short host names are resolved in `hosts.resolve_host`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

#: The reserved gateway name of every sidecar in the mesh.
MESH_GATEWAY: Final = "mesh"


def resolve_gateway_name(ref: str, namespace: str) -> str:
    """A gateway reference written in a resource of `namespace`, as `namespace/name`, following
    Istio's resolveGatewayName: `name` and `./name` are in `namespace`; `ns/name` is as written;
    a dotted name is the legacy FQDN form, `name.ns[.svc.cluster.local]` -> `ns/name`. `mesh`
    stays `mesh`."""
    if ref == MESH_GATEWAY:
        return ref
    ns, slash, name = ref.partition("/")
    if slash:
        return f"{namespace}/{name}" if ns == "." else ref
    short, dot, rest = ref.partition(".")
    if not dot:
        return f"{namespace}/{ref}"
    return f"{rest.partition('.')[0]}/{short}"


def is_exported(export: Collection[str], owner_namespace: str, namespace: str) -> bool:
    """Istio's `exportTo` of a resource of `owner_namespace`, seen from `namespace`: `*` (or an
    empty list) everywhere, `.` its own namespace, else the namespaces listed. A caller with a
    mesh-wide default (MeshConfig's default*ExportTo) passes it for an empty list."""
    if not export or "*" in export or namespace in export:
        return True
    return "." in export and namespace == owner_namespace


#: (group, kind) a WasmPlugin's or EnvoyFilter's `targetRefs` may name in meshctl, the core group
#: spelled "core" (resolved to proxies by `snapshot/target_refs.py`). Istio's GatewayClass is not
#: one: it names every gateway of a class, which meshctl does not have.
POLICY_TARGET_KINDS: Final = frozenset(
    {
        ("gateway.networking.k8s.io", "Gateway"),
        ("networking.istio.io", "Gateway"),
        ("networking.istio.io", "ServiceEntry"),
        ("core", "Service"),
    }
)
POLICY_TARGET_NAMES: Final = "gateway.networking.k8s.io/Gateway, ServiceEntry or Service"
