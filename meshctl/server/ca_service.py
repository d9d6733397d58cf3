"""Istio's certificate service on the xDS port: a VM renews its own xDS client certificate.

`istio.v1.auth.IstioCertificateService/CreateCertificate` takes a certificate signing request
(PEM) and answers the signed chain, as istiod answers Istio's agents. Here the caller is a VM's
`meshctl ca renew`: its key is made on the VM and never travels, and the certificate it presents
on the TLS connection is the whole of its claim. The rule, in order:

- the connection carries a client certificate (the port has `--client-ca`), and that
  certificate is valid now: gRPC checked it when the connection was made, and a connection kept
  open past the certificate's end must not renew it;
- the mesh CA is one the xDS port trusts (its root is in `--client-ca`): otherwise the renewed
  certificate would lock the VM out at its next connection;
- the certificate names one workload by a DNS SAN `NAME.NAMESPACE` (as `meshctl ca issue --proxy`
  makes them), and that workload passes the very identity rule an ADS stream does
  (`meshctl.server.auth.authorize_node`): the mesh has it, and any SPIFFE URI SAN names the
  account it runs as. A workload taken out of the mesh therefore stops renewing;
- the request asks for no name beyond those, and is signed by its own key.

A VM's first certificate comes the same way for a join token instead (`meshctl ca token`,
`meshctl.security.join_token`), on a port of its own (`--join-address`): TLS with the server's
certificate and no client certificate asked for, since the VM has none yet; the xDS port keeps
requiring one. There the token proves the workload (which the mesh must have), the certificate
names it and the SPIFFE id of the account the mesh says it runs as, and the token is spent.

What is signed names exactly what was proved (the DNS SAN and the SPIFFE URIs the rule accepted;
the request's other fields are not read), for the server's workload certificate lifetime
(`--workload-cert-lifetime`; a request may ask for less, never more). The service never touches
the resource cache: it reads the current snapshot and the CA, and answers.

The handlers are generic gRPC handlers over the generated messages, as ADS's are, so no
generated gRPC stubs are needed (they pin the gRPC runtime to the generator's version).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from meshctl.api.security.v1alpha1 import ca_pb2
from meshctl.config.validation.common import is_dns_label
from meshctl.errors import CredentialError
from meshctl.logs import untrusted
from meshctl.security import join_token
from meshctl.security.ca import MIN_WORKLOAD_LIFETIME, CertificateAuthority
from meshctl.security.files import read_credential
from meshctl.security.join_token import JoinToken
from meshctl.server.auth import PeerIdentity, XdsTls, authorize_node, bound_workload, parse_spiffe_id
from meshctl.server.ca_follower import CaHolder
from meshctl.snapshot.model import Snapshot, spec
from meshctl.snapshot.node import ProxyNode, ProxyType

logger = logging.getLogger("meshctl.server.ca")

SERVICE: Final = "istio.v1.auth.IstioCertificateService"
METHOD: Final = f"/{SERVICE}/CreateCertificate"
#: The most of a signing request read: a CSR is a few hundred bytes.
MAX_CSR_BYTES: Final = 16 * 1024


class Refusal(Exception):
    """Why a request is not signed, with the gRPC status it is answered with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ProvenIdentity:
    """What a client certificate proved: one workload, and the names that say so."""

    workload: str
    service_account: str
    dns_names: tuple[str, ...]
    uris: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.dns_names, *self.uris)


def proven_identity(peer: PeerIdentity, snapshot: Snapshot) -> ProvenIdentity:
    """The workload `peer`'s certificate proves in `snapshot`, and the names of it the identity
    rule accepts (see the module docstring); raises Refusal (PERMISSION_DENIED) otherwise."""
    workloads = sorted({d.lower() for d in peer.dns if _workload_name(d)})
    if len(workloads) != 1:
        what = "no" if not workloads else f"{len(workloads)} ({', '.join(workloads)})"
        raise Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the client certificate ({peer.describe()}) names {what} workload by a DNS SAN NAME.NAMESPACE: "
            "only certificates naming one workload, as `meshctl ca issue --proxy` makes them, are renewed",
        )
    name, _, namespace = workloads[0].partition(".")
    node = _workload_node(name, namespace, snapshot, "the client certificate")
    outcome = authorize_node(node, peer, snapshot)
    if isinstance(outcome, str):
        raise Refusal(grpc.StatusCode.PERMISSION_DENIED, outcome)
    uris = []
    for uri in peer.uris:
        identity = parse_spiffe_id(uri)
        if identity is not None and (identity.namespace, identity.service_account) == (
            namespace,
            outcome.service_account,
        ):
            uris.append(uri)
    dns = tuple(d for d in peer.dns if d.lower() == workloads[0])[:1]
    return ProvenIdentity(outcome.workload, outcome.service_account, dns, tuple(uris))


def _workload_node(name: str, namespace: str, snapshot: Snapshot, what: str) -> ProxyNode:
    """The node of the WorkloadEntry `name` in `namespace`, as its proxy would connect (by name,
    at its address); raises Refusal when the mesh has no such entry."""
    entry = snapshot.get("WorkloadEntry", namespace, name)
    if entry is None:
        raise Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{what} names workload {untrusted(name)}.{untrusted(namespace)}, and the mesh has no "
            f"WorkloadEntry {untrusted(name)} in namespace {untrusted(namespace)}",
        )
    address = str(spec(entry).address) or "0.0.0.0"
    return ProxyNode(
        id=f"sidecar~{address}~{name}.{namespace}~{namespace}.svc.cluster.local",
        type=ProxyType.SIDECAR,
        ip=address,
        name=name,
        namespace=namespace,
        domain=f"{namespace}.svc.cluster.local",
    )


def token_identity(token: JoinToken, snapshot: Snapshot, trust_domain: str) -> ProvenIdentity:
    """What a join token proves: its workload, which the mesh must have, as the workload's DNS
    name and the SPIFFE id of the account the mesh says it runs as."""
    node = _workload_node(token.name, token.namespace, snapshot, "the join token")
    workload = bound_workload(node, snapshot)
    if workload is None or not workload.service_account:
        raise Refusal(grpc.StatusCode.PERMISSION_DENIED, f"workload {token.workload} runs as no one service account")
    uri = f"spiffe://{trust_domain}/ns/{token.namespace}/sa/{workload.service_account}"
    return ProvenIdentity(workload.key, workload.service_account, (token.workload,), (uri,))


def _workload_name(dns: str) -> bool:
    name, dot, namespace = dns.partition(".")
    return bool(dot) and is_dns_label(name.lower()) and is_dns_label(namespace.lower())


class CertificateService:
    """The servicer: `handlers()` goes beside ADS on the xDS server (`Server.start`)."""

    def __init__(
        self,
        ca: CertificateAuthority | CaHolder,
        snapshot: Callable[[], Snapshot | None],
        lifetime: datetime.timedelta,
        client_ca_file: Path | None,
        *,
        state_dir: Path | None = None,
        trust_domain: Callable[[], str] = lambda: "cluster.local",
    ) -> None:
        #: The CA in force, read at each request: one replaced while serving signs the next.
        self._holder = ca if isinstance(ca, CaHolder) else CaHolder(ca)
        self._snapshot = snapshot
        self._lifetime = lifetime
        self._client_ca_file = client_ca_file
        self._state_dir = state_dir
        self._trust_domain = trust_domain

    def join_handlers(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The same service for the join port: the caller proves itself by a join token
        (`authorization: Bearer TOKEN` metadata), not by a client certificate."""
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "CreateCertificate": grpc.unary_unary_rpc_method_handler(
                    self.exchange_token,
                    request_deserializer=ca_pb2.IstioCertificateRequest.FromString,
                    response_serializer=ca_pb2.IstioCertificateResponse.SerializeToString,
                )
            },
        )

    async def exchange_token(
        self, request: ca_pb2.IstioCertificateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ca_pb2.IstioCertificateResponse:
        metadata = dict(context.invocation_metadata() or ())
        scheme, _, token = str(metadata.get("authorization", "")).partition(" ")
        try:
            if scheme.lower() != "bearer" or not token:
                raise Refusal(grpc.StatusCode.UNAUTHENTICATED, "no join token (authorization: Bearer TOKEN)")
            # Off the event loop: spending a token writes (and syncs) a file.
            sign = self.sign_joining
            return await asyncio.get_running_loop().run_in_executor(None, sign, request, token, context.peer())
        except Refusal as refusal:
            logger.warning("refused a join from %s: %s", untrusted(context.peer()), refusal)
            await context.abort(refusal.code, str(refusal))
            raise

    def sign_joining(
        self, request: ca_pb2.IstioCertificateRequest, token: str, peer: str = "", now: datetime.datetime | None = None
    ) -> ca_pb2.IstioCertificateResponse:
        """A workload's first certificate for a join token (the module docstring of
        `meshctl.security.join_token`); raises Refusal. The token is spent only once everything
        else has passed."""
        at = now or datetime.datetime.now(datetime.UTC)
        try:
            # The key of the CA in force: tokens minted for a CA that was replaced are void.
            claims = join_token.verify(self._holder.current.derive_key(join_token.PURPOSE), token, at)
        except join_token.TokenRefused as exc:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
        snapshot = self._snapshot()
        if snapshot is None:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "the server has not loaded its config yet")
        identity = token_identity(claims, snapshot, self._trust_domain())
        public_key = _verified_request(request.csr, identity, "the join token")
        if self._state_dir is None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, "join tokens need a state directory to record their use")
        try:
            join_token.use(self._state_dir, claims, at)
        except join_token.TokenRefused as exc:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from None
        except CredentialError as exc:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        return self._signed(
            public_key, identity, self._requested_lifetime(request), at, peer=peer, why="for a join token"
        )

    def handlers(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "CreateCertificate": grpc.unary_unary_rpc_method_handler(
                    self.create_certificate,
                    request_deserializer=ca_pb2.IstioCertificateRequest.FromString,
                    response_serializer=ca_pb2.IstioCertificateResponse.SerializeToString,
                )
            },
        )

    async def create_certificate(
        self, request: ca_pb2.IstioCertificateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ca_pb2.IstioCertificateResponse:
        auth, peer = context.auth_context(), context.peer()
        try:
            # Off the event loop: a signature, and file reads, must not hold up the xDS streams.
            return await asyncio.get_running_loop().run_in_executor(None, self.sign, request, auth, peer)
        except Refusal as refusal:
            logger.warning("refused a certificate request from %s: %s", untrusted(context.peer()), refusal)
            await context.abort(refusal.code, str(refusal))
            raise  # abort raises; this line is for the type checker

    def sign(
        self,
        request: ca_pb2.IstioCertificateRequest,
        auth: Any,
        peer: str = "",
        now: datetime.datetime | None = None,
    ) -> ca_pb2.IstioCertificateResponse:
        """The whole rule (module docstring) for one request; raises Refusal."""
        at = now or datetime.datetime.now(datetime.UTC)
        presented = b"".join(auth.get("x509_pem_cert", ()))
        if not presented:
            raise Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "a certificate is renewed only over a connection with the client certificate it renews "
                "(meshctl serve needs --client-ca)",
            )
        current = x509.load_pem_x509_certificate(presented)
        if not current.not_valid_before_utc <= at < current.not_valid_after_utc:
            raise Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate is not valid now (valid {current.not_valid_before_utc.isoformat()} to "
                f"{current.not_valid_after_utc.isoformat()})",
            )
        self._check_trusted()
        snapshot = self._snapshot()
        if snapshot is None:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "the server has not loaded its config yet")
        identity = proven_identity(PeerIdentity.from_auth_context(auth), snapshot)
        public_key = _verified_request(request.csr, identity)
        return self._signed(public_key, identity, self._requested_lifetime(request), at, peer=peer, why="to renew")

    def _requested_lifetime(self, request: ca_pb2.IstioCertificateRequest) -> datetime.timedelta:
        """The server's lifetime, or less when asked (never below what renewal can serve)."""
        if request.validity_duration < 0:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "validity_duration must not be negative")
        if not request.validity_duration:
            return self._lifetime
        asked = datetime.timedelta(seconds=request.validity_duration)
        return max(MIN_WORKLOAD_LIFETIME, min(self._lifetime, asked))

    def _signed(
        self,
        public_key: Any,
        identity: ProvenIdentity,
        lifetime: datetime.timedelta,
        at: datetime.datetime,
        *,
        peer: str,
        why: str,
    ) -> ca_pb2.IstioCertificateResponse:
        try:
            issued = self._holder.current.sign_client(public_key, identity.dns_names, identity.uris, lifetime, at)
        except CredentialError as exc:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        logger.info(
            "signed the xDS client certificate of workload %s (%s) %s, for %s, valid until %s",
            identity.workload,
            ", ".join(identity.names),
            why,
            untrusted(peer) or "a client",
            issued.not_after.isoformat(),
        )
        chain = x509.load_pem_x509_certificates(issued.cert_chain_pem)
        return ca_pb2.IstioCertificateResponse(
            cert_chain=[c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in chain]
        )

    def _check_trusted(self) -> None:
        """Refuse unless the xDS port trusts the mesh CA's root: a certificate it signed would
        otherwise be refused at the VM's next connection, after its working one was replaced."""
        if self._client_ca_file is None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, "meshctl serve has no --client-ca")
        try:
            trusted = x509.load_pem_x509_certificates(read_credential(self._client_ca_file))
        except (OSError, ValueError, CredentialError) as exc:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE, f"cannot read --client-ca {self._client_ca_file}: {exc}"
            ) from None
        # The root its chain ends at, not any root of the bundle: while a new root is rolled out,
        # a certificate from the new one must not be signed before the port trusts it.
        ca = self._holder.current
        if ca.chain[-1] not in trusted:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the mesh CA ({ca.source}) is not trusted by --client-ca {self._client_ca_file}: a certificate "
                f"it signs would not be accepted on this port (add its root, {ca.signing_root_fingerprint})",
            )


def _verified_request(csr_pem: str, identity: ProvenIdentity, prover: str = "the client certificate") -> Any:
    """The public key of a well-formed, self-signed request asking for no name beyond
    `identity`'s; raises Refusal."""
    if not csr_pem or len(csr_pem) > MAX_CSR_BYTES:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "csr must be one PEM certificate signing request")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode("ascii", "replace"))
        signed = csr.is_signature_valid
        key = csr.public_key()
    except (ValueError, TypeError) as exc:
        raise Refusal(
            grpc.StatusCode.INVALID_ARGUMENT, f"csr is not a PEM certificate signing request: {exc}"
        ) from None
    if not signed:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "csr is not signed by the key it carries")
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "csr's key must be ECDSA, RSA or Ed25519")
    asked = _requested_names(csr)
    allowed = {n.lower() for n in identity.dns_names} | set(identity.uris)
    extra = [n for n in asked if n.lower() not in allowed and n not in allowed]
    if extra:
        raise Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"csr asks for {', '.join(untrusted(n) for n in extra)}, which {prover} does not prove "
            f"(it proves {', '.join(identity.names)})",
        )
    return key


def _requested_names(csr: x509.CertificateSigningRequest) -> Sequence[str]:
    try:
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return [str(name.value) for name in sans]


async def serve_joins(
    address: tuple[str, int], tls: XdsTls, service: CertificateService
) -> tuple[grpc.aio.Server, int]:
    """The join port: TLS with the server's certificate and no client certificate asked for,
    answering only the certificate service, and only for join tokens (`--join-address`)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((service.join_handlers(),))
    host, port = address
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_secure_port(listen, tls.server_credentials())
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for join tokens on {host}:{port}")
    await server.start()
    logger.info("exchanging join tokens for first certificates on %s:%d", host, bound)
    return server, bound
