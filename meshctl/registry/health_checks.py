"""Which workloads have their health checked, and how: Istio's probe fields as plain data.

A workload's health is checked by the Envoy on its own VM (the server sends it the checks over
Envoy's Health Discovery Service, `meshctl.server.health`), so the checks are what Envoy can run:
HTTP, TCP and gRPC. A workload is checked when

- it is a WorkloadEntry of a WorkloadGroup (`istio.io/autoRegistrationGroup`) whose `probe` is
  set: the group's probe, as Istio's auto-registration turns health checks on for such entries;
- it is a WorkloadEntry annotated `proxy.istio.io/health-checks-enabled: "true"` (Istio's opt-in):
  the probe of its group when it has one, else a TCP connect to each of its target ports.

Field meanings and defaults are Istio's (`ReadinessProbe`): period 10 s, timeout 1 s, success
threshold 1, failure threshold 3. A probe's `host` defaults to loopback: the app is probed on the
VM it runs on, by that VM's Envoy. `initialDelaySeconds` is kept for people to read; nothing is
lost by ignoring it, as a workload is unhealthy until its first probe succeeds anyway.

`exec` probes cannot run inside Envoy; validation refuses them (`config/validation/
workload_group.py`) and a group that has one here checks nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from meshctl.api.networking.v1alpha3 import workload_entry_pb2, workload_group_pb2
from meshctl.config.labels import GROUP_ANNOTATION
from meshctl.config.model import Config
from meshctl.registry.model import ServiceModel

#: Istio's annotation opting a WorkloadEntry into health checks.
HEALTH_CHECKS_ANNOTATION: Final = "proxy.istio.io/health-checks-enabled"
#: Where a probe connects unless it names a host: the app on the probing Envoy's own VM.
LOOPBACK: Final = "127.0.0.1"

_WG = workload_group_pb2.WorkloadGroup
_WE = workload_entry_pb2.WorkloadEntry


class ProbeKind(enum.StrEnum):
    HTTP = "http"
    TCP = "tcp"
    GRPC = "grpc"


@dataclass(frozen=True, slots=True)
class Probe:
    """One check of a workload, in Istio's terms (seconds and counts)."""

    kind: ProbeKind
    #: Ports to probe: the probe's own, or every target port of the workload (a default TCP check).
    ports: tuple[int, ...]
    host: str = LOOPBACK
    path: str = "/"
    #: HTTP or HTTPS (httpGet only).
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    #: The gRPC health service name (grpc only; "" for the server's overall health).
    service: str = ""
    period: int = 10
    timeout: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    initial_delay: int = 0


@dataclass(frozen=True, slots=True)
class WorkloadCheck:
    """A workload whose health its Envoy checks, and the probe."""

    namespace: str
    name: str
    probe: Probe

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _seconds(value: int, default: int) -> int:
    return value if value > 0 else default


def probe_from_message(message: Any, default_ports: tuple[int, ...] = ()) -> Probe | None:
    """A WorkloadGroup's `probe` as a `Probe`; None for one Envoy cannot run (exec, none set)
    or a TCP/HTTP/gRPC probe without a port."""
    method = message.WhichOneof("health_check_method")
    timing = {
        "period": _seconds(message.period_seconds, 10),
        "timeout": _seconds(message.timeout_seconds, 1),
        "success_threshold": _seconds(message.success_threshold, 1),
        "failure_threshold": _seconds(message.failure_threshold, 3),
        "initial_delay": max(0, message.initial_delay_seconds),
    }
    if method == "http_get":
        http = message.http_get
        if not http.port:
            return None
        return Probe(
            ProbeKind.HTTP,
            (http.port,),
            host=http.host or LOOPBACK,
            path=http.path or "/",
            scheme=http.scheme or "HTTP",
            headers=tuple((h.name, h.value) for h in http.http_headers),
            **timing,
        )
    if method == "tcp_socket":
        tcp = message.tcp_socket
        return Probe(ProbeKind.TCP, (tcp.port,), host=tcp.host or LOOPBACK, **timing) if tcp.port else None
    if method == "grpc":
        grpc = message.grpc
        return Probe(ProbeKind.GRPC, (grpc.port,), service=grpc.service, **timing) if grpc.port else None
    return None


def workload_checks(configs: Iterable[Config], model: ServiceModel) -> dict[tuple[str, str], WorkloadCheck]:
    """The checked workloads of `configs` by (namespace, name) (the rules in the module docstring).

    A default TCP check probes the workload's target ports as `model` has them (its endpoints'
    ports); a workload that no service selects has nothing to probe and is left out."""
    groups: dict[tuple[str, str], Any] = {}
    entries: list[Config] = []
    for config in configs:
        if config.kind == "WorkloadGroup":
            spec = config.spec
            if isinstance(spec, _WG) and spec.HasField("probe"):
                groups[(config.namespace, config.name)] = spec.probe
        elif config.kind == "WorkloadEntry" and (
            config.annotations.get(GROUP_ANNOTATION) or _enabled(config.annotations)
        ):
            entries.append(config)
    if not entries:
        return {}
    wanted = {(c.namespace, c.name) for c in entries}
    target_ports: dict[tuple[str, str], set[int]] = {}
    for endpoints in model.endpoints.values():
        for ep in endpoints:
            key = (ep.namespace, ep.name)
            if key in wanted:
                target_ports.setdefault(key, set()).update(p for p in ep.ports.values() if p > 0)
    checks: dict[tuple[str, str], WorkloadCheck] = {}
    for config in entries:
        key = (config.namespace, config.name)
        group = groups.get((config.namespace, config.annotations.get(GROUP_ANNOTATION, "")))
        probe: Probe | None = None
        if group is not None:
            probe = probe_from_message(group)
        elif _enabled(config.annotations):
            ports = tuple(sorted(target_ports.get(key, ())))
            probe = Probe(ProbeKind.TCP, ports) if ports else None
        if probe is not None:
            checks[key] = WorkloadCheck(config.namespace, config.name, probe)
    return checks


def may_be_checked(config: Config) -> bool:
    """Whether `workload_checks` reads `config` at all: a WorkloadGroup, or a WorkloadEntry of a
    group or with checks turned on. The others cannot make or change a check, so a registry may
    hand over these alone."""
    kind = config.key.kind
    if kind == "WorkloadGroup":
        return True
    return kind == "WorkloadEntry" and bool(config.annotations.get(GROUP_ANNOTATION) or _enabled(config.annotations))


def _enabled(annotations: Mapping[str, str]) -> bool:
    return annotations.get(HEALTH_CHECKS_ANNOTATION, "").strip().lower() == "true"
