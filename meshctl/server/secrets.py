"""Workload certificates over SDS: each proxy's `default` (its certificate chain and key) and
`ROOTCA` (the mesh's trust bundle), issued by the built-in CA and sent on the proxy's own stream.

`WorkloadSecrets` sits between the ADS servicer and the resource cache (it is the servicer's
`ConfigSource`): it decides whether a node may be sent a key, tells generation so
(`ProxyNode.mesh_certificates`: config that names a secret the proxy never gets would never start),
and adds the two secrets to what the cache resolved for it.

Who gets a key. A private key is the identity it certifies: it goes only to the proxy whose
identity the xDS connection proved (a client certificate naming that workload, `attested`), or,
when the operator opted in for a loopback demo (`--insecure-send-keys`), to any proxy. Any other
proxy gets config without mutual TLS, and the server says so once per node.

The identity is Istio's `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT`: the namespace
the proxy is bound in and the service account of its workload (the WorkloadEntry's, else its
registry endpoints', else `default`).

Certificates are issued per node, kept while the node's identity stays the same, and replaced
once two thirds of their lifetime is spent (`due`): the server then publishes again, every stream
re-resolves, and only the secrets of the renewed nodes change, so Envoy swaps the certificate
under live connections without touching a cluster or a listener.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from meshctl.logs import untrusted
from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.cache import ProxyResources, Resolved
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.proxy import Proxy, ProxyNode
from meshctl.xds import mesh_tls, types
from meshctl.xds.resources import Resource, to_resource

logger = logging.getLogger("meshctl.server.secrets")

Resolver = Callable[[ProxyNode, Any], Resolved]

#: Proxies refused a certificate that the log names one by one; after them, it counts.
_REFUSALS_NAMED = 5


@dataclass(frozen=True, slots=True)
class _Held:
    identity: WorkloadIdentity
    certificate: IssuedCertificate
    #: The two secrets as sent: one mapping for every resolve until the certificate is renewed.
    secrets: Mapping[str, Resource]
    messages: tuple[secret_pb2.Secret, ...]
    #: When a renewal round takes it: its renewal time, less the round's window (`_window`).
    renew_from: datetime.datetime


class WorkloadSecrets:
    """Adds a proxy's SDS secrets to what `resolve` gives it (see the module docstring)."""

    def __init__(
        self,
        resolve: Resolver,
        ca: CertificateAuthority | None,
        *,
        trust_domain: Callable[[], str],
        lifetime: datetime.timedelta = datetime.timedelta(hours=24),
        send_keys_unauthenticated: bool = False,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._resolve = resolve
        self._ca = ca
        self._trust_domain = trust_domain
        self._lifetime = lifetime
        self._unauthenticated = send_keys_unauthenticated
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        #: (renewal time, node id) of every certificate issued; entries no longer held (renewed,
        #: forgotten) are dropped when they reach the top.
        self._due: list[tuple[datetime.datetime, str]] = []
        #: Certificates due within this long of a round are renewed in it: proxies that connected
        #: within a few seconds of each other then renew in one round, not one round each.
        self._window = min(lifetime / 20, datetime.timedelta(minutes=10))
        self._refused: set[str] = set()
        self._root_message = mesh_tls.validation_secret(mesh_tls.ROOT_SECRET, ca.root_pem if ca is not None else b"")
        self._root = to_resource(self._root_message, types.SECRET) if ca is not None else None
        #: certificates issued (for /metrics and the benchmarks)
        self.issued = 0

    @staticmethod
    def _said_refused(count: int, node: ProxyNode) -> None:
        """Say that a proxy gets no certificate: the first few by name, then how many so far at
        10, 100, 1,000...: a fleet on plaintext xDS would otherwise log a line per proxy at each
        start (1,000 lines, and a few percent of the cold start's CPU)."""
        if count <= _REFUSALS_NAMED:
            logger.warning(
                "proxy %s gets no workload certificate: its xDS connection did not prove its identity "
                "(serve with --client-ca); its config uses no mutual TLS",
                untrusted(node.id),
            )
        elif count >= 10 and str(count).rstrip("0") == "1":
            logger.warning(
                "%d proxies so far get no workload certificate: their xDS connections did not prove their "
                "identity (serve with --client-ca); their config uses no mutual TLS",
                count,
            )

    def may_send_keys(self, node: ProxyNode) -> bool:
        return self._ca is not None and (node.attested or self._unauthenticated)

    def resolve(self, node: ProxyNode, state: Any) -> Resolved:
        allowed = self.may_send_keys(node)
        resolved = self._resolve(replace(node, mesh_certificates=allowed), state)
        if not allowed:
            if self._ca is not None and node.id not in self._refused and len(self._refused) < 10_000:
                self._refused.add(node.id)
                self._said_refused(len(self._refused), node)
            return resolved
        held = self._certificate(resolved.proxy, state)
        resources = resolved.resources
        by_type = dict(resources.by_type)
        by_type[types.SECRET] = held.secrets
        return Resolved(
            resolved.proxy,
            ProxyResources(resources.snapshot_version, resources.config_version, MappingProxyType(by_type)),
        )

    def held(self, node_id: str) -> tuple[secret_pb2.Secret, ...]:
        """The secrets last issued to `node_id` (for the debug dump, which redacts the key)."""
        with self._lock:
            found = self._held.get(node_id)
        return found.messages if found is not None else ()

    def held_nodes(self) -> list[str]:
        """The node ids holding a certificate (for the debug pages and tests)."""
        with self._lock:
            return sorted(self._held)

    def due(self) -> datetime.datetime | None:
        """When the first certificate held needs renewing (None: none held); cheap, whatever the
        fleet (the top of a heap)."""
        with self._lock:
            while self._due:
                at, node_id = self._due[0]
                held = self._held.get(node_id)
                if held is not None and held.certificate.renew_at == at:
                    return at
                heapq.heappop(self._due)
            return None

    def due_nodes(self, now: datetime.datetime) -> set[str]:
        """The nodes a renewal round at `now` renews: those due by now, and within the window."""
        with self._lock:
            return {n for n, h in self._held.items() if h.renew_from <= now}

    def forget_due(self, now: datetime.datetime) -> int:
        """After a renewal round: drop the certificates still due at `now`. Every connected
        proxy due was resolved again in the round and got a new one, so these belong to proxies
        that left; kept, they would make every round due at once until they expire. Returns how
        many."""
        with self._lock:
            gone = [n for n, h in self._held.items() if h.renew_from <= now]
            for node_id in gone:
                del self._held[node_id]
        return len(gone)

    def _certificate(self, proxy: Proxy, state: Any) -> _Held:
        assert self._ca is not None and self._root is not None  # only for nodes `may_send_keys` allows
        identity = WorkloadIdentity(self._trust_domain(), proxy.namespace, _service_account(proxy, state))
        now = self._clock()
        with self._lock:
            held = self._held.get(proxy.id)
        if held is not None and held.identity == identity and now < held.renew_from:
            return held
        certificate = self._ca.issue_workload(identity, self._lifetime, now)
        secret = mesh_tls.tls_certificate_secret(
            mesh_tls.WORKLOAD_SECRET, certificate.cert_chain_pem, certificate.private_key_pem
        )
        secrets = MappingProxyType(
            {mesh_tls.WORKLOAD_SECRET: to_resource(secret, types.SECRET), mesh_tls.ROOT_SECRET: self._root}
        )
        renew_from = certificate.renew_at - self._window
        held = _Held(identity, certificate, secrets, (secret, self._root_message), renew_from)
        with self._lock:
            self._held[proxy.id] = held
            heapq.heappush(self._due, (certificate.renew_at, proxy.id))
            self.issued += 1
        logger.info("issued %s to proxy %s until %s", identity.uri, proxy.id[:200], certificate.not_after.isoformat())
        return held


def _service_account(proxy: Proxy, state: Any) -> str:
    """The service account the proxy's workload runs as: its WorkloadEntry's, else its registry
    endpoints' (the first by name), else Istio's `default`."""
    if isinstance(state, Snapshot) and proxy.workload:
        namespace, _, name = proxy.workload.partition("/")
        entry = state.get("WorkloadEntry", namespace, name) if name else None
        if entry is not None and spec(entry).service_account:
            return str(spec(entry).service_account)
    accounts = sorted({i.endpoint.service_account for i in proxy.instances if i.endpoint.service_account})
    return accounts[0] if accounts else "default"
