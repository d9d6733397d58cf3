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
the proxy is bound in and the service account of its workload (`Proxy.service_account`: for an
attested node, exactly the one its certificate proved; a workload naming none runs as `default`).
A node whose binding no longer holds (`BindingError`) has its certificate forgotten at once.

Certificates are issued per identity, not per node: the nodes of one identity share one
certificate and key (as they would share a service account's), so a client naming thousands of
node ids costs one certificate, not thousands. A certificate is kept while a node holds it and
replaced once two thirds of its lifetime is spent (`due`): the server then publishes again to the
nodes holding it, they re-resolve, and only their secrets change, so Envoy swaps the certificate
under live connections without touching a cluster or a listener. A node whose last stream ends
is forgotten (`forget`), and with its identity's last node, the certificate.

The CA is read from a `CaHolder` at each issue, so a CA replaced while serving (`--ca-dir`
followed, `meshctl.server.ca_follower`) signs the next certificate. `follow_ca` then does the
rest: a new trust bundle goes into every `ROOTCA` at once (the server pushes it to every holder),
and each certificate the old signing certificate issued is made due at a random time within the
reissue window, so the fleet moves to the new CA spread over the window rather than in one burst.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from cryptography import x509
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from meshctl.errors import BindingError
from meshctl.logs import untrusted
from meshctl.security.ca import CertificateAuthority, IssuedCertificate
from meshctl.security.identity import WorkloadIdentity
from meshctl.server.ca_follower import CaHolder
from meshctl.server.proxy_resources import ProxyResources, Resolved
from meshctl.snapshot.node import ProxyNode
from meshctl.snapshot.proxy import Proxy
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
    #: The time its entry in the heap of due certificates carries (`WorkloadSecrets.due`): its
    #: renewal time, or the random time a CA rotation reissues it at.
    due_at: datetime.datetime
    #: The CA certificate that signed it (one no longer in force has it reissued), and the root
    #: its chain ends at (one no longer in the trust bundle has it reissued at once).
    signer: x509.Certificate | None = None
    root: x509.Certificate | None = None


class WorkloadSecrets:
    """Adds a proxy's SDS secrets to what `resolve` gives it (see the module docstring)."""

    def __init__(
        self,
        resolve: Resolver,
        ca: CertificateAuthority | CaHolder | None,
        *,
        trust_domain: Callable[[], str],
        lifetime: datetime.timedelta = datetime.timedelta(hours=24),
        send_keys_unauthenticated: bool = False,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._resolve = resolve
        self._holder = ca if isinstance(ca, CaHolder) or ca is None else CaHolder(ca)
        self._trust_domain = trust_domain
        self._lifetime = lifetime
        self._unauthenticated = send_keys_unauthenticated
        self._clock = clock
        self._lock = threading.Lock()
        #: identity -> its certificate, shared by the nodes holding it
        self._held: dict[WorkloadIdentity, _Held] = {}
        #: node id -> the identity whose certificate it was last sent
        self._holders: dict[str, WorkloadIdentity] = {}
        #: identity -> how many nodes hold it (a node leaving is then no scan of every node)
        self._holding: Counter[WorkloadIdentity] = Counter()
        #: (renewal time, URI, identity) of every certificate issued (the URI orders equal times);
        #: entries no longer held (renewed, forgotten) are dropped when they reach the top.
        self._due: list[tuple[datetime.datetime, str, WorkloadIdentity]] = []
        #: Certificates due within this long of a round are renewed in it: proxies that connected
        #: within a few seconds of each other then renew in one round, not one round each.
        self._window = min(lifetime / 20, datetime.timedelta(minutes=10))
        self._refused: set[str] = set()
        self._node_as = NodeAs(lambda n: n.mesh_certificates, lambda n, v: replace(n, mesh_certificates=v))
        self._root_pem = b""
        self._root_message = mesh_tls.validation_secret(mesh_tls.ROOT_SECRET, b"")
        self._root: Resource | None = None
        if self._holder is not None:
            self._set_root(self._holder.current.root_pem)
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

    @property
    def _ca(self) -> CertificateAuthority | None:
        return self._holder.current if self._holder is not None else None

    def _set_root(self, root_pem: bytes) -> None:
        """The `ROOTCA` secret for the trust bundle `root_pem`."""
        self._root_pem = root_pem
        self._root_message = mesh_tls.validation_secret(mesh_tls.ROOT_SECRET, root_pem)
        self._root = to_resource(self._root_message, types.SECRET)

    def follow_ca(self, window: datetime.timedelta, rng: Callable[[], float] = random.random) -> set[str]:
        """After the holder's CA was replaced: every certificate held gets the new trust bundle,
        and each one a signing certificate no longer in force issued is due at a random time
        within `window` from now (never later than it was), or at once when the bundle no longer
        holds the root it chains to (peers refuse it already). Returns the nodes to push to now:
        every holder when the bundle changed (they must trust the new root before a peer shows
        them a certificate from it), else none."""
        if self._holder is None:
            return set()
        ca = self._holder.current
        now = self._clock()
        with self._lock:
            bundle_changed = ca.root_pem != self._root_pem
            if bundle_changed:
                self._set_root(ca.root_pem)
            assert self._root is not None
            trusted = set(x509.load_pem_x509_certificates(ca.root_pem))
            for identity, held in list(self._held.items()):
                workload = held.secrets[mesh_tls.WORKLOAD_SECRET]
                secrets = MappingProxyType({mesh_tls.WORKLOAD_SECRET: workload, mesh_tls.ROOT_SECRET: self._root})
                renew_from, due_at = held.renew_from, held.due_at
                if held.signer != ca.certificate:
                    at = now if held.root not in trusted else now + window * rng()
                    if at < renew_from:
                        renew_from = due_at = at
                        heapq.heappush(self._due, (at, identity.uri, identity))
                self._held[identity] = replace(
                    held,
                    secrets=secrets,
                    messages=(held.messages[0], self._root_message),
                    renew_from=renew_from,
                    due_at=due_at,
                )
            return set(self._holders) if bundle_changed else set()

    def signers(self) -> Counter[str]:
        """How many certificates held each CA certificate signed, by its subject (for tests and
        the operator: a rotation is done when only the new one is left)."""
        with self._lock:
            return Counter(
                h.signer.subject.rfc4514_string() if h.signer is not None else "" for h in self._held.values()
            )

    def may_send_keys(self, node: ProxyNode) -> bool:
        return self._ca is not None and (node.attested or self._unauthenticated)

    def resolve(self, node: ProxyNode, state: Any) -> Resolved:
        allowed = self.may_send_keys(node)
        try:
            resolved = self._resolve(self._node_as.get(node, allowed), state)
        except BindingError:
            self.forget(node.id)  # its stream ends: the key it held is no longer its
            raise
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
            identity = self._holders.get(node_id)
            found = self._held.get(identity) if identity is not None else None
        return found.messages if found is not None else ()

    def held_nodes(self) -> list[str]:
        """The node ids holding a certificate (for the debug pages and tests)."""
        with self._lock:
            return sorted(self._holders)

    def held_identities(self) -> list[str]:
        """The identities a certificate is held for (for the debug pages and tests)."""
        with self._lock:
            return sorted(i.uri for i in self._held)

    def forget(self, node_id: str) -> None:
        """`node_id` holds no certificate any more (its last stream ended, or its binding no
        longer holds); its identity's certificate goes with its last node."""
        self._node_as.forget(node_id)
        with self._lock:
            identity = self._holders.pop(node_id, None)
            if identity is not None:
                self._holding[identity] -= 1
                if self._holding[identity] <= 0:
                    del self._holding[identity]
                    self._held.pop(identity, None)

    def earliest_expiry(self) -> datetime.datetime | None:
        """When the first workload certificate held expires (None: none held): how long the fleet
        lasts if this server, and every replica, stopped renewing now."""
        with self._lock:
            return min((h.certificate.not_after for h in self._held.values()), default=None)

    def due(self) -> datetime.datetime | None:
        """When the first certificate held needs renewing (None: none held); cheap, whatever the
        fleet (the top of a heap)."""
        with self._lock:
            while self._due:
                at, _, identity = self._due[0]
                held = self._held.get(identity)
                if held is not None and held.due_at == at:
                    return at
                heapq.heappop(self._due)
            return None

    def due_nodes(self, now: datetime.datetime) -> set[str]:
        """The nodes a renewal round at `now` renews: those holding a certificate due by now, and
        within the window."""
        with self._lock:
            due = {i for i, h in self._held.items() if h.renew_from <= now}
            return {n for n, i in self._holders.items() if i in due}

    def forget_due(self, now: datetime.datetime) -> int:
        """After a renewal round: drop the certificates still due at `now`. Every connected
        proxy due was resolved again in the round and got a new one, so these belong to proxies
        that left; kept, they would make every round due at once until they expire. Returns how
        many."""
        with self._lock:
            gone = {i for i, h in self._held.items() if h.renew_from <= now}
            for identity in gone:
                del self._held[identity]
            self._holders = {n: i for n, i in self._holders.items() if i not in gone}
            for identity in gone:
                self._holding.pop(identity, None)
        return len(gone)

    def _hold(self, node_id: str, identity: WorkloadIdentity) -> None:
        """Note that `node_id` holds `identity`'s certificate (with the lock held)."""
        before = self._holders.get(node_id)
        if before == identity:
            return
        if before is not None:
            self._holding[before] -= 1
            if self._holding[before] <= 0:
                del self._holding[before]
                self._held.pop(before, None)
        self._holders[node_id] = identity
        self._holding[identity] += 1

    def _certificate(self, proxy: Proxy, state: Any) -> _Held:
        ca = self._ca
        assert ca is not None and self._root is not None  # only for nodes `may_send_keys` allows
        identity = WorkloadIdentity(self._trust_domain(), proxy.namespace, proxy.service_account or "default")
        now = self._clock()
        with self._lock:
            held = self._held.get(identity)
            if held is not None and now < held.renew_from:
                self._hold(proxy.id, identity)
                return held
        certificate = ca.issue_workload(identity, self._lifetime, now)
        secret = mesh_tls.tls_certificate_secret(
            mesh_tls.WORKLOAD_SECRET, certificate.cert_chain_pem, certificate.private_key_pem
        )
        workload = to_resource(secret, types.SECRET)
        renew_from, due_at = certificate.renew_at - self._window, certificate.renew_at
        with self._lock:
            if self._ca is not ca:  # replaced while this one was signed: reissued at the next round
                renew_from = due_at = now
            # The bundle under the lock: a rotation may have replaced it meanwhile.
            secrets = MappingProxyType({mesh_tls.WORKLOAD_SECRET: workload, mesh_tls.ROOT_SECRET: self._root})
            held = _Held(
                identity,
                certificate,
                secrets,
                (secret, self._root_message),
                renew_from,
                due_at,
                ca.certificate,
                ca.chain[-1],
            )
            self._held[identity] = held
            self._hold(proxy.id, identity)
            heapq.heappush(self._due, (due_at, identity.uri, identity))
            self.issued += 1
        logger.info(
            "issued %s to proxy %s until %s", identity.uri, untrusted(proxy.id), certificate.not_after.isoformat()
        )
        return held


class NodeAs:
    """A node with one of its flags (`mesh_certificates`, `credentials`) as resolving it needs,
    made once per node object, not once per resolve: every stream is resolved at every
    publication, and a `dataclasses.replace` of the node costs more than the rest of resolving
    a kept binding (the cache then also finds its node by identity, not by comparing fields).
    Holds one entry per node id, forgotten with the node, and never more than `_MAX_NODES`."""

    def __init__(self, flag: Callable[[ProxyNode], bool], with_flag: Callable[[ProxyNode, bool], ProxyNode]) -> None:
        self._flag = flag
        self._with_flag = with_flag
        self._made: dict[str, tuple[ProxyNode, ProxyNode]] = {}

    def get(self, node: ProxyNode, value: bool) -> ProxyNode:
        found = self._made.get(node.id)
        if found is not None and found[0] is node and self._flag(found[1]) == value:
            return found[1]
        made = node if self._flag(node) == value else self._with_flag(node, value)
        if len(self._made) >= _MAX_NODES:
            self._made.clear()  # node ids that left without being forgotten: made again if asked
        self._made[node.id] = (node, made)
        return made

    def forget(self, node_id: str) -> None:
        self._made.pop(node_id, None)


#: Nodes `NodeAs` holds at most: more than one replica serves (a fleet larger still only makes
#: them again), few enough that the nodes of streams long gone weigh little (an entry holds the
#: node it was made from: a few KB at most).
_MAX_NODES = 20_000
