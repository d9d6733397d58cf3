"""`meshctl serve`: the control plane that runs under systemd on the VM fleet's control hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve(
    config_dir: Annotated[
        list[Path], typer.Option("--config-dir", "-c", help="Directory of Istio YAML to serve; repeatable.")
    ],
    xds_address: Annotated[
        str, typer.Option(help="Where proxies connect for ADS (HOST:PORT; port 0 picks a free one).")
    ] = "127.0.0.1:15010",
    admin_address: Annotated[
        str, typer.Option(help="Readiness, metrics and debug pages (HOST:PORT; port 0 picks a free one).")
    ] = "127.0.0.1:15014",
    consul: Annotated[
        str | None,
        typer.Option(help="Also read services from Consul at this address (http(s)://host:port or host:port)."),
    ] = None,
    consul_token: Annotated[str | None, typer.Option(help="Consul ACL token (default: CONSUL_HTTP_TOKEN).")] = None,
    consul_ca_file: Annotated[str | None, typer.Option(help="CA bundle for Consul over TLS.")] = None,
    consul_datacenter: Annotated[str | None, typer.Option(help="Consul datacenter to read.")] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace of resources that name none.")
    ] = "default",
    debounce: Annotated[float, typer.Option(help="Seconds of quiet before a change is pushed.")] = 0.1,
    debounce_max: Annotated[float, typer.Option(help="Longest a change waits for quiet, in seconds.")] = 10.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve Envoy config (ADS, state of the world and delta) for the Istio YAML in --config-dir.

    Reloads on every change of the directory (and on SIGHUP), follows Consul when given, and
    keeps serving the last good config when an input breaks.
    """
    import asyncio
    import logging

    from meshctl.cli import output as out
    from meshctl.registry.consul import ConsulOptions
    from meshctl.server.app import Server, ServeSettings, split_address
    from meshctl.server.discovery import DebounceSettings

    logging.getLogger().setLevel(log_level.upper())
    missing = [str(p) for p in config_dir if not p.exists()]
    if missing:
        out.error(f"no such config directory: {', '.join(missing)}")
        raise typer.Exit(2)
    try:
        split_address(xds_address)
        split_address(admin_address)
        debounce_settings = DebounceSettings(debounce, max(debounce, debounce_max))
    except ValueError as exc:
        out.error(str(exc))
        raise typer.Exit(2) from exc
    consul_options = (
        ConsulOptions.from_env(address=consul, token=consul_token, ca_file=consul_ca_file, datacenter=consul_datacenter)
        if consul
        else None
    )
    settings = ServeSettings(
        config_dirs=tuple(config_dir),
        xds_address=xds_address,
        admin_address=admin_address,
        consul=consul_options,
        default_namespace=namespace,
        debounce=debounce_settings,
    )
    try:
        asyncio.run(Server(settings).run())
    except OSError as exc:
        out.error(f"cannot serve: {exc}")
        raise typer.Exit(2) from exc
