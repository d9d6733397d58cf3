"""`meshctl serve`: the control plane that runs under systemd on the VM fleet's control hosts."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl.cli.exits import reported
from meshctl.logs import LogFormat, LogLevel

if TYPE_CHECKING:
    from meshctl.server.rollout_plan import RolloutSettings


@reported
def serve(
    config_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--config-dir",
            "-c",
            envvar="MESHCTL_CONFIG_DIR",
            help="Directory of Istio YAML to serve; repeatable (colon-separated in the environment).",
        ),
    ] = None,
    config_consul_kv: Annotated[
        str | None,
        typer.Option(
            envvar="MESHCTL_CONFIG_CONSUL_KV",
            metavar="PREFIX",
            help="Serve the Istio YAML kept under this Consul KV prefix instead of --config-dir, one key a "
            "file (meshctl kv push writes it); Consul from --consul and its flags, else CONSUL_HTTP_ADDR.",
        ),
    ] = None,
    xds_address: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_XDS_ADDRESS", help="Where proxies connect for ADS (HOST:PORT; port 0 picks a free one)."
        ),
    ] = "127.0.0.1:15010",
    admin_address: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_ADMIN_ADDRESS",
            help="Readiness, metrics and debug pages (HOST:PORT; port 0 picks a free one).",
        ),
    ] = "127.0.0.1:15014",
    consul: Annotated[
        str | None,
        typer.Option(
            envvar="MESHCTL_CONSUL",
            help="Also read services from Consul at this address (http(s)://host:port or host:port).",
        ),
    ] = None,
    consul_token: Annotated[
        str | None, typer.Option(envvar="MESHCTL_CONSUL_TOKEN", help="Consul ACL token (default: CONSUL_HTTP_TOKEN).")
    ] = None,
    consul_ca_file: Annotated[
        str | None, typer.Option(envvar="MESHCTL_CONSUL_CA_FILE", help="CA bundle for Consul over TLS.")
    ] = None,
    consul_datacenter: Annotated[
        str | None, typer.Option(envvar="MESHCTL_CONSUL_DATACENTER", help="Consul datacenter to read.")
    ] = None,
    namespace: Annotated[
        str,
        typer.Option("--namespace", "-n", envvar="MESHCTL_NAMESPACE", help="Namespace of resources that name none."),
    ] = "default",
    debounce: Annotated[
        float, typer.Option(envvar="MESHCTL_DEBOUNCE", help="Seconds of quiet before a change is pushed.")
    ] = 0.1,
    debounce_max: Annotated[
        float, typer.Option(envvar="MESHCTL_DEBOUNCE_MAX", help="Longest a change waits for quiet, in seconds.")
    ] = 10.0,
    resync_period: Annotated[
        float,
        typer.Option(
            envvar="MESHCTL_RESYNC_PERIOD",
            help="Seconds between full passes over the config directories, which catch a change no file"
            " event told of (0: only at start, on SIGHUP and when events were lost).",
        ),
    ] = 300.0,
    log_level: Annotated[
        LogLevel,
        typer.Option(envvar="MESHCTL_LOG_LEVEL", case_sensitive=False, help="The least severe log records shown."),
    ] = "info",
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar="MESHCTL_LOG_FORMAT",
            help="text for people (no timestamps under journald, which adds its own), json for log shippers.",
        ),
    ] = "text",
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_TLS_CERT",
            help="Serve xDS over TLS with this PEM certificate chain (needs --tls-key); re-read when it changes.",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(envvar="MESHCTL_TLS_KEY", help="The unencrypted PEM private key of --tls-cert.")
    ] = None,
    client_ca: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_CLIENT_CA",
            help="Require every proxy to present a certificate signed by this PEM CA that names the "
            "workload of its node id (the identity rule above). Needs --tls-cert.",
        ),
    ] = None,
    join_address: Annotated[
        str | None,
        typer.Option(
            envvar="MESHCTL_JOIN_ADDRESS",
            metavar="HOST:PORT",
            show_default=False,
            help="Exchange join tokens (meshctl ca token) for a VM's first xDS client certificate here: TLS with "
            "--tls-cert and no client certificate asked for. Needs --client-ca. Default: no join port.",
        ),
    ] = None,
    allow_unenforced_security: Annotated[
        bool,
        typer.Option(
            "--allow-unenforced-security",
            envvar="MESHCTL_ALLOW_UNENFORCED_SECURITY",
            hidden=True,
            help="No longer needed: every security.istio.io kind is enforced. Accepted and ignored.",
        ),
    ] = False,
    ca_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_CA_DIR",
            help="Sign workload certificates with this CA: Istio's cacerts layout (ca-cert.pem, ca-key.pem, "
            "root-cert.pem, cert-chain.pem), e.g. an intermediate of your own PKI. Followed while serving: "
            "every root of root-cert.pem is trusted, a new signing certificate signs from then on.",
        ),
    ] = None,
    ca_reissue_window: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_CA_REISSUE_WINDOW",
            metavar="DURATION",
            help="When --ca-dir's signing certificate changes, reissue the workload certificates the old one "
            "signed at random times within this long (at most a third of their lifetime).",
        ),
    ] = "10m",
    state_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_STATE_DIR",
            help="Where the self-signed root CA is created on first start and reused after (without "
            "--ca-dir). Default /var/lib/meshctl; when that cannot be written and the flag is not "
            "given, workload mutual TLS is off and the log says so.",
        ),
    ] = None,
    workload_cert_lifetime: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_WORKLOAD_CERT_LIFETIME",
            metavar="DURATION",
            help="Lifetime of workload certificates (24h, 90m; at least 3s); renewed when two thirds are spent.",
        ),
    ] = "24h",
    insecure_send_keys: Annotated[
        bool,
        typer.Option(
            "--insecure-send-keys",
            envvar="MESHCTL_INSECURE_SEND_KEYS",
            help="Send workload private keys to proxies whose xDS connection did not prove their identity "
            "(no --client-ca): anyone who can reach the xDS port gets any workload's key. Only for "
            "loopback demos.",
        ),
    ] = False,
    mesh_config: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_MESH_CONFIG",
            help="Istio's MeshConfig YAML (the mesh key of istiod's ConfigMap, or the whole ConfigMap): "
            "rootNamespace, outboundTrafficPolicy, connectTimeout, trustDomain; followed for changes.",
        ),
    ] = None,
    credentials_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            envvar="MESHCTL_CREDENTIALS_DIR",
            help="TLS secrets that Gateways name by credentialName, as Kubernetes stores them "
            "(DIR/NAMESPACE/NAME/tls.crt, tls.key, ca.crt); served over SDS to proxies whose xDS "
            "connection proves their workload, of their own namespace only; followed for changes.",
        ),
    ] = None,
    health_grace: Annotated[
        float,
        typer.Option(
            "--health-grace",
            envvar="MESHCTL_HEALTH_GRACE",
            metavar="SECONDS",
            help="A health-checked workload whose Envoy has had no health stream for this long is "
            "unhealthy until it reconnects and reports again (Istio's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).",
        ),
    ] = 10.0,
    health_session_ttl: Annotated[
        float,
        typer.Option(
            "--health-session-ttl",
            envvar="MESHCTL_HEALTH_SESSION_TTL",
            metavar="SECONDS",
            help="With Consul: the TTL of the Consul session under which replicas share health and "
            "registrations; a replica that dies has its share removed after one to two TTLs. At least "
            "Consul's session_ttl_min (10s unless its agents are told otherwise).",
        ),
    ] = 10.0,
    registry_sync_timeout: Annotated[
        float,
        typer.Option(
            envvar="MESHCTL_REGISTRY_SYNC_TIMEOUT",
            metavar="SECONDS",
            help="New proxies are refused (UNAVAILABLE, Envoy retries) until Consul has synced once, so "
            "none gets a mesh without Consul's services after a restart; after this long they get what "
            "the server has, and the log says so.",
        ),
    ] = 30.0,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHCTL_ADMIN_TOKEN_FILE",
            help="The /debug admin pages then need 'Authorization: Bearer TOKEN' with the token in this "
            "file (re-read when it changes). Without it they are refused unless --admin-address is loopback.",
        ),
    ] = None,
    max_connection_age: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_MAX_CONNECTION_AGE",
            metavar="DURATION",
            help="Ask each proxy to reconnect after this long (±10%, then 10s of grace), as istiod, so that "
            "with several replicas the proxies spread back over one that returns; 0 for never.",
        ),
    ] = "30m",
    max_new_streams_per_second: Annotated[
        float,
        typer.Option(
            envvar="MESHCTL_MAX_NEW_STREAMS_PER_SECOND",
            metavar="N",
            help="Admit at most N new xDS streams a second (a second's worth may come at once); more are "
            "refused with UNAVAILABLE, which Envoy retries, so a reconnect storm is paced; 0 for no limit.",
        ),
    ] = 0.0,
    max_write_buffer_mb: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_WRITE_BUFFER_MB",
            metavar="MB",
            min=0,
            help="First responses (a proxy connecting) handed to gRPC at once, in MB: a fleet connecting "
            "together waits its turn instead of holding every first response in memory; a change's pushes to "
            "connected proxies are bounded at 8 times this; a write still going after 2s stops counting, so a "
            "proxy that stops reading holds no one up; 0 for no bound.",
        ),
    ] = 128,
    max_names_per_stream: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_NAMES_PER_STREAM",
            metavar="N",
            min=0,
            help="Names of one type (clusters, routes...) one xDS stream may subscribe to; past it the stream "
            "ends with RESOURCE_EXHAUSTED; 0 for no limit.",
        ),
    ] = 100_000,
    max_names_per_client: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_NAMES_PER_CLIENT",
            metavar="N",
            min=0,
            help="Names one client (its TLS client certificate, else its address) may subscribe to over all "
            "its streams and types; past it the stream asking ends with RESOURCE_EXHAUSTED; 0 for no limit.",
        ),
    ] = 100_000,
    max_names_total: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_NAMES_TOTAL",
            metavar="N",
            min=0,
            help="Names all xDS streams together may subscribe to; past it the stream asking ends with "
            "RESOURCE_EXHAUSTED; 0 for no limit.",
        ),
    ] = 25_000_000,
    max_streams_per_client: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_STREAMS_PER_CLIENT",
            metavar="N",
            min=0,
            help="xDS streams one client (its TLS client certificate, else its address) may have open; more "
            "are refused with RESOURCE_EXHAUSTED; 0 for no limit.",
        ),
    ] = 100,
    max_nodes_per_client: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_MAX_NODES_PER_CLIENT",
            metavar="N",
            min=0,
            help="Distinct node ids the streams of one client certificate may name at once; more are refused "
            "with RESOURCE_EXHAUSTED; 0 for no limit.",
        ),
    ] = 100,
    canary: Annotated[
        str | None,
        typer.Option(
            envvar="MESHCTL_CANARY",
            metavar="SELECTOR",
            show_default=False,
            help="Send each new config version to these proxies first: workload labels (app=reviews,track=canary, "
            "as a workloadSelector) or node ids / NAME.NAMESPACE, comma-separated. The rest get it once every "
            "canary ACKed it and --canary-soak passed without a NACK or a canary leaving (docs/safe-delivery.md).",
        ),
    ] = None,
    canary_soak: Annotated[
        str,
        typer.Option(
            envvar="MESHCTL_CANARY_SOAK",
            metavar="DURATION",
            help="How long a new version lives on every canary, ACKed, before the fleet gets it (30s, 5m).",
        ),
    ] = "60s",
    history_size: Annotated[
        int,
        typer.Option(
            envvar="MESHCTL_HISTORY_SIZE",
            metavar="N",
            min=1,
            help="Config versions the push history keeps in --state-dir (meshctl history).",
        ),
    ] = 100,
    allow_empty_mesh: Annotated[
        bool,
        typer.Option(
            "--allow-empty-mesh",
            envvar="MESHCTL_ALLOW_EMPTY_MESH",
            help="Serve a mesh with no config and no services. Without it (or a file named empty-mesh.yaml "
            "in the config directory or KV prefix) such a server is not ready and refuses proxies: an empty "
            "directory is more often a volume not mounted yet than a mesh meant to be empty.",
        ),
    ] = False,
) -> None:
    """Serve Envoy config (ADS, state of the world and delta) for the Istio YAML in --config-dir.

    Reloads on every change of the directory (and on SIGHUP), follows Consul when given, and
    keeps serving the last good config when an input breaks.

    Identity rule: with --client-ca, a proxy gets config and keys only for the workload its
    certificate names. Its node id TYPE~IP~NAME.NAMESPACE~DOMAIN is allowed when the certificate
    has a URI SAN spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT with the node's namespace
    and the service account its workload runs as (the WorkloadEntry's serviceAccount, default when
    it has none), or a DNS SAN equal to NAME.NAMESPACE. Other streams are refused with
    PERMISSION_DENIED and logged; a stream whose workload later changes (deleted, another at its
    IP) is ended, never re-bound.
    """
    import asyncio
    import os

    from meshctl.config.schema import parse_duration
    from meshctl.errors import CredentialError, UsageError
    from meshctl.kv.source import KvLocation
    from meshctl.logs import configure_logging
    from meshctl.registry.consul_http import ConsulOptions
    from meshctl.server.app import Server
    from meshctl.server.auth import XdsTls
    from meshctl.server.discovery import DebounceSettings
    from meshctl.server.limits import StreamLimits, return_large_allocations
    from meshctl.server.notify import NotifySettings
    from meshctl.server.settings import DEFAULT_STATE_DIR, ServeSettings, split_address

    config_dir = config_dir or []
    if bool(config_dir) == (config_consul_kv is not None):
        raise UsageError("give either --config-dir or --config-consul-kv (one config source)")
    configure_logging(log_level, log_format, environ=os.environ)
    followed = [p for p in (mesh_config, credentials_dir) if p is not None]
    missing = [str(p) for p in (*config_dir, *followed) if not p.exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    try:
        split_address(xds_address)
        split_address(admin_address)
    except ValueError as exc:  # the server's parser says what is wrong with the address
        raise UsageError(str(exc)) from exc
    debounce = _seconds("--debounce", debounce)
    debounce_max = _seconds("--debounce-max", debounce_max)
    resync_period = _seconds("--resync-period", resync_period)
    registry_sync_timeout = _seconds("--registry-sync-timeout", registry_sync_timeout)
    health_grace = _seconds("--health-grace", health_grace)
    health_session_ttl = _seconds("--health-session-ttl", health_session_ttl)
    if health_session_ttl <= 0:
        raise UsageError(
            "--health-session-ttl must be more than 0 seconds (Consul keeps a session without one forever)"
        )
    max_new_streams_per_second = _seconds("--max-new-streams-per-second", max_new_streams_per_second)
    debounce_settings = DebounceSettings(debounce, max(debounce, debounce_max))
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if join_address is not None and client_ca is None:
        raise UsageError("--join-address needs --client-ca: the certificates it hands out are for the xDS port")
    if join_address is not None:
        try:
            split_address(join_address)
        except ValueError as exc:
            raise UsageError(f"--join-address: {exc}") from None
    if client_ca is not None and tls_cert is None:
        raise UsageError("--client-ca needs --tls-cert and --tls-key: client certificates are checked over TLS")
    tls = XdsTls(tls_cert, tls_key, client_ca) if tls_cert is not None and tls_key is not None else None
    consul_options = (
        ConsulOptions.from_env(address=consul, token=consul_token, ca_file=consul_ca_file, datacenter=consul_datacenter)
        if consul
        else None
    )
    config_kv = (
        KvLocation(
            ConsulOptions.from_env(
                address=consul, token=consul_token, ca_file=consul_ca_file, datacenter=consul_datacenter
            ),
            config_consul_kv,
        )
        if config_consul_kv is not None
        else None
    )
    lifetime = _workload_cert_lifetime(workload_cert_lifetime)
    reissue = parse_duration(ca_reissue_window)
    if reissue is None or reissue < 0:
        raise UsageError(f"--ca-reissue-window {ca_reissue_window!r} is not a duration (10m, 30s)")
    state = state_dir if state_dir is not None else DEFAULT_STATE_DIR
    if ca_dir is None and (replica := _replica_source(config_dir, config_kv is not None)) is not None:
        _refuse_own_root(state, replica)
    rollout = _rollout(canary, canary_soak)
    if canary is not None and config_kv is None and (replica := _replica_source(config_dir, False)) is not None:
        # Replicas that share no store would each stage and hold versions on their own: a proxy
        # would get a different version on each (docs/safe-delivery.md).
        raise UsageError(
            f"--canary: {replica}: replicas that share no store cannot agree on a rollout; serve the config "
            "from Consul KV (--config-consul-kv) so they share it, or run --canary on a single server"
        )
    max_age = parse_duration(max_connection_age)
    if max_age is None or max_age < 0:
        raise UsageError(f"--max-connection-age {max_connection_age!r} is not a duration (30m, 1h; 0 for never)")
    if max_age > _MAX_CONNECTION_AGE_NANOS:
        raise UsageError(f"--max-connection-age {max_connection_age!r} is over gRPC's longest, 596h (0 for never)")
    settings = ServeSettings(
        config_dirs=tuple(config_dir),
        xds_address=xds_address,
        admin_address=admin_address,
        consul=consul_options,
        config_kv=config_kv,
        default_namespace=namespace,
        debounce=debounce_settings,
        resync_period=resync_period,
        tls=tls,
        admin_token_file=admin_token_file,
        notify=NotifySettings.from_environ(os.environ, os.getpid()),
        registry_sync_timeout=registry_sync_timeout,
        health_grace=health_grace,
        health_session_ttl=health_session_ttl,
        mesh_config=mesh_config,
        credentials_dir=credentials_dir,
        freeze_startup=True,
        ca_dir=ca_dir,
        ca_reissue_window=datetime.timedelta(microseconds=min(reissue // 1000, 10**15)),
        state_dir=state,
        state_dir_given=state_dir is not None,
        workload_cert_lifetime=lifetime,
        join_address=join_address,
        insecure_send_keys=insecure_send_keys,
        max_connection_age=max_age / 1e9 if max_age else None,
        max_new_streams_per_second=max_new_streams_per_second,
        max_write_bytes=max_write_buffer_mb * 1024 * 1024,
        limits=StreamLimits(
            max_names_per_stream=max_names_per_stream,
            max_names_per_client=max_names_per_client,
            max_names_total=max_names_total,
            max_streams_per_client=max_streams_per_client,
            max_nodes_per_client=max_nodes_per_client,
        ),
        allow_empty_mesh=allow_empty_mesh,
        rollout=rollout,
        history_size=history_size,
    )
    return_large_allocations()  # this process owns its allocator (see limits.return_large_allocations)
    try:
        asyncio.run(Server(settings).run())
    except (OSError, CredentialError) as exc:  # a busy or foreign address, unusable TLS files
        raise UsageError(f"cannot serve: {exc}") from exc


def _replica_source(config_dirs: list[Path], from_kv: bool) -> str | None:
    """What says this server is one of several replicas, if anything can tell: config from a
    Consul KV prefix (shared by replicas), or a directory that meshctl-git-sync keeps (a link
    into its `trees/`, beside its `cache.git`)."""
    if from_kv:
        return "config from Consul KV"
    for directory in config_dirs:
        if not directory.is_symlink():
            continue
        target = directory.resolve()
        for parent in target.parents:
            if parent.name == "trees" and (parent.parent / "cache.git").is_dir():
                return f"--config-dir {directory} kept by meshctl-git-sync"
    return None


def _refuse_own_root(state_dir: Path, replica: str) -> None:
    """UsageError when this server, one of several replicas, would make a self-signed root of its
    own: each replica would have its own, and proxies moving between them would be refused by
    their peers (docs/replicas.md). A root already in the state directory (one copied to every
    replica) is used as it is."""
    from meshctl.errors import UsageError
    from meshctl.security.cacerts import ROOT_CERT
    from meshctl.security.selfsigned import ca_directory

    if (ca_directory(state_dir) / ROOT_CERT).exists():
        return
    raise UsageError(
        f"{replica}: this server is one of several replicas, and would make a self-signed root CA of its own in "
        f"{ca_directory(state_dir)} (each replica its own: the mesh splits); give every replica one CA with "
        "--ca-dir, or copy one state directory to each (docs/replicas.md)"
    )


#: gRPC keeps `grpc.max_connection_age_ms` in a 32-bit int: about 596 hours.
_MAX_CONNECTION_AGE_NANOS = (2**31 - 1) * 1_000_000


def _seconds(flag: str, value: float) -> float:
    """`value` of a flag counted in seconds (or per second), or UsageError: `nan`, `inf` and
    negative numbers parse as floats but would make the server wait forever or never."""
    import math

    from meshctl.errors import UsageError

    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{flag} {value!r} is not a finite number of seconds, 0 or more")
    return value


def _rollout(canary: str | None, soak: str) -> RolloutSettings:
    """The rollout settings of --canary and --canary-soak, or UsageError."""
    from meshctl.config.schema import parse_duration
    from meshctl.errors import UsageError
    from meshctl.server.rollout_plan import CanarySelector, RolloutSettings

    nanos = parse_duration(soak)
    if nanos is None or nanos < 0:
        raise UsageError(f"--canary-soak {soak!r} is not a duration (30s, 5m)")
    if canary is None:
        return RolloutSettings()
    return RolloutSettings(CanarySelector.parse(canary), soak=nanos / 1e9)


def _workload_cert_lifetime(text: str) -> datetime.timedelta:
    """`--workload-cert-lifetime`, or UsageError: a Go duration from the least that renewal can
    keep up with (`MIN_WORKLOAD_LIFETIME`) to the longest a self-signed root lives."""
    from meshctl.config.schema import parse_duration
    from meshctl.errors import UsageError
    from meshctl.security.ca import MIN_WORKLOAD_LIFETIME
    from meshctl.security.selfsigned import ROOT_LIFETIME

    nanos = parse_duration(text)
    if nanos is None or nanos <= 0:
        raise UsageError(f"--workload-cert-lifetime {text!r} is not a duration (24h, 90m)")
    lifetime = datetime.timedelta(microseconds=nanos // 1000) if nanos // 1000 < 10**17 else ROOT_LIFETIME * 2
    if lifetime < MIN_WORKLOAD_LIFETIME:
        raise UsageError(
            f"--workload-cert-lifetime {text!r} is shorter than renewal can serve "
            f"(at least {MIN_WORKLOAD_LIFETIME.total_seconds():g}s; Istio's default is 24h)"
        )
    if lifetime > ROOT_LIFETIME:
        raise UsageError(f"--workload-cert-lifetime {text!r} is longer than the CA lives ({ROOT_LIFETIME.days} days)")
    return lifetime
