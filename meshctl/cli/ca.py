"""`meshctl ca`: the mesh CA's root for clients to trust, and certificates for VMs and the xDS server.

Both commands find the CA as `meshctl serve` does: the plug-in CA of `--ca-dir` (Istio's cacerts
layout) when given, else meshctl's own root under `--state-dir`, made there on first use. Run them
on the host where serve keeps its state, so they sign with the very CA serve trusts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl.cli.exits import reported

if TYPE_CHECKING:
    from datetime import timedelta

    from meshctl.security.ca import CertificateAuthority, IssuedCertificate

DEFAULT_STATE_DIR = Path("/var/lib/meshctl")
DEFAULT_TRUST_DOMAIN = "cluster.local"

CaDirOption = Annotated[
    Path | None,
    typer.Option(
        metavar="PATH",
        show_default=False,
        help="A plug-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem); "
        "used instead of the state directory's root when given.",
        envvar="MESHCTL_CA_DIR",
    ),
]
StateDirOption = Annotated[
    Path,
    typer.Option(
        metavar="PATH",
        help="meshctl's state directory; its ca/ holds meshctl's own root CA, made on first use.",
        envvar="MESHCTL_STATE_DIR",
    ),
]
TrustDomainOption = Annotated[
    str,
    typer.Option(metavar="DOMAIN", help="The mesh's trust domain, in SPIFFE ids.", envvar="MESHCTL_TRUST_DOMAIN"),
]


@reported
def root(
    ca_dir: CaDirOption = None,
    state_dir: StateDirOption = DEFAULT_STATE_DIR,
    trust_domain: TrustDomainOption = DEFAULT_TRUST_DOMAIN,
) -> None:
    """Print the mesh's root certificates (PEM): what a client outside the mesh trusts to reach it.

    Without --ca-dir and with no root in the state directory yet, one is made there, as the
    first `meshctl serve` would.
    """
    authority = _authority(ca_dir, state_dir, trust_domain)
    typer.echo(authority.root_pem, nl=False)


@reported
def issue(
    proxy: Annotated[
        str | None,
        typer.Option(
            metavar="NAME.NAMESPACE",
            show_default=False,
            help="Issue the xDS client certificate of this VM proxy: a DNS SAN NAME.NAMESPACE and the SPIFFE id "
            "of its namespace and --service-account, the names meshctl serve --client-ca accepts.",
        ),
    ] = None,
    server: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST",
            show_default=False,
            help="Issue meshctl serve's xDS serving certificate for this DNS name or IP address (what proxies "
            "dial: --xds-address's host); repeatable.",
        ),
    ] = None,
    service_account: Annotated[
        str, typer.Option(metavar="NAME", help="The service account of --proxy's workload.")
    ] = "default",
    out: Annotated[
        Path,
        typer.Option(metavar="PATH", help="Directory to write cert-chain.pem, key.pem (0600) and root-cert.pem to."),
    ] = Path(),
    lifetime: Annotated[
        str,
        typer.Option(metavar="DURATION", help="How long the certificate is valid: 24h, 90m, 720h."),
    ] = "720h",
    force: Annotated[bool, typer.Option("--force", help="Replace files that already exist in --out.")] = False,
    ca_dir: CaDirOption = None,
    state_dir: StateDirOption = DEFAULT_STATE_DIR,
    trust_domain: TrustDomainOption = DEFAULT_TRUST_DOMAIN,
) -> None:
    """Issue a certificate signed by the mesh CA, with its key and the root to trust, into --out:
    a VM proxy's xDS client certificate (--proxy) or meshctl serve's own (--server).

    The files are those `meshctl bootstrap --xds-cert/--xds-key/--xds-ca` and `meshctl serve
    --tls-cert/--tls-key/--client-ca` read. Existing files are kept unless --force is given.
    """
    from meshctl.errors import UsageError

    if (proxy is None) == (not server):
        raise UsageError("give exactly one of --proxy NAME.NAMESPACE or --server HOST")
    valid_for = _lifetime(lifetime)
    files = {name: out / name for name in ("cert-chain.pem", "key.pem", "root-cert.pem")}
    if not force and (existing := [str(p) for p in files.values() if p.exists()]):
        raise UsageError(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; --force replaces")
    if proxy is not None:
        name, namespace = _proxy_name(proxy)
        from meshctl.security.identity import WorkloadIdentity

        identity = WorkloadIdentity(trust_domain, namespace, service_account)
        authority = _authority(ca_dir, state_dir, trust_domain)
        issued = authority.issue_client([f"{name}.{namespace}"], identity, valid_for)
        names = f"{name}.{namespace} and {identity.uri}"
    else:
        dns, ips = _server_names(server or [])
        authority = _authority(ca_dir, state_dir, trust_domain)
        issued = authority.issue_server(dns, ips, valid_for)
        names = ", ".join([*dns, *ips])
    _write(files, issued, authority.root_pem, force=force)
    if proxy is not None:
        _write_sds_file(out)
    typer.echo(
        f"wrote {', '.join(str(p) for p in files.values())}: {names}, valid until "
        f"{issued.not_after.isoformat()} (renew after {issued.renew_at.isoformat(timespec='seconds')})",
        err=True,
    )


@reported
def renew(
    server: Annotated[
        str,
        typer.Option(metavar="HOST:PORT", help="meshctl serve's xDS address, where its certificate service answers."),
    ],
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            metavar="PATH",
            help="The directory `meshctl ca issue --proxy` wrote: cert-chain.pem, key.pem and root-cert.pem "
            "(with --token: where to make them).",
        ),
    ],
    token: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            show_default=False,
            help="Get the first certificate for this join token (meshctl ca token) from serve's --join-address "
            "(given as --server), instead of renewing one; needs --root.",
        ),
    ] = None,
    root: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            show_default=False,
            help="With --token: the mesh's root (meshctl ca root) to check the server with; copied to --dir.",
        ),
    ] = None,
    proxy: Annotated[
        str | None,
        typer.Option(
            metavar="NAME.NAMESPACE",
            show_default=False,
            help="With --token: the workload this VM is; a token for another one is refused. Default: the token's.",
        ),
    ] = None,
    sni: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            show_default=False,
            help="The name meshctl's certificate must carry (default: the --server host), as bootstrap's --xds-sni.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Renew now, even before two thirds of its life.")] = False,
    group: Annotated[
        str | None,
        typer.Option(
            metavar="GROUP",
            show_default=False,
            help="Make the new key.pem readable by this group (mode 0640), e.g. the group Envoy's unit is given "
            "with SupplementaryGroups=; default: its owner only.",
        ),
    ] = None,
) -> None:
    """Renew this VM's xDS client certificate from meshctl serve, with a key made here.

    It is due at two thirds of its validity; before that nothing is done (exit 0), so a timer
    may run it often. The server signs exactly the workload the current certificate proves.
    """
    import datetime

    from meshctl.bootstrap import xds_client_sds_file
    from meshctl.errors import UsageError
    from meshctl.security.renewal import read_current
    from meshctl.security.renewal import renew as renew_certificate
    from meshctl.server.settings import split_address

    try:
        split_address(server)
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from None
    gid = None
    if group is not None:
        import grp

        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise UsageError(f"--group {group!r}: no such group") from None
    if token is not None:
        _join(directory, server, token, root, proxy, sni, gid)
        return
    if root is not None or proxy is not None:
        raise UsageError("--root and --proxy go with --token")
    current = read_current(directory)
    now = datetime.datetime.now(datetime.UTC)
    if not force and now < current.due_at:
        typer.echo(
            f"{directory / 'cert-chain.pem'} ({current.describe()}) is not due: valid until "
            f"{current.not_after.isoformat()}, renewed from {current.due_at.isoformat(timespec='seconds')}",
            err=True,
        )
        return
    renewed = renew_certificate(directory, server, server_name=sni, sds_file=xds_client_sds_file, group=gid)
    typer.echo(
        f"renewed {directory / 'cert-chain.pem'}: {renewed.names}, valid until {renewed.not_after.isoformat()}",
        err=True,
    )


def _join(
    directory: Path,
    server: str,
    token_file: Path,
    root: Path | None,
    proxy: str | None,
    sni: str | None,
    gid: int | None,
) -> None:
    from meshctl.bootstrap import xds_client_sds_file
    from meshctl.errors import CredentialError, UsageError
    from meshctl.security.files import read_credential
    from meshctl.security.renewal import join, token_workload

    if root is None:
        raise UsageError("--token needs --root FILE, the mesh's root to check the server with (meshctl ca root)")
    try:
        token, root_pem = read_credential(token_file).decode("ascii", "replace"), read_credential(root)
    except OSError as exc:
        raise CredentialError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    workload = token_workload(token)
    if proxy is not None:
        name, namespace = _proxy_name(proxy, "--proxy")
        workload = f"{name}.{namespace}"
    joined = join(
        directory, server, token, root_pem, workload, server_name=sni, sds_file=xds_client_sds_file, group=gid
    )
    typer.echo(
        f"joined as {joined.names}: wrote {directory / 'cert-chain.pem'}, valid until {joined.not_after.isoformat()}",
        err=True,
    )


@reported
def token(
    proxy: Annotated[
        str,
        typer.Option(
            metavar="NAME.NAMESPACE",
            help="The workload (its WorkloadEntry) whose VM may get its first xDS client certificate with the token.",
        ),
    ],
    ttl: Annotated[str, typer.Option(metavar="DURATION", help="How long the token is good: 1h, 15m.")] = "1h",
    ca_dir: CaDirOption = None,
    state_dir: StateDirOption = DEFAULT_STATE_DIR,
    trust_domain: TrustDomainOption = DEFAULT_TRUST_DOMAIN,
) -> None:
    """Print a join token: a VM exchanges it once, before it ends, for the first xDS client
    certificate of that workload (`meshctl ca renew --token FILE --root ROOT`), with a key made
    on the VM. It is MACed with a key derived from the CA's, so every server sharing the CA takes
    it; its single use is recorded in the state directory of the server that takes it.
    """
    from meshctl.security.join_token import PURPOSE, mint

    name, namespace = _proxy_name(proxy, "--proxy")
    valid_for = _lifetime(ttl, "--ttl")
    authority = _authority(ca_dir, state_dir, trust_domain)
    typer.echo(mint(authority.derive_key(PURPOSE), f"{name}.{namespace}", valid_for))
    typer.echo(f"a join token for {name}.{namespace}, good once for {ttl}", err=True)


def _authority(ca_dir: Path | None, state_dir: Path, trust_domain: str) -> CertificateAuthority:
    from meshctl.security.ca import CertificateAuthority

    if ca_dir is not None:
        return CertificateAuthority.from_ca_dir(ca_dir)
    authority = CertificateAuthority.self_signed(state_dir, trust_domain)
    if authority.created:
        typer.echo(f"made a new root CA in {state_dir / 'ca'} (trust domain {trust_domain})", err=True)
    return authority


def _lifetime(text: str, flag: str = "--lifetime") -> timedelta:
    """A Go duration (`24h`, `90m`, `720h`) as a timedelta; UsageError unless it is positive."""
    from datetime import timedelta

    from meshctl.config.schema import parse_duration
    from meshctl.errors import UsageError
    from meshctl.security.selfsigned import ROOT_LIFETIME

    nanos = parse_duration(text)
    if nanos is None or nanos <= 0:
        raise UsageError(f"{flag} {text!r} is not a positive duration (e.g. 24h, 90m, 720h)")
    # Nothing outlives the CA (a self-signed root lives ten years): longer is a typo, and
    # past timedelta's range it would not even be a date.
    if nanos // 1000 > ROOT_LIFETIME // timedelta(microseconds=1):
        raise UsageError(f"{flag} {text!r} is longer than the CA lives ({ROOT_LIFETIME.days} days)")
    return timedelta(microseconds=nanos // 1000)


def _proxy_name(proxy: str, flag: str = "--proxy") -> tuple[str, str]:
    """NAME and NAMESPACE of `--proxy`, each a DNS label, as in the proxy's node id."""
    from meshctl.config.validation.common import is_dns_label
    from meshctl.errors import UsageError

    name, _, namespace = proxy.partition(".")
    if not is_dns_label(name) or not is_dns_label(namespace):
        raise UsageError(
            f"{flag} {proxy!r} is not NAME.NAMESPACE (e.g. reviews-v1-vm.bookinfo), the workload part of the node id"
        )
    return name, namespace


def _server_names(hosts: list[str]) -> tuple[list[str], list[str]]:
    """The DNS names and the IP addresses among `--server` values."""
    from meshctl.config.hosts import is_ip
    from meshctl.config.validation.common import fqdn_problem
    from meshctl.errors import UsageError

    dns, ips = [], []
    for host in hosts:
        if is_ip(host):
            ips.append(host)
        elif fqdn_problem(host) is None:
            dns.append(host.rstrip("."))
        else:
            raise UsageError(f"--server {host!r} is neither a DNS name nor an IP address")
    return dns, ips


def _write(files: dict[str, Path], issued: IssuedCertificate, root_pem: bytes, *, force: bool) -> None:
    """The three files, each written whole; the key readable by its owner only."""
    from meshctl.errors import CredentialError, UsageError
    from meshctl.security.files import PRIVATE_MODE, PUBLIC_MODE, write_atomically

    contents = {
        "key.pem": (issued.private_key_pem, PRIVATE_MODE),
        "cert-chain.pem": (issued.cert_chain_pem, PUBLIC_MODE),
        "root-cert.pem": (root_pem, PUBLIC_MODE),
    }
    directory = next(iter(files.values())).parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CredentialError(f"{directory}: cannot make the directory: {exc.strerror or exc}") from None
    for name, (data, mode) in contents.items():
        try:
            write_atomically(files[name], data, mode=mode, replace=force)
        except FileExistsError:
            raise UsageError(f"{files[name]} already exists; --force replaces") from None
        except OSError as exc:
            raise CredentialError(f"{files[name]}: cannot write it: {exc.strerror or exc}") from None


def _write_sds_file(directory: Path) -> None:
    """The SDS file `meshctl bootstrap --xds-cert-dir` has Envoy read the pair through."""
    from meshctl.bootstrap import xds_client_sds_file
    from meshctl.errors import CredentialError
    from meshctl.security.files import PUBLIC_MODE, write_atomically
    from meshctl.security.renewal import SDS_FILE

    try:
        (directory / SDS_FILE).parent.mkdir(mode=0o755, exist_ok=True)
        write_atomically(directory / SDS_FILE, xds_client_sds_file(directory), mode=PUBLIC_MODE)
    except OSError as exc:
        raise CredentialError(f"{directory / SDS_FILE}: cannot write it: {exc.strerror or exc}") from None
