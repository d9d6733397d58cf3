"""What a proxy's inbound config (its own workload's clusters and listeners) is made of, as one
frozen value: the only input of inbound generation, and its cache key.

Inbound generation used to take the whole `ProxyScope` and a hand-kept key beside it had to name
every part of the snapshot it read. Now the inbound generators read an `InboundView` and nothing
else, so an input they read is in the key by construction: a field added here is compared and
hashed with the rest. A change to another workload's Sidecar or another service's
DestinationRule leaves the view (and the part generated from it) as it was.

The proxy enters as a `Ref` named by `Proxy.generation_key` (what generation reads of it: its
type, namespace, labels, interception, instances' ports, and its address where that appears in
config); the configs as `Ref`s named by their content digests. So an AuthorizationPolicy edit
changes the views (and regenerates the inbound parts) of the workloads it selects, and of no
other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshctl.config.model import Config
from meshctl.registry.model import Service
from meshctl.security.authorization import ignored_policies, policies_for_workload
from meshctl.security.peer_authentication import WorkloadMtls, workload_mtls
from meshctl.security.request_authentication import policies_for_workload as request_authentications
from meshctl.security.request_authentication import sorted_jwt_rules
from meshctl.snapshot.model import MeshSettings
from meshctl.snapshot.proxy import Proxy
from meshctl.snapshot.scope import MergedDestinationRule, ProxyScope
from meshctl.snapshot.telemetry import LogPlan
from meshctl.snapshot.tracing import TraceSide
from meshctl.xds import names
from meshctl.xds.memo import Ref
from meshctl.xds.refs import config_ref, destination_rule_ref


@dataclass(frozen=True, slots=True)
class InboundRule:
    """The DestinationRule that applies to one of the workload's own services (its connection
    pool sizes the inbound cluster), with Istio's `config` path of its first source."""

    host: str
    rule: Ref[MergedDestinationRule]
    path: str


@dataclass(frozen=True, slots=True)
class InboundView:
    """Everything `generate_inbound` reads: the proxy, the services its workload serves, the
    Sidecar that applies to it, the DestinationRules of its own services, the mesh settings, the
    PeerAuthentication modes of its ports and the AuthorizationPolicies that select it."""

    proxy: Ref[Proxy]
    #: The services the workload serves, by host name (their ports and protocols).
    services: tuple[Service, ...]
    sidecar: Ref[Config] | None
    rules: tuple[InboundRule, ...]
    mesh: MeshSettings
    #: The PeerAuthentication modes of the workload's ports.
    mtls: WorkloadMtls = field(default_factory=WorkloadMtls)
    #: The AuthorizationPolicies that select the workload, in Istio's order.
    authorization: tuple[Ref[Config], ...] = ()
    #: Policies of its namespaces that name a targetRef: they select no workload, and generation
    #: says so (here so that the warning follows the policy).
    ignored_authorization: tuple[Ref[Config], ...] = ()
    #: The RequestAuthentications that apply to the workload, in Istio's order.
    request_authentication: tuple[Ref[Config], ...] = ()
    #: The access logs Telemetry gives its inbound listeners (`snapshot/telemetry.py`).
    server_logs: LogPlan = ()
    #: The tracing Telemetry gives its inbound listeners (`snapshot/tracing.py`).
    server_tracing: TraceSide | None = None

    @property
    def sidecar_config(self) -> Config | None:
        return self.sidecar.value if self.sidecar is not None else None

    @property
    def authorization_policies(self) -> tuple[Config, ...]:
        return tuple(ref.value for ref in self.authorization)

    @property
    def jwt_rules(self) -> tuple[Any, ...]:
        """The JWT rules of its RequestAuthentications, sorted by issuer (`jwt_authn`'s input)."""
        return sorted_jwt_rules(ref.value for ref in self.request_authentication)

    @property
    def ignored_authorization_policies(self) -> tuple[Config, ...]:
        return tuple(ref.value for ref in self.ignored_authorization)

    def destination_rule(self, hostname: str) -> InboundRule | None:
        """The rule for one of the workload's own services, if one applies."""
        return next((r for r in self.rules if r.host == hostname), None)


def inbound_view(scope: ProxyScope) -> InboundView:
    """The scope's proxy's inbound view: what its own workload's config is made of. The scope
    must have been made for the bound proxy (its OutboundProxy alone says nothing of the
    workload)."""
    proxy = scope.bound
    if proxy is None:
        raise ValueError("an inbound view needs a scope of a bound proxy, not of an OutboundProxy")
    services = {i.service.hostname: i.service for i in proxy.instances}
    sidecar = scope.sidecar
    rules = []
    for host in sorted(services):
        ref = destination_rule_ref(scope, host)
        if ref is not None:
            path = names.config_path(scope.snapshot.configs[ref.value.sources[0]])
            rules.append(InboundRule(host, ref, path))
    return InboundView(
        proxy=Ref(proxy.generation_key(), proxy),
        services=tuple(services[h] for h in sorted(services)),
        sidecar=config_ref(sidecar) if sidecar is not None else None,
        rules=tuple(rules),
        mesh=scope.snapshot.mesh,
        mtls=workload_mtls(scope.snapshot, proxy.namespace, proxy.labels),
        authorization=tuple(
            config_ref(c) for c in policies_for_workload(scope.snapshot, proxy.namespace, proxy.labels)
        ),
        ignored_authorization=tuple(config_ref(c) for c in ignored_policies(scope.snapshot, proxy.namespace)),
        request_authentication=tuple(
            config_ref(c) for c in request_authentications(scope.snapshot, proxy.namespace, proxy.labels)
        ),
        server_logs=proxy.access_logs.server,
        server_tracing=proxy.tracing.server,
    )
