"""Sidecar rules: which workloads it selects, its ingress and egress listeners, outbound policy.

Egress hosts are always `namespace/dnsName` (`./*`, `istio-system/*`, `*/api.example.com`): a
Sidecar narrows what a proxy sees by namespace. At most one egress listener may leave out the
port, and it must come last: it is the catch-all for everything the others do not take.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    UNIX_PREFIX,
    Report,
    check_destination,
    check_selector,
    enum_name,
    fqdn_problem,
    ip_problem,
    is_http,
    is_tls,
    namespace_host_problems,
    port_name_problem,
    port_problem,
    protocol_problem,
    unix_address_problem,
)
from meshctl.config.validation.destination_rule import check_connection_pool
from meshctl.config.validation.gateway import check_server_tls

_LOOPBACK_OR_ANY = ("127.0.0.1", "0.0.0.0", "::1", "::")


def validate(spec: Message) -> list[Issue]:
    sidecar: Any = spec
    report = Report()
    if sidecar.HasField("workload_selector"):
        check_selector(report, ("spec", "workloadSelector", "labels"), sidecar.workload_selector.labels, "the Sidecar")
    if not (
        sidecar.ingress
        or sidecar.egress
        or sidecar.HasField("outbound_traffic_policy")
        or sidecar.HasField("inbound_connection_pool")
    ):
        report.error(
            ("spec",), "a Sidecar needs at least one of ingress, egress, outboundTrafficPolicy, inboundConnectionPool"
        )
        return report.issues
    ports: set[int] = set()
    for i, listener in enumerate(sidecar.ingress):
        _ingress(report, ("spec", "ingress", i), listener, ports)
    if sidecar.HasField("inbound_connection_pool"):
        check_connection_pool(report, ("spec", "inboundConnectionPool"), sidecar.inbound_connection_pool)
    _egress(report, list(sidecar.egress))
    if sidecar.HasField("outbound_traffic_policy"):
        _outbound_policy(report, ("spec", "outboundTrafficPolicy"), sidecar.outbound_traffic_policy)
    return report.issues


def _port_and_bind(report: Report, path: FieldPath, port: Any, bind: str) -> None:
    if port.name:
        report.error((*path, "port", "name"), port_name_problem(port.name))
    report.error((*path, "port", "protocol"), protocol_problem(port.protocol))
    report.error((*path, "port", "number"), port_problem(port.number))
    if bind:
        report.error((*path, "bind"), ip_problem(bind))
    if port.target_port:
        report.error((*path, "port", "targetPort"), "targetPort has no effect on a Sidecar")


def _ingress(report: Report, path: FieldPath, listener: Any, ports: set[int]) -> None:
    if not listener.HasField("port"):
        report.error(path, "an ingress listener needs a port")
        return
    port = listener.port
    _port_and_bind(report, path, port, listener.bind)
    if port.number in ports:
        report.error((*path, "port", "number"), f"port {port.number} is used by another ingress listener")
    ports.add(port.number)
    if listener.default_endpoint:
        _default_endpoint(report, (*path, "defaultEndpoint"), listener.default_endpoint)
    if listener.HasField("tls"):
        tls, at = listener.tls, (*path, "tls")
        if tls.subject_alt_names:
            report.error((*at, "subjectAltNames"), "subjectAltNames is not supported on a Sidecar ingress")
        if tls.https_redirect:
            report.error((*at, "httpsRedirect"), "httpsRedirect is not supported on a Sidecar ingress")
        if tls.credential_name:
            report.error((*at, "credentialName"), "credentialName is not supported on a Sidecar ingress")
        if tls.credential_names:
            report.error((*at, "credentialNames"), "credentialNames is not supported on a Sidecar ingress")
        if tls.tls_certificates:
            report.error((*at, "tlsCertificates"), "tlsCertificates is not supported on a Sidecar ingress")
        mode = enum_name(tls, "mode")
        if mode in ("ISTIO_MUTUAL", "AUTO_PASSTHROUGH"):
            report.error((*at, "mode"), f"mode {mode} is not supported on a Sidecar ingress")
        if not is_tls(port.protocol):
            report.error(
                at,
                f"port {port.number} has protocol {port.protocol or '(unset)'}: "
                "an ingress listener with tls settings needs protocol HTTPS or TLS",
            )
        check_server_tls(report, at, tls)
    if listener.HasField("connection_pool"):
        check_connection_pool(report, (*path, "connectionPool"), listener.connection_pool)
        if listener.connection_pool.HasField("http") and not is_http(port.protocol):
            report.warn(
                (*path, "connectionPool", "http"),
                f"port {port.number} is not HTTP ({port.protocol or 'no protocol'}): only the tcp settings apply",
            )


def _default_endpoint(report: Report, path: FieldPath, endpoint: str) -> None:
    """Where inbound traffic is sent: `127.0.0.1:PORT`, `0.0.0.0:PORT`, `[::1]:PORT`, `:PORT`,
    or `unix://PATH`."""
    if endpoint.startswith(UNIX_PREFIX):
        report.error(path, unix_address_problem(endpoint.removeprefix(UNIX_PREFIX)))
        return
    if endpoint.startswith("["):
        host, bracket, rest = endpoint[1:].partition("]")
        colon, port = rest[:1], rest[1:]
        well_formed = bool(bracket) and colon == ":"
    else:
        host, colon, port = endpoint.partition(":")
        well_formed = bool(colon) and ":" not in port
    if not well_formed:
        report.error(path, f'defaultEndpoint "{endpoint}" must be HOST:PORT or unix://PATH')
        return
    if host and host not in _LOOPBACK_OR_ANY:
        report.error(
            path,
            f'defaultEndpoint "{endpoint}" must be 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix://PATH',
        )
    if not port.isdigit():
        report.error(path, f'defaultEndpoint "{endpoint}": the port "{port}" is not a number')
    else:
        report.error(path, port_problem(int(port)))


def _egress(report: Report, listeners: list[Any]) -> None:
    ports: set[int] = set()
    sockets: set[str] = set()
    for i, listener in enumerate(listeners):
        path: FieldPath = ("spec", "egress", i)
        if listener.HasField("port"):
            _egress_port(report, path, listener, ports, sockets)
        elif i != len(listeners) - 1:
            report.error(path, "only the last egress listener can leave out the port: it takes what the others do not")
        _egress_hosts(report, path, list(listener.hosts))


def _egress_port(report: Report, path: FieldPath, listener: Any, ports: set[int], sockets: set[str]) -> None:
    port, bind = listener.port, listener.bind
    if port.number:
        _port_and_bind(report, path, port, bind)
        if port.number in ports:
            report.error((*path, "port", "number"), f"port {port.number} is used by another egress listener")
        ports.add(port.number)
        return
    # Port 0: the listener is a unix domain socket named by bind.
    if port.name:
        report.error((*path, "port", "name"), port_name_problem(port.name))
    report.error((*path, "port", "protocol"), protocol_problem(port.protocol))
    if port.target_port:
        report.error((*path, "port", "targetPort"), "targetPort has no effect on a Sidecar")
    if not bind.startswith(UNIX_PREFIX):
        report.error((*path, "bind"), "an egress listener with port 0 needs a unix:// bind address")
    else:
        report.error((*path, "bind"), unix_address_problem(bind.removeprefix(UNIX_PREFIX)))
    if enum_name(listener, "capture_mode") not in ("DEFAULT", "NONE"):
        report.error((*path, "captureMode"), "a unix domain socket listener needs captureMode DEFAULT or NONE")
    if bind in sockets:
        report.error((*path, "bind"), f'unix domain socket "{bind}" is used by another egress listener')
    sockets.add(bind)


def _egress_hosts(report: Report, path: FieldPath, hosts: list[str]) -> None:
    if not hosts:
        report.error((*path, "hosts"), "an egress listener needs at least one host")
        return
    by_namespace: dict[str, set[str]] = defaultdict(set)
    for j, host in enumerate(hosts):
        at = (*path, "hosts", j)
        namespace, slash, name = host.partition("/")
        if slash:
            taken = by_namespace[namespace]
            if (name != "*" and (name in taken or "*" in taken)) or (name == "*" and taken):
                report.warn(at, f'duplicate egress host "{host}": an earlier host already covers it')
            taken.add(name)
        for problem in namespace_host_problems(host, gateway=False):
            report.error(at, problem)
    if "*" in by_namespace.get("*", set()) and len(by_namespace) > 1:
        report.warn((*path, "hosts"), '"*/*" selects every host: the other hosts add nothing')


def _outbound_policy(report: Report, path: FieldPath, policy: Any) -> None:
    if not policy.HasField("egress_proxy"):
        return
    mode = enum_name(policy, "mode")
    proxy, at = policy.egress_proxy, (*path, "egressProxy")
    if mode != "ALLOW_ANY":
        report.error(at, f"egressProxy only applies with mode ALLOW_ANY, not {mode}")
        return
    problem = fqdn_problem(proxy.host)
    if problem:
        report.error((*at, "host"), problem)
    elif not proxy.HasField("port"):
        report.error(at, "egressProxy needs a port")
    else:
        check_destination(report, at, proxy)
