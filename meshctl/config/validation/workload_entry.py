"""WorkloadEntry rules: an address (IP, DNS name or unix socket), named ports, valid labels, and
a service account Kubernetes could name (it is the last segment of the workload's SPIFFE URI).

The same rules apply to a ServiceEntry's inline endpoints, which may also only use the port
names the ServiceEntry declares, and to a WorkloadGroup's template (where the address is filled
in when a VM registers, so it is not required there).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.hosts import is_ip
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    UNIX_PREFIX,
    Report,
    check_labels,
    fqdn_problem,
    port_name_problem,
    port_problem,
    unix_address_problem,
)
from meshctl.config.validation.envoy_limits import service_account_name_problem


def validate(spec: Message) -> list[Issue]:
    report = Report()
    check_workload_entry(report, ("spec",), spec, None, names_allowed=True)
    return report.issues


def check_workload_entry(
    report: Report,
    path: FieldPath,
    entry: Any,
    service_ports: Collection[str] | None,
    *,
    names_allowed: bool,
) -> None:
    """`service_ports` is the port names of the ServiceEntry the endpoint belongs to (None for a
    standalone WorkloadEntry); `names_allowed` is False where only IP addresses resolve (STATIC)."""
    address = entry.address
    if not address:
        if not entry.network:
            report.error(path, "address is required")
            return
        report.warn(path, f'address is unset: the workload is reached through the gateway of network "{entry.network}"')
    if address.startswith(UNIX_PREFIX):
        report.error((*path, "address"), unix_address_problem(address.removeprefix(UNIX_PREFIX)))
        if entry.ports:
            report.error((*path, "ports"), f"a unix socket endpoint ({address}) cannot have ports")
        if service_ports is not None and len(service_ports) != 1:
            report.error((*path, "address"), "a unix socket endpoint needs a ServiceEntry with exactly one port")
    elif address and not is_ip(address):
        if not names_allowed:
            report.error((*path, "address"), f'endpoint address "{address}" is not an IP address (resolution STATIC)')
        elif fqdn_problem(address):
            report.error((*path, "address"), f'address "{address}" is not an IP address or a DNS name')
    for name, number in sorted(entry.ports.items()):
        at = (*path, "ports", name)
        if service_ports is not None and name not in service_ports:
            report.error(at, f'port "{name}" is not a port of the ServiceEntry')
        report.error(at, port_name_problem(name))
        report.error(at, port_problem(number))
    check_labels(report, (*path, "labels"), entry.labels)
    if entry.service_account:
        report.error((*path, "serviceAccount"), service_account_name_problem(entry.service_account))
