"""Prometheus metrics with Istio's names, so existing pilot dashboards work unchanged.

A deliberately small implementation of the text exposition format (counters, gauges and
histograms with labels); the server has a handful of metrics and no need for a client library.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
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

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {}

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


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(buckets)
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            counts, totals = self._series.setdefault(labels, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1
            totals[0] += value

    def count(self, *labels: str) -> int:
        series = self._series.get(labels)
        return series[0][-1] if series else 0

    def render(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            items = sorted((k, (list(c), t[0])) for k, (c, t) in self._series.items())
        for key, (counts, total) in items:
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                le = f'le="{_number(bound)}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {count}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {counts[-1]}")
        return out


class Metrics(PushObserver):
    """The server's metrics; also the ADS servicer's observer."""

    def __init__(self) -> None:
        self.xds = Gauge("pilot_xds", "Number of endpoints connected to this pilot using XDS.")
        self.pushes = Counter("pilot_xds_pushes", "Pilot build and send errors for lds, rds, cds and eds.", ["type"])
        self.convergence = Histogram(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration.",
            _CONVERGENCE_BUCKETS,
        )
        self.rejects = Counter(
            "pilot_total_xds_rejects", "Total number of XDS responses from pilot rejected by proxy.", ["type"]
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
        )
        self.services = Gauge("pilot_services", "Total services known to pilot.")
        self.config_size = Histogram(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            _SIZE_BUCKETS,
            ["type"],
        )
        self._all: tuple[Counter | Histogram, ...] = (
            self.xds,
            self.pushes,
            self.convergence,
            self.rejects,
            self.debounce,
            self.triggers,
            self.services,
            self.config_size,
        )

    # PushObserver
    def pushed(self, stream: Stream, push: Push, size: int) -> None:
        short = types.SHORT_NAMES.get(push.type_url, "other").lower()
        self.pushes.inc(short)
        self.config_size.observe(size, types.SHORT_NAMES.get(push.type_url, "other"))

    def converged(self, stream: Stream, seconds: float) -> None:
        self.convergence.observe(max(0.0, seconds))

    def rejected(self, stream: Stream, type_url: str, error: str) -> None:
        self.rejects.inc(types.SHORT_NAMES.get(type_url, "other").lower())

    def connected(self, count: int) -> None:
        self.xds.set(count)

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._all:
            lines.extend(metric.header())
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"
