"""Prometheus metrics with Istio's names, so existing pilot dashboards work unchanged.

A deliberately small implementation of the text exposition format (counters, gauges and
histograms with labels); the server has a handful of metrics and no need for a client library.

Every series a dashboard or alert reads exists from start-up, at 0: `increase()` over a counter
that appears with its first event misses that event (the first NACK of a fleet would alert no
one). The `type` label takes Istio's values (`cds`, `eds`, `lds`, `rds`) on every metric that has
it. The `process_*` metrics are those every Prometheus client exports (resident memory, CPU
seconds, open file descriptors, start time), read from /proc at each scrape.
"""

from __future__ import annotations

import bisect
import datetime
import itertools
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from meshctl.server.ads import PushObserver, Stream
from meshctl.server.subscription import Push
from meshctl.xds import types

LabelValues = tuple[str, ...]

_CONVERGENCE_BUCKETS: Final = (0.1, 0.5, 1, 3, 5, 10, 20, 30)
_SIZE_BUCKETS: Final = (1, 10_000, 1_000_000, 4_000_000, 10_000_000, 40_000_000)
_DEBOUNCE_BUCKETS: Final = (0.01, 0.1, 1, 3, 5, 10, 20, 30)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return repr(int(value)) if float(value).is_integer() else repr(value)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str] = (), initial: Sequence[LabelValues] = ((),)
    ) -> None:
        """`initial` are the series that exist at 0 from the start (by default the unlabeled one)."""
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {k: 0.0 for k in initial if len(k) == len(self.label_names)}

    def inc(self, *labels: str, by: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + by

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, *labels: str) -> None:
        with self._lock:
            self._values[labels] = value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        buckets: Sequence[float],
        labels: Sequence[str] = (),
        initial: Sequence[LabelValues] = ((),),
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(buckets)
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {
            k: ([0] * (len(self.buckets) + 1), [0.0]) for k in initial if len(k) == len(self.label_names)
        }

    def observe(self, value: float, *labels: str) -> None:
        """Counted in its own bucket only (the first bound it does not pass, else +Inf): the
        cumulative counts Prometheus reads are summed at `render`, not at each of a fleet's
        pushes."""
        index = len(self.buckets) if math.isnan(value) else bisect.bisect_left(self.buckets, value)
        with self._lock:
            counts, totals = self._series.setdefault(labels, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[index] += 1
            totals[0] += value

    def count(self, *labels: str) -> int:
        series = self._series.get(labels)
        return sum(series[0]) if series else 0

    def render(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            items = sorted((k, (list(itertools.accumulate(c)), t[0])) for k, (c, t) in self._series.items())
        for key, (counts, total) in items:
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                le = f'le="{_number(bound)}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {count}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {counts[-1]}")
        return out


#: Istio's values of the `type` label (`v3.GetMetricType`), one series each from the start.
_TYPES: Final = tuple((short.lower(),) for short in sorted(types.SHORT_NAMES.values()))
_TRIGGERS: Final = (("config",), ("endpoint",), ("service",))


def _type_label(type_url: str) -> str:
    return types.SHORT_NAMES.get(type_url, "other").lower()


class Metrics(PushObserver):
    """The server's metrics; also the ADS servicer's observer."""

    def __init__(self) -> None:
        self.xds = Gauge("pilot_xds", "Number of endpoints connected to this pilot using XDS.")
        self.pushes = Counter(
            "pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds.", ["type"], _TYPES
        )
        self.convergence = Histogram(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration.",
            _CONVERGENCE_BUCKETS,
        )
        self.rejects = Counter(
            "pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy.", ["type"], _TYPES
        )
        self.debounce = Histogram(
            "pilot_debounce_time",
            "Delay in seconds between the first config change entering debounce and the merged push.",
            _DEBOUNCE_BUCKETS,
        )
        self.triggers = Counter(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            ["type"],
            _TRIGGERS,
        )
        self.services = Gauge("pilot_services", "Total services known to pilot.")
        # Istio's name; here, proxy configs that could not be generated (each kept its last good one).
        self.internal_errors = Counter(
            "pilot_total_xds_internal_errors", "Total number of internal XDS errors in pilot."
        )
        self.config_size = Histogram(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            _SIZE_BUCKETS,
            ["type"],
            _TYPES,
        )
        # meshctl's own: the endpoints whose health their workload's Envoy checks (HDS), by health.
        self.checked_endpoints = Gauge(
            "meshctl_health_checked_endpoints",
            "Endpoints whose health their workload's own Envoy checks, by health.",
            ["health"],
            (("healthy",), ("unhealthy",)),
        )
        self.hds_streams = Gauge("meshctl_hds_streams", "Health Discovery Service streams open on this server.")
        self.registered = Gauge(
            "meshctl_registered_workloads", "WorkloadEntries of VMs registered into their WorkloadGroup."
        )
        self.shared_health_failing = Gauge(
            "meshctl_shared_health_failing",
            "1 while this replica cannot read or write the health and registrations replicas share in Consul KV "
            "(it keeps the last known state), else 0.",
        )
        # Per attested workload (bounded by the mesh), kept after its proxy leaves: "seen".
        self.client_cert_expiry = Gauge(
            "meshctl_xds_client_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when the xDS client certificate a workload's proxy last connected "
            "with expires.",
            ["workload"],
            (),
        )
        self.root_info = Gauge(
            "meshctl_ca_root_info",
            "The roots workload certificates chain to, by SHA-256 fingerprint.",
            ["fingerprint"],
            (),
        )
        #: More metrics made at each scrape by other parts of the server (the rollout's).
        self.extra: list[Callable[[], Sequence[Counter | Histogram]]] = []
        #: When the earliest workload certificate held expires (`WorkloadSecrets.earliest_expiry`).
        self._earliest_expiry: Callable[[], datetime.datetime | None] | None = None
        self._signers: Callable[[], Mapping[str, int]] | None = None
        #: (root, chain) expiry times of the CA, as Unix seconds; None without a CA.
        self._ca_expiry: tuple[float, float] | None = None
        self._all: tuple[Counter | Histogram, ...] = (
            self.xds,
            self.checked_endpoints,
            self.hds_streams,
            self.registered,
            self.shared_health_failing,
            self.pushes,
            self.convergence,
            self.rejects,
            self.debounce,
            self.triggers,
            self.services,
            self.config_size,
            self.internal_errors,
            self.client_cert_expiry,
            self.root_info,
        )

    # PushObserver
    def pushed(self, stream: Stream, push: Push, size: int) -> None:
        label = _type_label(push.type_url)
        self.pushes.inc(label)
        self.config_size.observe(size, label)

    def converged(self, stream: Stream, seconds: float) -> None:
        self.convergence.observe(max(0.0, seconds))

    def rejected(self, stream: Stream, type_url: str, error: str) -> None:
        self.rejects.inc(_type_label(type_url))

    def connected(self, count: int) -> None:
        self.xds.set(count)

    def certificate_seen(self, stream: Stream) -> None:
        node = stream.node
        if stream.certificate_not_after and node is not None and node.workload:
            self.client_cert_expiry.set(stream.certificate_not_after, node.workload)

    def watch_ca(self, root_not_after: float, chain_not_after: float, fingerprints: Sequence[str] = ()) -> None:
        """Export the CA's expiry (Unix seconds) as Istio's citadel gauges, and the time left; and
        the fingerprints of its roots, which replicas of one mesh share."""
        self._ca_expiry = (root_not_after, chain_not_after)
        self.root_info.clear()  # a CA replaced while serving (--ca-dir) takes its roots' series along
        for fingerprint in fingerprints:
            self.root_info.set(1, fingerprint)

    def watch_workload_certificates(
        self,
        earliest_expiry: Callable[[], datetime.datetime | None],
        signers: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """Export how long until the earliest workload certificate held expires: the outage the
        fleet can take from here (two thirds of a lifetime are spent before renewal); and how
        many certificates held each CA certificate signed (a CA rotation is done when only the
        new one has any)."""
        self._earliest_expiry = earliest_expiry
        self._signers = signers

    def _ca_metrics(self) -> list[Counter]:
        out: list[Counter] = []
        earliest = self._earliest_expiry() if self._earliest_expiry is not None else None
        if earliest is not None:
            gauge = Gauge(
                "meshctl_workload_cert_earliest_expiry_seconds",
                "The time remaining, in seconds, before the earliest workload certificate held expires.",
            )
            gauge.set(round(earliest.timestamp() - time.time(), 3))
            out.append(gauge)
        if self._signers is not None:
            held = Gauge(
                "meshctl_workload_certs",
                "Workload certificates held for connected proxies, by the subject of the CA certificate "
                "that signed them.",
                ["signer"],
                initial=(),
            )
            for signer, count in sorted(self._signers().items()):
                held.set(count, signer)
            out.append(held)
        if self._ca_expiry is None:
            return out
        now = time.time()
        root, chain = self._ca_expiry
        when = "The unix timestamp, in seconds, when the {} expires."
        left = "The time remaining, in seconds, before the {} expires."
        gauges = (
            ("citadel_server_root_cert_expiry_timestamp", when.format("root CA"), root),
            ("citadel_server_cert_chain_expiry_timestamp", when.format("CA chain"), chain),
            ("citadel_server_root_cert_expiry_seconds", left.format("root CA"), root - now),
            ("citadel_server_cert_chain_expiry_seconds", left.format("CA chain"), chain - now),
        )
        for name, help_text, value in gauges:
            gauge = Gauge(name, help_text)
            gauge.set(round(value, 3))
            out.append(gauge)
        return out

    def render(self) -> str:
        lines: list[str] = []
        made = [metric for provide in self.extra for metric in provide()]
        for metric in (*self._all, *made, *self._ca_metrics(), *process_metrics()):
            lines.extend(metric.header())
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_metrics() -> list[Counter]:
    """The process metrics every Prometheus client exports, with their names and help, read now.
    Each is left out where the system does not say (no /proc)."""
    times = os.times()
    cpu = Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")
    cpu.inc(by=times.user + times.system)
    gauges = (
        ("process_resident_memory_bytes", "Resident memory size in bytes.", _statm(1)),
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", _statm(0)),
        ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", _start_time()),
        ("process_open_fds", "Number of open file descriptors.", _open_fds()),
        ("process_max_fds", "Maximum number of open file descriptors.", _max_fds()),
    )
    out: list[Counter] = [cpu]
    for name, help_text, value in gauges:
        if value is not None:
            gauge = Gauge(name, help_text)
            gauge.set(value)
            out.append(gauge)
    return out


def _statm(field: int) -> float | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[field]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def _start_time() -> float | None:
    """From /proc: the process's start in clock ticks after boot, plus the boot time."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / _TICKS


def _open_fds() -> float | None:
    try:
        return float(len(os.listdir("/proc/self/fd")))
    except OSError:
        return None


def _max_fds() -> float | None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else float(soft)
