"""`meshctl bootstrap`: the Envoy bootstrap a VM proxy starts from."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl.cli.exits import reported

if TYPE_CHECKING:
    from meshctl.bootstrap import BootstrapOptions
    from meshctl.snapshot.node import ProxyNode


class BootstrapFormat(enum.StrEnum):
    yaml = "yaml"
    json = "json"


@reported
def bootstrap(
    ctx: typer.Context,
    proxy: Annotated[
        str,
        typer.Option(
            "--proxy",
            help="Node id TYPE~IP~NAME.NAMESPACE~DOMAIN, or NAME.NAMESPACE with --ip.",
        ),
    ] = "",
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            metavar="NAME.NAMESPACE",
            help="Instead of --proxy: register this VM (at --ip, else at the address the server sees it "
            "connect from) into the WorkloadGroup NAME of NAMESPACE when its Envoy connects; its WorkloadEntry "
            "is made from the group's template and removed once the Envoy has been gone for meshctl serve's "
            "--health-grace.",
        ),
    ] = None,
    xds_address: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST:PORT",
            show_default=False,
            help="meshctl serve's xDS address. Repeat it for several replicas: Envoy connects to one and "
            "moves to another when that one goes away. A name is resolved by Envoy, every address it "
            "has being a replica. Default: 127.0.0.1:15010.",
        ),
    ] = None,
    ip: Annotated[str | None, typer.Option(help="The VM's address, when --proxy is NAME.NAMESPACE.")] = None,
    router: Annotated[bool, typer.Option(help="A gateway (router) rather than a sidecar.")] = False,
    interception: Annotated[str, typer.Option(help="NONE (no iptables, the VM default) or REDIRECT.")] = "NONE",
    delta: Annotated[
        bool,
        typer.Option(
            "--delta/--sotw",
            help="Incremental (delta) xDS, Istio's default since 1.22, or state of the world. Delta for an Envoy "
            "unless --sotw (a change then reaches it alone, not with every cluster and listener it holds); "
            "state of the world with --grpc, the only protocol gRPC speaks.",
        ),
    ] = True,
    admin_port: Annotated[int, typer.Option(help="Envoy's admin port on 127.0.0.1.")] = 15000,
    stats_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Envoy's Prometheus metrics (GET /stats/prometheus, and nothing else of the admin "
            "API) on this port of every address, as Istio's 15090; 0 for none. Give each proxy on one "
            "host its own.",
        ),
    ] = 15090,
    health_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            metavar="PORT",
            show_default=False,
            help="Answer GET /healthz/ready on this port of every address from Envoy's readiness (200 once it "
            "has its config, 503 once it is stopping), as Istio's 15021, for load balancers' health checks; "
            "0 for none. Default: 15021 for a gateway (--router or a router~ node id), none for a sidecar.",
        ),
    ] = None,
    stats_inclusion_prefix: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PREFIX",
            help="Keep only the Envoy stats named by --stats-inclusion-* (and those Istio always keeps: "
            "server, cluster_manager, listener_manager, cluster.xds-grpc, ...), as Istio's "
            "proxyStatsMatcher; this one keeps stats whose name starts with PREFIX (cluster.outbound). "
            "Repeatable. Default: every stat.",
        ),
    ] = None,
    stats_inclusion_suffix: Annotated[
        list[str] | None,
        typer.Option(metavar="SUFFIX", help="Keep stats whose name ends with SUFFIX (rq_timeout); repeatable."),
    ] = None,
    stats_inclusion_regex: Annotated[
        list[str] | None,
        typer.Option(metavar="RE2", help="Keep stats whose whole name matches the RE2 regex; repeatable."),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="A workload label KEY=VALUE sent in node metadata; repeatable.")
    ] = None,
    xds_ca: Annotated[
        Path | None,
        typer.Option(help="Connect to meshctl over TLS, trusting this PEM CA for the server's certificate."),
    ] = None,
    xds_cert: Annotated[
        Path | None,
        typer.Option(
            help="This proxy's PEM client certificate (needs --xds-ca and --xds-key); it must name the "
            "workload of --proxy when meshctl serve has --client-ca (see meshctl serve --help)."
        ),
    ] = None,
    xds_key: Annotated[Path | None, typer.Option(help="The PEM private key of --xds-cert.")] = None,
    xds_cert_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            show_default=False,
            help="Instead of --xds-cert/--xds-key: the directory `meshctl ca issue --proxy` and `meshctl ca renew` "
            "keep cert-chain.pem and key.pem in. Envoy reads them through SDS and follows renewals without a "
            "restart (through its sds/xds-client-cert.yaml, written when missing); --xds-ca defaults to its "
            "root-cert.pem.",
        ),
    ] = None,
    xds_sni: Annotated[
        str | None,
        typer.Option(
            help="Server name to send and to require as a DNS SAN of meshctl's certificate "
            "(default: the --xds-address host, as a DNS or IP SAN)."
        ),
    ] = None,
    dns_port: Annotated[
        int,
        typer.Option(
            help="The sidecar's DNS listener on 127.0.0.1 (UDP), answering the mesh's names; 0 for none.",
            min=0,
            max=65535,
        ),
    ] = 15053,
    dns_forward: Annotated[
        bool,
        typer.Option(
            help="Forward names outside the mesh to the VM's resolvers (/etc/resolv.conf); "
            "--no-dns-forward answers them NXDOMAIN (behind systemd-resolved, which asks only for the mesh's)."
        ),
    ] = True,
    output: Annotated[BootstrapFormat, typer.Option("--output", "-o", help="yaml or json.")] = BootstrapFormat.yaml,
    config_paths: Annotated[
        list[Path] | None,
        typer.Option(
            "--config",
            metavar="PATH",
            help="Istio YAML (a file or directory; repeatable) whose ProxyConfigs for this proxy are applied: "
            "ISTIO_META_* environmentVariables become node metadata, the other fields are named in a warning; "
            "the applyTo BOOTSTRAP patches of its EnvoyFilters that select the proxy are merged in.",
        ),
    ] = None,
    mesh_config: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Istio's MeshConfig: its defaultConfig (proxyMetadata, proxyStatsMatcher) under every ProxyConfig, "
            "and its rootNamespace.",
        ),
    ] = None,
    grpc: Annotated[
        bool,
        typer.Option(
            "--grpc",
            help="A proxyless gRPC application rather than Envoy: print gRPC's xDS bootstrap (JSON), for "
            "GRPC_XDS_BOOTSTRAP=FILE or GRPC_XDS_BOOTSTRAP_CONFIG.",
        ),
    ] = False,
    cert_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            show_default=False,
            help="With --grpc: the workload's certificate directory (cert-chain.pem, key.pem, root-cert.pem, as "
            "`meshctl ca issue` and `ca renew` keep them), read by gRPC's certificate provider `default` for "
            "the mesh's mutual TLS (ISTIO_MUTUAL).",
        ),
    ] = None,
) -> None:
    """Print a complete Envoy bootstrap for a VM proxy: `meshctl bootstrap ... > envoy.yaml && envoy -c envoy.yaml`."""
    import json
    import sys

    from meshctl.bootstrap import (
        BootstrapOptions,
        StatsInclusion,
        XdsClientTls,
        build_bootstrap,
        health_port_problem,
        stats_port_problem,
    )
    from meshctl.bootstrap import (
        health_port as effective_health_port,
    )
    from meshctl.config.hosts import is_ip
    from meshctl.errors import UsageError
    from meshctl.server.settings import split_address
    from meshctl.snapshot.node import parse_node_id

    if group is not None:
        if proxy or "." not in group:
            raise UsageError("--group NAME.NAMESPACE takes the place of --proxy")
        proxy = group
        # Without --ip the server takes the address the VM's connection comes from.
        ip = ip or "0.0.0.0"
    elif not proxy:
        raise UsageError("give --proxy NODE (or --group NAME.NAMESPACE)")
    node_id = proxy
    if ip is not None and not is_ip(ip):
        raise UsageError(f"--ip {ip!r} is not an IPv4 or IPv6 address")
    if "~" not in proxy:
        if not ip or "." not in proxy:
            raise UsageError("--proxy NAME.NAMESPACE needs --ip ADDRESS (or give the full node id)")
        namespace = proxy.split(".", 1)[1]
        node_id = f"{'router' if router else 'sidecar'}~{ip}~{proxy}~{namespace}.svc.cluster.local"
    labels = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    metadata = {"INTERCEPTION_MODE": interception}
    if group is not None:
        metadata["AUTO_REGISTER_GROUP"] = group.split(".", 1)[0]
    node = parse_node_id(node_id, metadata)  # a NodeIdError says what is wrong
    addresses: list[tuple[str, int]] = []
    for address in xds_address or ["127.0.0.1:15010"]:
        try:
            addresses.append(split_address(address))
        except ValueError as exc:  # the server's parser says what is wrong with the address
            raise UsageError(str(exc)) from exc
    addresses = list(dict.fromkeys(addresses))
    (host, port), more = addresses[0], tuple(addresses[1:])
    if not is_ip(node.ip):
        raise UsageError(f"the node id's IP {node.ip!r} is not an IPv4 or IPv6 address")
    if (xds_cert is None) != (xds_key is None):
        raise UsageError("--xds-cert and --xds-key go together")
    if xds_cert_dir is not None:
        if xds_cert is not None:
            raise UsageError("--xds-cert-dir replaces --xds-cert and --xds-key: give one or the other")
        xds_ca = xds_ca or xds_cert_dir / "root-cert.pem"
        if not grpc:
            _ensure_sds_file(xds_cert_dir)
    if xds_ca is None and (xds_cert is not None or xds_sni is not None):
        raise UsageError(
            "--xds-cert, --xds-key and --xds-sni need --xds-ca: TLS without checking the server is not offered"
        )
    if xds_ca is not None and xds_sni is None and len({h for h, _ in addresses}) > 1:
        raise UsageError(
            "several --xds-address hosts with --xds-ca need --xds-sni NAME, a DNS SAN every replica's "
            "certificate carries: Envoy checks one name for the whole xds-grpc cluster"
        )
    if grpc:
        # Delta is the default for an Envoy; for gRPC only an explicit --delta is a mistake.
        source = ctx.get_parameter_source("delta")
        told = delta and source is not None and source.name == "COMMANDLINE"
        _print_grpc_bootstrap(
            node_id, metadata, labels, addresses, xds_ca, xds_cert, xds_key, xds_cert_dir, cert_dir, xds_sni, told
        )
        return
    if cert_dir is not None:
        raise UsageError("--cert-dir is for --grpc: an Envoy is sent its workload certificate over SDS")
    tls = XdsClientTls(xds_ca, xds_cert, xds_key, xds_sni, xds_cert_dir) if xds_ca is not None else None
    inclusion = StatsInclusion(
        tuple(stats_inclusion_prefix or ()), tuple(stats_inclusion_suffix or ()), tuple(stats_inclusion_regex or ())
    )
    extra, mesh_stats = _proxy_config(config_paths or [], mesh_config, node.namespace, {**node.labels, **labels})
    if mesh_stats and not inclusion:
        inclusion = StatsInclusion(
            mesh_stats.get("inclusionPrefixes", ()),
            mesh_stats.get("inclusionSuffixes", ()),
            mesh_stats.get("inclusionRegexps", ()),
        )
    options = BootstrapOptions(
        metadata=extra,
        xds_host=host,
        xds_port=port,
        more_xds=more,
        delta=delta,
        admin_port=admin_port,
        labels=labels,
        tls=tls,
        stats_port=stats_port,
        health_port=health_port,
        stats_inclusion=inclusion,
        dns_port=0 if router else dns_port,
        dns_forward=dns_forward,
    )
    problem = stats_port_problem(options) if stats_port else None
    if problem is not None:
        raise UsageError(f"--stats-port {stats_port}: {problem} (--stats-port 0 for no stats listener)")
    problem = health_port_problem(node, options) if effective_health_port(node, options) else None
    if problem is not None:
        raise UsageError(f"--health-port {effective_health_port(node, options)}: {problem} (--health-port 0 for none)")
    if (problem := inclusion.problem()) is not None:
        raise UsageError(f"--stats-inclusion-*: {problem}")
    config = _patched(build_bootstrap(node, options), config_paths or [], node, {**node.labels, **labels}, options)
    if output is BootstrapFormat.json:
        json.dump(config, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.dump(config, sys.stdout)


def _patched(
    config: dict[str, Any], paths: list[Path], node: ProxyNode, labels: dict[str, str], options: BootstrapOptions
) -> dict[str, Any]:
    """`config` with the BOOTSTRAP patches of the EnvoyFilters under `paths` that select the node
    (`meshctl.bootstrap_patches`); each applied is named on stderr, as is a file that failed to
    load (its EnvoyFilters are left out: `meshctl validate` says why)."""
    if not paths:
        return config
    from meshctl.bootstrap_patches import apply_bootstrap_patches, bootstrap_patches
    from meshctl.cli import output as out

    metadata = {**node.metadata, **options.metadata}
    patches, errors = bootstrap_patches(paths, node, labels, metadata)
    console = out.stderr_console()
    if errors:
        console.print(
            f"warning: {len(errors)} error(s) in --config: the EnvoyFilters of those files are not applied "
            f"(first: {errors[0]})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for envoy_filter, _ in patches:
        console.print(
            f"note: BOOTSTRAP patch of EnvoyFilter {envoy_filter.namespace}/{envoy_filter.name} applied",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return apply_bootstrap_patches(config, [value for _, value in patches])


def _proxy_config(
    paths: list[Path], mesh_config: Path | None, namespace: str, labels: dict[str, str]
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """The node metadata and stats inclusion lists the proxy's ProxyConfigs and MeshConfig
    `defaultConfig` give (`meshctl.config.proxy_config`); what they say that a bootstrap cannot
    carry is printed as warnings on stderr."""
    if not paths and mesh_config is None:
        return {}, {}
    from meshctl.cli import output as out
    from meshctl.config import proxy_config
    from meshctl.config.mesh import DEFAULT_ROOT_NAMESPACE, read_mesh_mapping
    from meshctl.errors import UsageError

    missing = [str(p) for p in [*paths, *([mesh_config] if mesh_config else [])] if not p.exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    layers: list[proxy_config.ProxyConfigDoc] = []
    stats: dict[str, tuple[str, ...]] = {}
    warnings: list[str] = []
    root_namespace = DEFAULT_ROOT_NAMESPACE
    if mesh_config is not None:
        mesh, stats, warnings = proxy_config.mesh_layer(mesh_config)
        layers = [mesh] if mesh is not None else []
        data = read_mesh_mapping(mesh_config)
        if isinstance(data, dict) and isinstance(data.get("rootNamespace"), str):
            root_namespace = data["rootNamespace"]
    layers += proxy_config.select(proxy_config.read(paths), namespace, labels, root_namespace)
    applied = proxy_config.apply(layers)
    for warning in [*warnings, *applied.warnings]:
        out.stderr_console().print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    return applied.metadata, stats


def _print_grpc_bootstrap(
    node_id: str,
    metadata: dict[str, str],
    labels: dict[str, str],
    addresses: list[tuple[str, int]],
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    xds_cert_dir: Path | None,
    cert_dir: Path | None,
    sni: str | None,
    delta: bool,
) -> None:
    """`--grpc`: gRPC's bootstrap as JSON (the only form gRPC reads)."""
    import json
    import sys

    from meshctl.errors import UsageError
    from meshctl.grpc_bootstrap import CERT_FILE, KEY_FILE, GrpcBootstrapOptions, build_grpc_bootstrap
    from meshctl.snapshot.node import GRPC_GENERATOR, parse_node_id

    if delta:
        raise UsageError("--delta: gRPC's xDS client speaks state of the world only")
    if sni is not None:
        raise UsageError("--xds-sni: gRPC checks meshctl's certificate against the --xds-address host itself")
    if xds_cert_dir is not None:
        cert, key = xds_cert_dir / CERT_FILE, xds_cert_dir / KEY_FILE
    node = parse_node_id(node_id, {**metadata, "GENERATOR": GRPC_GENERATOR})
    options = GrpcBootstrapOptions(
        servers=tuple(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses),
        labels=labels,
        ca_file=ca,
        cert_file=cert,
        key_file=key,
        cert_dir=cert_dir,
    )
    json.dump(build_grpc_bootstrap(node, options), sys.stdout, indent=2)
    sys.stdout.write("\n")


def _ensure_sds_file(directory: Path) -> None:
    """Write the SDS file of `directory` unless it already says what it must (UsageError when it
    does not and cannot be written: under the Envoy unit the directory is read-only)."""
    from meshctl.bootstrap import xds_client_sds_file
    from meshctl.errors import UsageError
    from meshctl.security.files import PUBLIC_MODE, write_atomically
    from meshctl.security.renewal import SDS_FILE

    path = directory / SDS_FILE
    wanted = xds_client_sds_file(directory)
    try:
        if path.read_bytes() == wanted:
            return
    except OSError:
        pass
    try:
        path.parent.mkdir(mode=0o755, exist_ok=True)
        write_atomically(path, wanted, mode=PUBLIC_MODE)
    except OSError as exc:
        raise UsageError(
            f"--xds-cert-dir: cannot write {path} ({exc.strerror or exc}); `meshctl ca renew --force --dir "
            f"{directory}` or `meshctl ca issue --proxy ... --out {directory}` writes it"
        ) from None
