"""`meshctl services`: the services and endpoints meshctl sees, from the files, Consul, or both.

It answers "why does this proxy have no endpoints for reviews?" without a running server: the
listing is built by the same registries, with the same merge rule, as the server's model.
"""

from __future__ import annotations

import enum
import queue
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl.cli.exits import reported

if TYPE_CHECKING:
    from meshctl.registry.base import Registry
    from meshctl.registry.consul_http import ConsulOptions
    from meshctl.registry.model import Endpoint, RegistryChange, Service, ServiceModel

EXIT_OK, EXIT_INVALID = 0, 1  # usage and Consul errors exit 2, at the CLI's edge (`meshctl.cli.exits`)

COLUMNS = ("SERVICE", "NAMESPACE", "PORTS", "RESOLUTION", "REGISTRY", "ENDPOINTS")


class Format(enum.StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


@reported
def services(
    config_dir: Annotated[
        Path | None,
        typer.Option(
            "--config-dir",
            help="Directory (or file) of Istio YAML: ServiceEntry, WorkloadEntry ...",
            envvar="MESHCTL_CONFIG_DIR",
        ),
    ] = None,
    consul: Annotated[
        str | None,
        typer.Option(
            "--consul",
            help="Consul's HTTP API: http(s)://host:port or host:port. CONSUL_HTTP_TOKEN, CONSUL_CACERT"
            " and Consul's other CLI variables apply.",
            envvar="MESHCTL_CONSUL",
        ),
    ] = None,
    output: Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml (for tools).")] = Format.table,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Keep running and list again on every change (json: one line each)."),
    ] = False,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only services of this namespace.")] = None,
    admin: Annotated[
        str | None,
        typer.Option(
            "--admin",
            help="Ask a running meshctl serve (its admin address) instead: its endpoints carry the health "
            "their workloads' own Envoys report, and why.",
            envvar="MESHCTL_ADMIN",
        ),
    ] = None,
    admin_token_file: Annotated[
        str | None,
        typer.Option(help="File holding the admin bearer token (when serve has --admin-token-file)."),
    ] = None,
) -> None:
    """List the services and endpoints meshctl sees, merged as the server merges them.

    Files win over Consul for a hostname both define.

    Exit status: 0 listed, 1 a file failed to load (the rest is listed), 2 usage error, missing directory or
    unreachable Consul.
    """
    from meshctl.errors import UsageError

    if admin is not None:
        from meshctl.cli.admin_client import get_json

        _print_model(model_of_registryz(get_json(admin, "/debug/registryz", admin_token_file)), output, namespace)
        raise typer.Exit(EXIT_OK)
    if config_dir is None and consul is None:
        raise UsageError("nothing to list: give --config-dir DIR, --consul ADDR (or both), or --admin ADDR")
    if config_dir is not None and not config_dir.exists():
        raise UsageError(f"no such file or directory: {config_dir}")
    consul_options = _consul_options(consul) if consul is not None else None

    def show(model: ServiceModel, changed: Iterable[str] | None = None) -> None:
        _print_model(model, output, namespace, streaming=watch, changed=changed)

    if watch:
        _watch(config_dir, consul_options, show)
        return
    models: list[tuple[str, ServiceModel]] = []
    failed = False
    if config_dir is not None:
        file_model, failed = _read_files(config_dir)
        models.append(("files", file_model))
    if consul_options is not None:
        from meshctl.registry.consul import read_consul_once

        models.append(("consul", read_consul_once(consul_options)))
    from meshctl.registry.aggregate import merge_models

    show(merge_models(models))
    raise typer.Exit(EXIT_INVALID if failed else EXIT_OK)


def model_of_registryz(data: dict[str, Any]) -> ServiceModel:
    """A running server's `/debug/registryz` as the model it describes (what `--admin` lists)."""
    from meshctl.registry.model import Endpoint, Health, Protocol, Resolution, Service, ServicePort, make_model

    services: list[Service] = []
    endpoints: dict[str, list[Endpoint]] = {}
    for svc in data.get("services", []):
        ports = tuple(ServicePort(p["name"], p["number"], Protocol.parse(p["protocol"])) for p in svc["ports"])
        service = Service(
            svc["hostname"], svc["namespace"], ports, Resolution(svc["resolution"]), registry=svc["registry"]
        )
        services.append(service)
        for ep in svc["endpoints"]:
            namespace, _, name = ep.get("workload", "").partition("/")
            endpoints.setdefault(service.hostname, []).append(
                Endpoint(
                    ep["address"],
                    {int(k): v for k, v in ep["ports"].items()},
                    ep.get("labels", {}),
                    locality=ep.get("locality", ""),
                    health=Health(ep["health"]),
                    health_reason=ep.get("healthReason", ""),
                    name=name,
                    namespace=namespace,
                )
            )
    return make_model(services, endpoints, data.get("notes", []))


def _consul_options(address: str) -> ConsulOptions:
    """Options for `--consul ADDR`, with Consul's own environment variables for the rest (a
    UsageError names the one that cannot be used)."""
    from meshctl.errors import UsageError
    from meshctl.registry.consul_http import ConsulOptions

    try:
        return ConsulOptions.from_env(address=address)
    except OSError as exc:  # a file those variables name: the user's to fix, not a crash
        raise UsageError(str(exc)) from exc


def _read_files(config_dir: Path) -> tuple[ServiceModel, bool]:
    """The model of the directory's files; True when some file failed to load (reported on stderr)."""
    from meshctl.cli import output as out
    from meshctl.ingest import load_files

    loaded = load_files([config_dir])
    errors = loaded.errors
    if errors:
        out.print_findings(errors, "text", sys.stderr)
        out.error(f"{len(errors)} error(s) in {config_dir}: what failed to load is not listed")
    return loaded.services(), bool(errors)


def _watch(config_dir: Path | None, consul: ConsulOptions | None, show: Callable[..., None]) -> None:
    """List, then list again after every change until interrupted. Consul must answer once
    before the first listing, so that an unreachable Consul is an error, not an empty list."""
    from meshctl.cli import output as out
    from meshctl.registry.aggregate import AggregateRegistry

    members: list[Registry] = []
    stop: list[Callable[[], object]] = []
    try:
        if config_dir is not None:
            from meshctl.ingest import FollowedFiles

            followed = FollowedFiles([config_dir])
            first = followed.start()
            stop.append(followed.stop)
            if first.errors:
                out.print_findings(first.errors, "text", sys.stderr)
            members.append(followed.registry)
        if consul is not None:
            from meshctl.errors import RegistryError
            from meshctl.registry.consul import ConsulRegistry, read_consul_once

            read_consul_once(consul)  # fails fast, with Consul's own error, when it cannot be reached
            registry = ConsulRegistry(consul)
            registry.start()
            stop.append(registry.stop)
            if not registry.wait_synced(consul.request_timeout):
                raise RegistryError(
                    f"Consul did not answer within {consul.request_timeout:g}s: {registry.status().message}"
                )
            members.append(registry)
        _follow(AggregateRegistry(members), show)
    except KeyboardInterrupt:
        pass
    finally:
        for fn in reversed(stop):
            fn()


def _follow(registry: Registry, show: Callable[..., None]) -> None:
    changes: queue.Queue[RegistryChange] = queue.Queue()
    registry.subscribe(changes.put)
    show(registry.model())
    while True:
        try:
            change = changes.get(timeout=0.5)  # a timeout keeps Ctrl-C prompt on every platform
        except queue.Empty:
            continue
        hosts = set(change.hosts)
        while not changes.empty():  # one listing for everything that arrived meanwhile
            hosts |= changes.get_nowait().hosts
        show(registry.model(), hosts)


def _print_model(
    model: ServiceModel,
    fmt: Format,
    namespace: str | None,
    *,
    streaming: bool = False,
    changed: Iterable[str] | None = None,
) -> None:
    from meshctl.cli import output as out
    from meshctl.cli import output as output_services

    for note in model.notes:
        out.stderr_console().print(f"note: {note}", markup=False, soft_wrap=True)
    if changed is not None:
        out.stderr_console().print(f"changed: {', '.join(sorted(changed))}", markup=False, soft_wrap=True)
    selected = [s for _, s in sorted(model.services.items()) if namespace is None or s.namespace == namespace]
    if fmt is Format.table:
        rows = [_row(s, model.endpoints_of(s.hostname)) for s in selected]
        output_services.print_listing(COLUMNS, rows)
    else:
        data = {
            "services": [service_data(s, model.endpoints_of(s.hostname)) for s in selected],
            "notes": list(model.notes),
        }
        output_services.print_data(data, fmt.value, compact=streaming)
    sys.stdout.flush()


def _row(service: Service, endpoints: Iterable[Endpoint]) -> list[str]:
    ports = ", ".join(f"{p.name}/{p.number}/{p.protocol.value}" for p in service.ports)
    lines = [_endpoint_text(service, e) for e in endpoints]
    return [
        service.hostname,
        service.namespace,
        ports or "-",
        service.resolution.value,
        service.registry,
        "\n".join(lines) or "<none>",
    ]


def _endpoint_text(service: Service, endpoint: Endpoint) -> str:
    numbers = list(dict.fromkeys(endpoint.ports[p.number] for p in service.ports if p.number in endpoint.ports))
    host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
    where = f"{host}:{','.join(str(n) for n in numbers)}" if any(numbers) else endpoint.address
    labels = ",".join(f"{k}={v}" for k, v in sorted(endpoint.labels.items()))
    health = f"{endpoint.health.value} ({endpoint.health_reason})" if endpoint.health_reason else endpoint.health.value
    return " ".join(part for part in (where, labels, health) if part)


def service_data(service: Service, endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """A service and its endpoints as plain data, keys in a fixed order (the json/yaml output)."""
    return {
        "hostname": service.hostname,
        "namespace": service.namespace,
        "registry": service.registry,
        "origin": service.origin,
        "resolution": service.resolution.value,
        "location": service.location.value,
        "exportTo": sorted(service.export_to or {"*"}),  # unset: public, unless a MeshConfig says otherwise
        "addresses": list(service.addresses),
        "ports": [{"name": p.name, "number": p.number, "protocol": p.protocol.value} for p in service.ports],
        "endpoints": [_endpoint_data(e) for e in endpoints],
    }


def _endpoint_data(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "address": endpoint.address,
        "ports": [{"servicePort": sp, "port": p} for sp, p in sorted(endpoint.ports.items())],
        "labels": dict(sorted(endpoint.labels.items())),
        "locality": endpoint.locality,
        "weight": endpoint.weight,
        "health": endpoint.health.value,
        "healthReason": endpoint.health_reason,
        "serviceAccount": endpoint.service_account,
        "tlsMode": endpoint.tls_mode.value,
        "network": endpoint.network,
        "name": endpoint.name,
        "namespace": endpoint.namespace,
    }
