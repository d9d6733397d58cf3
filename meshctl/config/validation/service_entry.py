"""ServiceEntry rules: hosts, addresses, ports, and endpoints that fit the resolution.

How a ServiceEntry resolves decides what its endpoints may be: STATIC endpoints are IP addresses
(or unix sockets), DNS endpoints may be names, NONE has no endpoints at all. Endpoints are inline
WorkloadEntries, checked with the WorkloadEntry rules plus the ports this entry declares.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.hosts import is_ip
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    Report,
    check_export_to,
    check_labels,
    check_selector,
    enum_name,
    fqdn_problem,
    ip_or_cidr_problem,
    is_http,
    is_tcp,
    is_tls,
    parse_protocol,
    partial_wildcard_problem,
    port_name_problem,
    port_problem,
    protocol_problem,
    wildcard_domain_problem,
)
from meshctl.config.validation.workload_entry import check_workload_entry


def validate(spec: Message) -> list[Issue]:
    entry: Any = spec
    report = Report()
    resolution = enum_name(entry, "resolution")
    selector = entry.HasField("workload_selector")
    if selector:
        check_selector(report, ("spec", "workloadSelector", "labels"), entry.workload_selector.labels, "the entry")
        if entry.endpoints:
            report.error(("spec", "endpoints"), '"workloadSelector" and "endpoints" cannot be set together')
    _hosts(report, entry)
    cidr = False
    for i, address in enumerate(entry.addresses):
        cidr = cidr or "/" in address
        report.error(("spec", "addresses", i), ip_or_cidr_problem(address))
    if cidr and resolution not in ("NONE", "STATIC"):
        report.error(
            ("spec", "addresses"), f"CIDR addresses are only allowed with resolution NONE or STATIC, not {resolution}"
        )
    port_names = _ports(report, entry)
    if resolution == "NONE":
        if entry.endpoints:
            report.error(
                ("spec", "endpoints"),
                "resolution NONE takes no endpoints: traffic goes to the address the client called",
            )
        if selector:
            report.warn(("spec", "workloadSelector"), "workloadSelector has no effect with resolution NONE")
    elif resolution == "STATIC":
        for i, endpoint in enumerate(entry.endpoints):
            check_workload_entry(report, ("spec", "endpoints", i), endpoint, port_names, names_allowed=False)
    elif resolution in ("DNS", "DNS_ROUND_ROBIN"):
        _dns(report, entry, resolution, port_names)
        if selector:
            report.warn(("spec", "workloadSelector"), f"workloadSelector has no effect with resolution {resolution}")
    elif resolution == "DYNAMIC_DNS":
        _dynamic_dns(report, entry)
    else:
        report.error(("spec", "resolution"), f"resolution {resolution} is not supported")
    if resolution != "NONE" and len(entry.hosts) > 1:
        for i, port in enumerate(entry.ports):
            if not is_http(port.protocol) and not is_tls(port.protocol):
                report.error(
                    ("spec", "ports", i, "protocol"),
                    "several hosts on a port that is neither HTTP nor TLS cannot be told apart: "
                    "use one host per ServiceEntry, or resolution NONE",
                )
                break
    check_export_to(report, ("spec", "exportTo"), entry.export_to, service_entry=True)
    return report.issues


def _dynamic_dns(report: Report, entry: Any) -> None:
    """DYNAMIC_DNS resolves, per request, the host name the client asked for (HTTP Host, TLS
    SNI): it is for wildcard hosts, with ports that carry a host name, and nothing to resolve
    beforehand (no endpoints, no addresses)."""
    for i, host in enumerate(entry.hosts):
        if host != "*" and not host.startswith("*"):
            report.error(
                ("spec", "hosts", i),
                f'resolution DYNAMIC_DNS is for wildcard hosts ("*.example.com"): use resolution DNS for "{host}"',
            )
    for i, port in enumerate(entry.ports):
        if port.protocol and not is_http(port.protocol) and not is_tls(port.protocol):
            report.error(
                ("spec", "ports", i, "protocol"),
                f"resolution DYNAMIC_DNS needs HTTP or TLS ports: a {port.protocol} connection carries no host name",
            )
        elif (served := port.protocol or port.name.split("-", 1)[0]) and (
            is_http(served) or parse_protocol(served) == "TLS"
        ):
            continue
        else:
            # Istio builds the dynamic forward proxy for HTTP, HTTP2, gRPC and TLS ports only.
            what = f"protocol {port.protocol}" if port.protocol else "no protocol"
            report.warn(
                ("spec", "ports", i, "protocol"),
                f"port {port.number} has {what}: a DYNAMIC_DNS port gets the dynamic forward proxy only "
                "as HTTP (routed by Host) or TLS (routed by SNI), as in Istio; this port is not served",
            )
    if entry.endpoints:
        report.error(("spec", "endpoints"), "resolution DYNAMIC_DNS takes no endpoints: the requested host is resolved")
    if entry.addresses:
        report.error(("spec", "addresses"), "resolution DYNAMIC_DNS takes no addresses: the requested host is resolved")


def _hosts(report: Report, entry: Any) -> None:
    if not entry.hosts:
        report.error(("spec", "hosts"), "a ServiceEntry needs at least one host")
    for i, host in enumerate(entry.hosts):
        if host == "*":
            report.error(("spec", "hosts", i), 'host "*" is not allowed in a ServiceEntry')
            continue
        report.error(("spec", "hosts", i), wildcard_domain_problem(host))
        report.warn(("spec", "hosts", i), partial_wildcard_problem(host))


def _ports(report: Report, entry: Any) -> set[str]:
    names: set[str] = set()
    numbers: set[int] = set()
    for i, port in enumerate(entry.ports):
        path: FieldPath = ("spec", "ports", i)
        if port.name and port.name in names:
            report.error((*path, "name"), f'duplicate port name "{port.name}"')
        names.add(port.name)
        if port.number in numbers:
            report.error((*path, "number"), f"duplicate port number {port.number}")
        numbers.add(port.number)
        if port.target_port:
            report.error((*path, "targetPort"), port_problem(port.target_port))
        report.error((*path, "name"), port_name_problem(port.name))
        report.error((*path, "protocol"), protocol_problem(port.protocol))
        report.error((*path, "number"), port_problem(port.number))
        if not entry.addresses and parse_protocol(port.protocol or "TCP") == "TCP":
            report.warn(
                (*path, "protocol"),
                f"port {port.number} carries TCP (or an unset protocol) and the entry has no addresses: "
                "under iptables clients are told apart by port alone, so another TCP service on this port "
                "will conflict (a VM without iptables reaches it on a loopback address of its own)",
            )
    return names


def _dns(report: Report, entry: Any, resolution: str, port_names: set[str]) -> None:
    if not entry.endpoints:
        for i, host in enumerate(entry.hosts):
            if host != "*" and fqdn_problem(host):
                report.error(
                    ("spec", "hosts", i),
                    f"resolution {resolution} without endpoints resolves the hosts themselves: "
                    f'"{host}" must be a DNS name',
                )
    if resolution == "DNS_ROUND_ROBIN" and len(entry.endpoints) > 1:
        report.error(("spec", "endpoints"), "resolution DNS_ROUND_ROBIN takes at most one endpoint")
    for i, endpoint in enumerate(entry.endpoints):
        path: FieldPath = ("spec", "endpoints", i)
        if not is_ip(endpoint.address) and fqdn_problem(endpoint.address):
            report.error(
                (*path, "address"), f'endpoint address "{endpoint.address}" is not an IP address or a DNS name'
            )
        check_labels(report, (*path, "labels"), endpoint.labels)
        for name, number in sorted(endpoint.ports.items()):
            if name not in port_names:
                report.error((*path, "ports", name), f'endpoint port "{name}" is not a port of this ServiceEntry')
            report.error((*path, "ports", name), port_name_problem(name))
            report.error((*path, "ports", name), port_problem(number))
    if entry.addresses and len(entry.hosts) > 1 and any(is_tcp(p.protocol) for p in entry.ports):
        report.warn(
            ("spec", "hosts"),
            "a ServiceEntry with addresses and a TCP port should have one host: "
            "TCP traffic to those addresses cannot tell which host it is for",
        )
