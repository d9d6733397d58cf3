"""Which proxies a policy's `targetRefs` name, in meshctl's model (WasmPlugin, EnvoyFilter).

In Istio a target reference attaches a policy to a Kubernetes Gateway API Gateway (its
deployment) or to a Service (its waypoint). meshctl has no Kubernetes objects, so it resolves
the references the model can express, in the policy's own namespace:

- `kind: Gateway` (`gateway.networking.k8s.io` or `networking.istio.io`): the gateway proxies
  (`router~` nodes) that the Gateway of that name selects, the ones bound to it;
- `kind: ServiceEntry` (`networking.istio.io`): the workloads that are endpoints of the services
  that ServiceEntry defines;
- `kind: Service` (core group, `""` or `core`): the workloads that are endpoints of the service
  whose hostname is `NAME.NAMESPACE.svc.<domain>` (or just `NAME`), as a Kubernetes Service's is.

A `GatewayClass` names every gateway of a class, which meshctl does not have: refused by
validation with that reason (`config.references.POLICY_TARGET_KINDS`). A policy with target references never applies
namespace-wide: one whose references resolve to nothing selects no proxy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from meshctl.config.labels import labels_match
from meshctl.registry.model import Service
from meshctl.snapshot.model import Snapshot, spec

GATEWAY_API: Final = "gateway.networking.k8s.io"
NETWORKING: Final = "networking.istio.io"


def references(policy: Any) -> list[Any]:
    """A policy's `targetRefs`, with the older single `targetRef` first when written."""
    single = "target_ref" in policy.DESCRIPTOR.fields_by_name and policy.HasField("target_ref")
    return ([policy.target_ref] if single else []) + list(policy.target_refs)


def _group(ref: Any) -> str:
    return ref.group or "core"


def _serves(service: Service, ref: Any, namespace: str) -> bool:
    if _group(ref) == NETWORKING and ref.kind == "ServiceEntry":
        return service.origin == f"ServiceEntry {namespace}/{ref.name}"
    if _group(ref) == "core" and ref.kind == "Service":
        if service.namespace != namespace:
            return False
        host = service.hostname
        return host == ref.name or host.startswith(f"{ref.name}.{namespace}.svc.")
    return False


def targets_proxy(
    snapshot: Snapshot,
    namespace: str,
    refs: Iterable[Any],
    *,
    router: bool,
    labels: Mapping[str, str],
    services: Iterable[Service],
) -> bool:
    """Whether a policy of `namespace` with target references `refs` applies to a proxy (a
    gateway when `router`, with `labels`, an endpoint of `services`)."""
    served = tuple(services)
    for ref in refs:
        if ref.kind == "Gateway" and _group(ref) in (GATEWAY_API, NETWORKING):
            gateway = snapshot.get("Gateway", namespace, ref.name) if router else None
            if gateway is not None and labels_match(dict(spec(gateway).selector), labels):
                return True
        elif any(_serves(service, ref, namespace) for service in served):
            return True
    return False
