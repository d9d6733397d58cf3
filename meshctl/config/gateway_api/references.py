"""What a Gateway API resource may refer to, and what the reference names.

A route in one namespace may send traffic to a backend in another, and a Gateway may use a
certificate from another namespace, only when a ReferenceGrant in the target's namespace allows
it (GEP-709). Backends name Istio services: a Kubernetes `Service` is the host
`NAME.NAMESPACE.svc.cluster.local` (on VMs, a ServiceEntry with that host), Istio's `Hostname`
kind names a host outright, and a `ServiceEntry` stands for its first host, as in Istio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from meshctl.config.gateway_api.model import GROUP, ISTIO_GROUP, BackendRef, GrantSpec
from meshctl.config.gateway_api.status import BACKEND_NOT_FOUND, INVALID_KIND, REF_NOT_PERMITTED

DOMAIN_SUFFIX: Final = "svc.cluster.local"


def service_host(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{DOMAIN_SUFFIX}"


class Grants:
    """Every ReferenceGrant, by the namespace it lives in (the namespace it opens)."""

    def __init__(self, grants: Iterable[tuple[str, GrantSpec]]) -> None:
        self._by_namespace: dict[str, list[GrantSpec]] = {}
        for namespace, grant in grants:
            self._by_namespace.setdefault(namespace, []).append(grant)

    def allows(self, source: tuple[str, str, str], target: tuple[str, str, str, str]) -> bool:
        """Whether a resource of (group, kind, namespace) may refer to (group, kind, namespace,
        name). A reference within one namespace needs no grant."""
        group, kind, namespace = source
        to_group, to_kind, to_namespace, to_name = target
        if namespace == to_namespace:
            return True
        for grant in self._by_namespace.get(to_namespace, ()):
            if not any(f.group == group and f.kind == kind and f.namespace == namespace for f in grant.sources):
                continue
            if any(t.group == to_group and t.kind == to_kind and t.name in (None, to_name) for t in grant.targets):
                return True
        return False


@dataclass(frozen=True, slots=True)
class Resolved:
    """A backend's host and port, or why it has none (a ResolvedRefs reason and message)."""

    host: str = ""
    port: int | None = None
    reason: str = ""
    message: str = ""


class Backends:
    """Resolves a route's backendRefs against the hosts the mesh knows and the grants."""

    def __init__(
        self,
        known: Callable[[str], bool],
        service_entries: Mapping[tuple[str, str], list[str]],
        grants: Grants,
    ) -> None:
        self._known = known
        self._entries = service_entries
        self._grants = grants

    def resolve(self, ref: BackendRef, route_kind: str, route_namespace: str) -> Resolved:
        namespace = ref.namespace or route_namespace
        what = f"{ref.kind} {namespace}/{ref.name}"
        if not self._grants.allows((GROUP, route_kind, route_namespace), (ref.group, ref.kind, namespace, ref.name)):
            return Resolved(
                reason=REF_NOT_PERMITTED,
                message=f"backendRef to {what} is not permitted: no ReferenceGrant in namespace {namespace} "
                f"allows {route_kind}s of namespace {route_namespace} to refer to it",
            )
        if ref.group == "" and ref.kind == "Service":
            host = service_host(ref.name, namespace)
        elif ref.group == ISTIO_GROUP and ref.kind == "Hostname":
            host = ref.name
        elif ref.group == ISTIO_GROUP and ref.kind == "ServiceEntry":
            hosts = self._entries.get((namespace, ref.name))
            if not hosts:
                return Resolved(reason=BACKEND_NOT_FOUND, message=f"backend {what} not found")
            return Resolved(hosts[0], ref.port)
        else:
            group = ref.group or "core"
            return Resolved(
                reason=INVALID_KIND,
                message=f"backendRef kind {group}/{ref.kind} is not served: use Service, "
                f"{ISTIO_GROUP}/Hostname or {ISTIO_GROUP}/ServiceEntry",
            )
        if ref.port is None:
            return Resolved(reason=BACKEND_NOT_FOUND, message=f"backendRef to {what} needs a port")
        if ref.kind == "Service" and not self._known(host):
            return Resolved(reason=BACKEND_NOT_FOUND, message=f"backend {what} not found: no service has host {host}")
        return Resolved(host, ref.port)
