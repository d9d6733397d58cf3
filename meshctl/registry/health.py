"""Workload health reported by the workloads' own Envoys, as a registry input.

`HealthReports` holds what the Envoys of health-checked workloads said (over HDS, served by
`meshctl.server.health`) and whether their streams are there; `HealthCheckedRegistry` lays that
over the file registry's model, so each checked workload's endpoints carry HEALTHY or UNHEALTHY
(and why) in the model the snapshot holds. Generators read health from the snapshot only, as they
read Consul's failing checks: every proxy's EDS then leaves an unhealthy endpoint out of its
load balancing.

A checked workload is HEALTHY only while its Envoy's last report says every probed port passes.
Until its Envoy has reported once it is UNHEALTHY, as Istio treats a health-checked WorkloadEntry
without a `Healthy` condition (not ready until a probe has passed: `IsHealthy` defaults to false).
Once the Envoy's stream has been gone longer than the grace period (`expire`, Istio's
PILOT_WORKLOAD_ENTRY_GRACE_PERIOD) the workload is UNHEALTHY until the Envoy is back and reports
again: a VM powered off leaves the load-balancing sets with no file edit. Within the grace
period the last report stands, so a proxy reconnecting (to this replica or another) causes no churn.

Each change of a workload's health is one log line. Listeners are called on the thread that
changed the state and must return quickly; the registry rebuilds on a thread of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from meshctl.registry.aggregate import model_change
from meshctl.registry.base import Listener
from meshctl.registry.health_checks import WorkloadCheck, workload_checks
from meshctl.registry.model import (
    Endpoint,
    Health,
    RegistryChange,
    RegistryStatus,
    ServiceModel,
    make_model,
)

if TYPE_CHECKING:
    from meshctl.config.store import ConfigChange, ConfigStore
    from meshctl.registry.files import FileRegistry

#: The kinds whose annotations and probes say which workloads are checked.
_CHECK_KINDS = frozenset({"WorkloadEntry", "WorkloadGroup"})

logger = logging.getLogger("meshctl.registry.health")

WorkloadKey = tuple[str, str]

NOT_REPORTED = "not reported yet: its Envoy has not sent a health report"


@dataclass(frozen=True, slots=True)
class WorkloadHealth:
    """What is known of one workload's health: its last report and its stream's presence."""

    #: None until its Envoy reports; then whether every probed port passed.
    healthy: bool | None = None
    #: Why, in words (a probe failing or timing out, with the ports).
    reason: str = ""
    #: HDS streams of its Envoy open now (on this server).
    streams: int = 0
    #: When (wall clock) its last stream ended, while none is open.
    gone_since: float | None = None
    #: The stream has been gone longer than the grace period, and no report came since.
    expired: bool = False

    def verdict(self) -> tuple[Health, str]:
        """The health its endpoints carry, and why."""
        if self.expired and self.gone_since is not None:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.gone_since))
            return Health.UNHEALTHY, f"stream gone since {stamp}: its Envoy is not connected"
        if self.expired:
            return Health.UNHEALTHY, "stream gone: no report since its Envoy reconnected"
        if self.healthy is None:
            return Health.UNHEALTHY, NOT_REPORTED
        return (Health.HEALTHY if self.healthy else Health.UNHEALTHY), self.reason


ReportsListener = Callable[[], None]


class HealthReports:
    """Every health-checked workload's reports and stream presence; safe on any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[WorkloadKey, WorkloadHealth] = {}
        self._listeners: list[ReportsListener] = []

    def subscribe(self, listener: ReportsListener) -> None:
        self._listeners.append(listener)

    def get(self, key: WorkloadKey) -> WorkloadHealth:
        return self._states.get(key, _UNKNOWN)

    def states(self) -> Mapping[WorkloadKey, WorkloadHealth]:
        with self._lock:
            return MappingProxyType(dict(self._states))

    def report(self, key: WorkloadKey, healthy: bool, reason: str) -> None:
        """A report from the workload's Envoy (every probed port passing, or not, and why)."""
        self._update(key, lambda s: dataclasses.replace(s, healthy=healthy, reason=reason, expired=False))

    def opened(self, key: WorkloadKey) -> None:
        self._update(key, lambda s: dataclasses.replace(s, streams=s.streams + 1, gone_since=None))

    def closed(self, key: WorkloadKey, now: float | None = None) -> None:
        at = time.time() if now is None else now

        def close(s: WorkloadHealth) -> WorkloadHealth:
            streams = max(0, s.streams - 1)
            return dataclasses.replace(s, streams=streams, gone_since=at if streams == 0 else None)

        self._update(key, close)

    def expire(self, grace: float, now: float | None = None) -> None:
        """Mark unhealthy every workload whose stream has been gone longer than `grace` seconds."""
        at = time.time() if now is None else now
        with self._lock:
            due = [
                k
                for k, s in self._states.items()
                if s.streams == 0 and s.gone_since is not None and not s.expired and at - s.gone_since >= grace
            ]
        for key in due:
            self._update(key, lambda s: s if s.streams else dataclasses.replace(s, expired=True))

    def next_expiry(self, grace: float) -> float | None:
        """The wall-clock time of the next `expire` that would change something, if any."""
        with self._lock:
            times = [s.gone_since + grace for s in self._states.values() if s.gone_since is not None and not s.expired]
        return min(times) if times else None

    def forget(self, keep: Iterable[WorkloadKey]) -> None:
        """Drop what is held of workloads no longer checked (their entries deleted)."""
        wanted = set(keep)
        with self._lock:
            for key in [k for k in self._states if k not in wanted and not self._states[k].streams]:
                del self._states[key]

    def _update(self, key: WorkloadKey, change: Callable[[WorkloadHealth], WorkloadHealth]) -> None:
        with self._lock:
            before = self._states.get(key, _UNKNOWN)
            after = change(before)
            if after == before:
                return
            self._states[key] = after
        old, new = before.verdict(), after.verdict()
        if old[0] is not new[0]:
            logger.info("workload %s/%s is %s: %s", key[0], key[1], new[0].value, new[1])
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                logger.exception("a health listener failed")


_UNKNOWN = WorkloadHealth()


def apply_health(
    model: ServiceModel, checks: Mapping[WorkloadKey, WorkloadCheck], reports: HealthReports, previous: ServiceModel
) -> ServiceModel:
    """`model` with the endpoints of checked workloads marked as `reports` say; hosts without
    one keep their endpoint tuples (and digests)."""
    if not checks:
        return model
    endpoints: dict[str, tuple[Endpoint, ...]] = dict(model.endpoints)
    for host, eps in model.endpoints.items():
        if any((ep.namespace, ep.name) in checks for ep in eps):
            endpoints[host] = tuple(_marked(ep, checks, reports) for ep in eps)
    return make_model(model.services.values(), endpoints, model.notes, previous=[model, previous])


def _marked(ep: Endpoint, checks: Mapping[WorkloadKey, WorkloadCheck], reports: HealthReports) -> Endpoint:
    key = (ep.namespace, ep.name)
    if key not in checks:
        return ep
    health, reason = reports.get(key).verdict()
    return dataclasses.replace(ep, health=health, health_reason=reason)


def checked_endpoint_counts(model: ServiceModel, checks: Mapping[WorkloadKey, WorkloadCheck]) -> tuple[int, int]:
    """(healthy, unhealthy) endpoints of checked workloads in `model`, for metrics."""
    healthy = unhealthy = 0
    if checks:
        for endpoints in model.endpoints.values():
            for ep in endpoints:
                if (ep.namespace, ep.name) in checks:
                    if ep.health is Health.HEALTHY:
                        healthy += 1
                    else:
                        unhealthy += 1
    return healthy, unhealthy


class HealthCheckedRegistry:
    """The file registry with its checked workloads' health laid over (see the module docstring).

    It takes the file registry's place among the aggregate's members under the same name. On a
    file change it rebuilds at once (on the file registry's thread, which reads the configs the
    checks come from); on a report it rebuilds on a thread of its own, so the event loop that
    serves the HDS streams never pays for a rebuild."""

    def __init__(self, files: FileRegistry, reports: HealthReports) -> None:
        self._files = files
        self._reports = reports
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._base = files.model()
        self._checks = workload_checks(files.configs(), self._base)
        self._model = apply_health(self._base, self._checks, reports, self._base)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-health")
        self._pending = False
        files.subscribe(self._files_changed)
        reports.subscribe(self._reports_changed)

    @property
    def name(self) -> str:
        return self._files.name

    def model(self) -> ServiceModel:
        return self._model

    def checks(self) -> Mapping[WorkloadKey, WorkloadCheck]:
        """The workloads checked now, by (namespace, name)."""
        return self._checks

    def status(self) -> RegistryStatus:
        return self._files.status()

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def follow(self, store: ConfigStore) -> Callable[[], None]:
        """Also follow `store` (after the file registry does): an annotation or a probe changes
        which workloads are checked without changing the file registry's model. Returns a
        function that stops following."""

        def on_change(change: ConfigChange) -> None:
            if change.kinds & _CHECK_KINDS:
                self._files_changed(None)

        unsubscribe = store.subscribe(on_change)
        self._files_changed(None)
        return unsubscribe

    def _files_changed(self, change: RegistryChange | None) -> None:
        base = self._files.model()
        checks = workload_checks(self._files.configs(), base)
        with self._lock:
            self._base, self._checks = base, checks
            self._rebuild(settled=True if change is None else change.settled)
        self._reports.forget(checks)

    def _reports_changed(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(RuntimeError):  # closed: nobody reads the model any more
            self._worker.submit(self._rebuild_now)

    def _rebuild_now(self) -> None:
        with self._lock:
            self._pending = False
            self._rebuild(settled=False)

    def _rebuild(self, *, settled: bool) -> None:
        """Lay the reports over the last file model; called with the lock held."""
        old = self._model
        new = apply_health(self._base, self._checks, self._reports, old)
        self._model = new
        change = model_change(old, new)
        if change is None:
            return
        change = dataclasses.replace(change, settled=settled)
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                logger.exception("a %s registry listener failed", self.name)
