"""WorkloadGroup rules: a template for the WorkloadEntries of registering VMs, and their probe.

The template is not a WorkloadEntry yet: its address is the registering VM's own, so it is not
required (and is overwritten when set).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation import Issue
from meshctl.config.validation.common import (
    Report,
    check_labels,
    port_name_problem,
    port_problem,
    probe_header_name_problem,
)
from meshctl.config.validation.envoy_limits import service_account_name_problem

_PROBE_COUNTS = (
    ("initial_delay_seconds", "initialDelaySeconds"),
    ("timeout_seconds", "timeoutSeconds"),
    ("period_seconds", "periodSeconds"),
    ("success_threshold", "successThreshold"),
    ("failure_threshold", "failureThreshold"),
)


def validate(spec: Message) -> list[Issue]:
    group: Any = spec
    report = Report()
    if group.HasField("metadata"):
        check_labels(report, ("spec", "metadata", "labels"), group.metadata.labels)
    if not group.HasField("template"):
        report.error(("spec",), "a WorkloadGroup needs a template")
    else:
        _template(report, ("spec", "template"), group.template)
    if group.HasField("probe"):
        _probe(report, ("spec", "probe"), group.probe)
    return report.issues


def _template(report: Report, path: FieldPath, template: Any) -> None:
    if template.address:
        report.warn((*path, "address"), "address is ignored: each WorkloadEntry gets the address of its VM")
    if template.labels:
        report.warn((*path, "labels"), 'labels belong in "metadata.labels", not in the template')
    check_labels(report, (*path, "labels"), template.labels)
    if template.service_account:
        report.error((*path, "serviceAccount"), service_account_name_problem(template.service_account))
    for name, number in sorted(template.ports.items()):
        report.error((*path, "ports", name), port_name_problem(name))
        report.error((*path, "ports", name), port_problem(number))


def _probe(report: Report, path: FieldPath, probe: Any) -> None:
    for field, json_name in _PROBE_COUNTS:
        if getattr(probe, field) < 0:
            report.error((*path, json_name), f"{json_name} must not be negative")
    method = probe.WhichOneof("health_check_method")
    if method is None:
        report.error(path, "a probe needs one of httpGet, tcpSocket, exec or grpc")
    elif method == "http_get":
        http, at = probe.http_get, (*path, "httpGet")
        report.error((*at, "port"), port_problem(http.port))
        if http.scheme and http.scheme not in ("HTTP", "HTTPS"):
            report.error((*at, "scheme"), f'httpGet scheme "{http.scheme}" must be HTTP or HTTPS')
        for i, header in enumerate(http.http_headers):
            report.error((*at, "httpHeaders", i, "name"), probe_header_name_problem(header.name))
    elif method == "tcp_socket":
        report.error((*path, "tcpSocket", "port"), port_problem(probe.tcp_socket.port))
    elif method == "exec":
        # Health is checked by the VM's own Envoy (HDS), which cannot run a command.
        report.error(
            (*path, "exec"),
            "exec probes cannot run: each VM's Envoy checks its health, and Envoy runs only httpGet, "
            "tcpSocket and grpc probes",
        )
    else:
        report.error((*path, "grpc", "port"), port_problem(probe.grpc.port))
