"""Who may talk to meshctl: TLS on the xDS port, the proxy identity rule, the admin bearer token.

xDS over TLS (`XdsTls`). The server presents `--tls-cert`/`--tls-key`; with `--client-ca` every
proxy must present a certificate signed by that CA (the TLS handshake fails without one, so a
plaintext or anonymous client never reaches the servicer). The three files are re-read when they
change on disk (checked at each new connection, a `stat` per file), because VM certificates are
short-lived and rotated by an agent: a rotation must not need a restart that drops every stream.
A half-written rotation is not applied; the last good files stay in use until all three load.

The identity rule (with `--client-ca`). A client certificate proves one workload running as one
service account, and a proxy gets the config and the key of exactly that. A stream's node id
`TYPE~IP~NAME.NAMESPACE~DOMAIN` is bound as an attested node (`bind_proxy`: its own namespace
only; bound to a WorkloadEntry, only that entry's endpoints are its instances, whatever else is
at the IP it claims), and allowed when the client certificate has

- a URI SAN `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT` whose namespace is the node's
  namespace (the one config is served for: `NAMESPACE` in node metadata wins over the id, as in
  `parse_node_id`) and whose service account is the one the workload runs as: the WorkloadEntry's
  `serviceAccount`, else its WorkloadGroup template's, else `default` (as Istio); bound by IP to
  registry endpoints, the one they all run as (`default` where they name none; endpoints that
  disagree name no one identity and are refused); or
- a DNS SAN equal to `NAME.NAMESPACE` of the node (compared without case, as DNS does; wildcard
  SANs name no single workload and never match) when the workload is the one so named, for plain
  VM setups without SPIFFE.

Any one matching SAN is enough, and the trust domain is not compared: the client CA decides which
trust domains are accepted, as istiod does (`checkConnectionIdentity`). The workload must exist:
a WorkloadEntry of the node's namespace named by the node id or at its IP, or a registry endpoint
of that namespace at its IP. What was proved (the workload and its service account) goes with the
node (`ProxyNode.workload`, `ProxyNode.service_account`), and every later binding is checked
against it: a snapshot in which the node would bind elsewhere or run as another account ends its
stream (`BindingError`, in `AdsServicer.publish`), and its certificate is forgotten. A refused
stream ends with PERMISSION_DENIED and the reason is logged (`AdsServicer`). SANs are read from
gRPC's auth context, where gRPC core has already split them by type (`peer_uri`, `peer_dns`)
from the verified leaf certificate, so no certificate parsing happens here: a DNS SAN can never
pass for a URI one.

The admin bearer token (`BearerToken`). `/debug/*` shows every proxy's config and the whole
registry. With `--admin-token-file` those pages need `Authorization: Bearer TOKEN` wherever the
admin server listens (compared in constant time; the file is re-read when it changes); without
one they are served only when it listens on loopback (`meshctl.server.admin.debug_access`).
`/ready` and `/metrics` stay open for health checks and Prometheus.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from meshctl.errors import CredentialError
from meshctl.logs import untrusted
from meshctl.security.files import read_credential
from meshctl.server.ads import Authorizer
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot
from meshctl.snapshot.node import ProxyNode

logger = logging.getLogger("meshctl.server.auth")


# -- xDS over TLS --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class XdsTls:
    """The xDS port's TLS files; with `client_ca_file`, proxies must present a certificate."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def requires_client_certificate(self) -> bool:
        return self.client_ca_file is not None

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def load(self) -> grpc.ServerCertificateConfiguration:
        """Read and check the files (key matches certificate, CA parses); raises CredentialError."""
        check_key_pair(self.cert_file, self.key_file)
        chain, key = _read(self.cert_file), _read(self.key_file)
        ca = None
        if self.client_ca_file is not None:
            check_ca(self.client_ca_file)
            ca = _read(self.client_ca_file)
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for `add_secure_port` that pick up rotated files; raises CredentialError."""
        rotation = _Rotation(self)
        return grpc.dynamic_ssl_server_credentials(
            rotation.initial,
            rotation.fetch,  # type: ignore[arg-type]  # grpc-stubs omit the None gRPC documents as "unchanged"
            require_client_authentication=self.requires_client_certificate,
        )


def _read(path: Path) -> bytes:
    try:
        return read_credential(path)  # a regular file, bounded: a FIFO or /dev/zero is refused
    except OSError as exc:
        raise CredentialError(f"cannot read {path}: {exc.strerror or exc}") from exc


def check_key_pair(cert_file: Path, key_file: Path) -> None:
    """Raise CredentialError unless `cert_file` is a PEM certificate chain and `key_file` its key.

    gRPC would only fail at the first handshake, with words no operator connects to a file; the
    standard library parses the same PEM and says which file is wrong. The empty password makes an
    encrypted key fail here rather than prompt on a terminal.
    """
    for path in (cert_file, key_file):
        _read(path)  # the OSError's words ("No such file") beat ssl's for a missing file
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise CredentialError(f"{key_file} is not the private key of {cert_file}") from exc
        raise CredentialError(
            f"{cert_file} / {key_file}: not a PEM certificate and an unencrypted PEM private key ({exc.reason})"
        ) from exc


def check_ca(ca_file: Path) -> None:
    """Raise CredentialError unless `ca_file` holds at least one PEM certificate."""
    _read(ca_file)  # the OSError's words ("No such file") beat ssl's for a missing file
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise CredentialError(f"{ca_file}: no PEM CA certificate in it ({exc.reason})") from exc


_Stamp = tuple[tuple[int, int, int], ...]


class _Rotation:
    """Hands gRPC new certificates when the files change; gRPC asks at each new connection.

    gRPC calls `fetch` on its own threads: it only stats files and reads them when they change,
    and never raises (gRPC would log a traceback and keep the old certificates anyway).
    """

    def __init__(self, tls: XdsTls) -> None:
        self._tls = tls
        self._stamp = self._stat()
        self.initial = tls.load()

    def _stat(self) -> _Stamp:
        stats = [os.stat(p) for p in self._tls.files()]
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            config = self._tls.load()
        except (OSError, CredentialError) as exc:
            logger.warning("keeping the current xDS TLS certificates: %s", exc)
            return None
        self._stamp = stamp
        logger.info("xDS TLS certificates changed on disk; new connections use them")
        return config


# -- the proxy identity rule ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpiffeId:
    trust_domain: str
    namespace: str
    service_account: str

    def __str__(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"


def parse_spiffe_id(uri: str) -> SpiffeId | None:
    """`spiffe://TD/ns/NS/sa/SA` (Istio's workload identity), else None."""
    if not uri.startswith("spiffe://"):
        return None
    parts = uri.removeprefix("spiffe://").split("/")
    if len(parts) != 5 or parts[1] != "ns" or parts[3] != "sa" or not all(parts):
        return None
    return SpiffeId(parts[0], parts[2], parts[4])


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """The SANs of the client's verified certificate, by type; empty when it sent none."""

    uris: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    has_certificate: bool = False

    @classmethod
    def from_auth_context(cls, auth: Mapping[str, Iterable[bytes]]) -> PeerIdentity:
        """From `ServicerContext.auth_context()`: gRPC core fills `peer_uri` and `peer_dns` from the
        leaf certificate it verified against the client CA."""

        def values(key: str) -> tuple[str, ...]:
            return tuple(v.decode("utf-8", "replace") for v in auth.get(key, ()))

        return cls(values("peer_uri"), values("peer_dns"), bool(auth.get("x509_pem_cert")))

    def describe(self) -> str:
        names = [f"URI:{u}" for u in self.uris] + [f"DNS:{d}" for d in self.dns]
        return ", ".join(names) or "no URI or DNS SAN"


def check_identity(
    node: ProxyNode, peer: PeerIdentity, service_account: str, *, bound_by_name: bool = True
) -> str | None:
    """None when `peer`'s certificate names the workload `node` claims (the rule in this module's
    docstring), else the reason to refuse, naming what was presented and what was expected.

    `service_account` is the one the mesh says the node's workload runs as: a URI SAN must name
    exactly it ("" names no single account, and no URI SAN then matches). `bound_by_name` says
    the workload the node binds to is the one its id names (not one found at its IP): a DNS SAN
    names one workload, so it proves nothing about another one at that IP.
    """
    if not peer.has_certificate:
        return "no client certificate (the server requires one signed by its --client-ca)"
    workload = f"{node.name}.{node.namespace}"
    for uri in peer.uris:
        identity = parse_spiffe_id(uri)
        if identity is None or identity.namespace != node.namespace:
            continue
        if service_account and identity.service_account == service_account:
            return None
    dns_match = any(not d.startswith("*") and d.lower() == workload.lower() for d in peer.dns)
    if dns_match and bound_by_name:
        return None
    if dns_match:
        return (
            f"the client certificate ({peer.describe()}) names workload {workload}, but the mesh has no "
            f"workload {untrusted(node.name)} in namespace {untrusted(node.namespace)}: the node would bind "
            f"to another workload at {untrusted(node.ip)}"
        )
    sa = service_account or "SERVICE_ACCOUNT"
    return (
        f"the client certificate ({peer.describe()}) does not name workload {untrusted(workload)}: "
        f"expected URI SAN spiffe://TRUST_DOMAIN/ns/{node.namespace}/sa/{sa} or DNS SAN {workload}"
    )


@dataclass(frozen=True, slots=True)
class BoundWorkload:
    """The workload an attested node binds to, as the identity rule sees it."""

    #: `namespace/name` (or a nameless registry endpoint's address), as `Proxy.workload`
    key: str
    #: its name: the node's own when it was found by the name in the node id
    name: str
    #: the one service account the mesh says it runs as; "" when its endpoints disagree
    service_account: str
    #: the accounts its registry endpoints name, when they disagree (for the refusal)
    disputed: tuple[str, ...] = ()


def bound_workload(node: ProxyNode, snapshot: Snapshot) -> BoundWorkload | None:
    """The workload `node` binds to once attested (see `bind_proxy`: its own namespace only, and
    instances of that workload only), or None when the mesh has none for it."""
    proxy = bind_proxy(replace(node, attested=True, workload="", service_account=""), snapshot)
    if not proxy.workload:
        return None
    _, _, name = proxy.workload.partition("/")
    disputed: tuple[str, ...] = ()
    if not proxy.service_account:
        disputed = tuple(sorted({i.endpoint.service_account or "default" for i in proxy.instances}))
    return BoundWorkload(proxy.workload, name, proxy.service_account, disputed)


def workload_service_account(node: ProxyNode, snapshot: Snapshot) -> str:
    """The service account the mesh says `node`'s workload runs as once attested ("" for none)."""
    workload = bound_workload(node, snapshot)
    return workload.service_account if workload is not None else ""


def authorize_node(node: ProxyNode, peer: PeerIdentity, snapshot: Snapshot | None) -> ProxyNode | str:
    """The whole identity rule for a stream: the node as attested (bound to the workload and
    service account its certificate proved, which later snapshots must keep: `bind_proxy`),
    else the reason to refuse it. The workload must exist in the mesh (a certificate for a
    workload that does not exist would otherwise bind, by the node's IP, to whatever workload
    has it) and run as one service account."""
    if not peer.has_certificate:
        return check_identity(node, peer, "") or "no client certificate"
    if snapshot is None:
        return "the server has not loaded its config yet"
    workload = bound_workload(node, snapshot)
    if workload is None:
        return (
            f"node {untrusted(node.id)} names no workload of the mesh: no WorkloadEntry "
            f"{untrusted(node.name)} in namespace {untrusted(node.namespace)}, and no WorkloadEntry or "
            f"registry endpoint of that namespace at {untrusted(node.ip)}"
        )
    if not workload.service_account:
        return (
            f"node {untrusted(node.id)} binds to endpoints at {untrusted(node.ip)} that run as several service "
            f"accounts ({', '.join(workload.disputed)}): no one certificate proves them"
        )
    refusal = check_identity(node, peer, workload.service_account, bound_by_name=workload.name == node.name)
    if refusal is not None:
        return refusal
    return replace(node, attested=True, workload=workload.key, service_account=workload.service_account)


def identity_authorizer(snapshot: Callable[[], Snapshot | None]) -> Authorizer:
    """The `AdsServicer` hook enforcing the identity rule against the current snapshot."""

    def authorize(node: ProxyNode, context: grpc.aio.ServicerContext[Any, Any]) -> ProxyNode | str:
        return authorize_node(node, PeerIdentity.from_auth_context(context.auth_context()), snapshot())

    return authorize


# -- the admin bearer token ----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable only from this host (names other than localhost
    could resolve anywhere, so they count as beyond loopback)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BearerToken:
    """A bearer token kept in a file: read at start (CredentialError when missing or empty) and
    again when the file changes, so it can be rotated without a restart. A rotation that leaves
    the file unreadable or empty keeps the last good token, and says so in the log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self._token = self._read()

    def _stat(self) -> tuple[int, int, int]:
        try:
            s = os.stat(self.path)
        except OSError as exc:
            raise CredentialError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        return (s.st_ino, s.st_mtime_ns, s.st_size)

    def _read(self) -> bytes:
        token = _read(self.path).strip()
        if not token:
            raise CredentialError(f"{self.path} is empty: it must hold the admin bearer token")
        if any(c <= 0x20 or c >= 0x7F for c in token):
            raise CredentialError(f"{self.path}: the token must be one line of printable ASCII without spaces")
        return token

    def _current(self) -> bytes:
        try:
            stamp = self._stat()
            if stamp != self._stamp:
                self._token, self._stamp = self._read(), stamp
                logger.info("admin token file %s changed; using the new token", self.path)
        except CredentialError as exc:
            logger.warning("keeping the current admin token: %s", exc)
        return self._token

    def verify(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries the token (constant-time compare)."""
        if not authorization:
            return False
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credentials.strip().encode("latin-1", "replace"), self._current())
