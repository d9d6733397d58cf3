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
from typing import TYPE_CHECKING, Any

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
    #: HDS streams of its Envoy open now (on this server; merged: on every replica).
    streams: int = 0
    #: When (wall clock) its last stream ended, while none is open.
    gone_since: float | None = None
    #: The stream has been gone longer than the grace period, and no report came since.
    expired: bool = False
    #: When (wall clock) the report last changed: of two replicas' reports the later one wins.
    reported_at: float | None = None

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

    def to_json(self) -> dict[str, Any]:
        """As a replica shares it (`meshctl.registry.health_share`)."""
        return {
            "healthy": self.healthy,
            "reason": self.reason,
            "reportedAt": self.reported_at,
            "streams": self.streams,
            "goneSince": self.gone_since,
            "expired": self.expired,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> WorkloadHealth | None:
        """What another replica shared, or None when it is not in that shape."""
        healthy, reason, streams = value.get("healthy"), value.get("reason", ""), value.get("streams", 0)
        gone, at, expired = value.get("goneSince"), value.get("reportedAt"), value.get("expired", False)
        if not (healthy is None or isinstance(healthy, bool)) or not isinstance(reason, str):
            return None
        if not isinstance(streams, int) or isinstance(streams, bool) or streams < 0 or not isinstance(expired, bool):
            return None
        if not all(t is None or (isinstance(t, int | float) and not isinstance(t, bool)) for t in (gone, at)):
            return None
        return cls(healthy, reason, streams, None if gone is None else float(gone), expired,
                   None if at is None else float(at))  # fmt: skip


def merge_views(views: Iterable[WorkloadHealth]) -> WorkloadHealth:
    """One workload's health from the views of several replicas (each its own streams and
    reports), so that every replica holding the same views reads the same health:

    - connected while any view has a stream open; gone since the latest stream end otherwise;
    - the latest report (`reported_at`) of the views not expired stands, connected or not (a
      proxy that moves to another replica keeps its health until it reports there);
    - without one, expired when a connected view is (no report since it came back) or, when
      none is connected, when every view that saw it go has expired; else not reported yet.
    """
    found = list(views)
    if len(found) == 1:
        return found[0]
    streams = sum(v.streams for v in found)
    gone = None if streams else max((v.gone_since for v in found if v.gone_since is not None), default=None)
    live = [v for v in found if v.healthy is not None and not v.expired]
    if live:
        latest = max(live, key=lambda v: v.reported_at or 0.0)
        return WorkloadHealth(latest.healthy, latest.reason, streams, gone, False, latest.reported_at)
    if streams:
        expired = any(v.expired for v in found)
    else:
        left = [v for v in found if v.gone_since is not None]
        expired = bool(left) and all(v.expired for v in left)
    return WorkloadHealth(streams=streams, gone_since=gone, expired=expired)


ReportsListener = Callable[[], None]
#: Told of each change of this replica's own view of a workload (None: it holds none any more).
LocalListener = Callable[[WorkloadKey, "WorkloadHealth | None"], None]


class HealthReports:
    """Every health-checked workload's reports and stream presence; safe on any thread.

    What this server's streams say is its own view of a workload; with replicas sharing
    (`meshctl.registry.health_share`) the other replicas' views are laid beside it
    (`set_remote`) and a workload's health is their merge (`merge_views`). A view that
    disappears (its replica stopped, or its Consul session ran out) is remembered as gone since
    then, so the grace applies to it as to a stream that ended here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[WorkloadKey, WorkloadHealth] = {}
        self._remote: dict[WorkloadKey, dict[str, WorkloadHealth]] = {}
        self._memory: dict[WorkloadKey, dict[str, WorkloadHealth]] = {}
        self._merged: dict[WorkloadKey, WorkloadHealth] = {}
        self._listeners: list[ReportsListener] = []
        #: Called with this replica's own view after each change (to share it), outside the lock.
        self.on_local: LocalListener | None = None

    def subscribe(self, listener: ReportsListener) -> None:
        self._listeners.append(listener)

    def get(self, key: WorkloadKey) -> WorkloadHealth:
        """The workload's health as every view known here makes it."""
        return self._merged.get(key) or self._states.get(key, _UNKNOWN)

    def local(self, key: WorkloadKey) -> WorkloadHealth:
        """This server's own view of the workload (its streams here and their reports)."""
        return self._states.get(key, _UNKNOWN)

    def states(self) -> Mapping[WorkloadKey, WorkloadHealth]:
        with self._lock:
            return MappingProxyType({k: self.get(k) for k in self._states.keys() | self._merged.keys()})

    def report(self, key: WorkloadKey, healthy: bool, reason: str) -> None:
        """A report from the workload's Envoy (every probed port passing, or not, and why)."""

        def take(s: WorkloadHealth) -> WorkloadHealth:
            if (s.healthy, s.reason, s.expired) == (healthy, reason, False):
                return s
            return dataclasses.replace(s, healthy=healthy, reason=reason, expired=False, reported_at=time.time())

        self._update(key, take)

    def opened(self, key: WorkloadKey) -> None:
        self._update(key, lambda s: dataclasses.replace(s, streams=s.streams + 1, gone_since=None))

    def closed(self, key: WorkloadKey, now: float | None = None) -> None:
        at = time.time() if now is None else now

        def close(s: WorkloadHealth) -> WorkloadHealth:
            streams = max(0, s.streams - 1)
            return dataclasses.replace(s, streams=streams, gone_since=at if streams == 0 else None)

        self._update(key, close)

    def set_remote(
        self, views: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]], now: float | None = None
    ) -> None:
        """Take the other replicas' views (workload -> session -> shared value) as they are now."""
        at = time.time() if now is None else now
        parsed: dict[WorkloadKey, dict[str, WorkloadHealth]] = {}
        for key, by_session in views.items():
            for session, value in by_session.items():
                found = WorkloadHealth.from_json(value)
                if found is not None:
                    parsed.setdefault(key, {})[session] = found
        with self._lock:
            before = {k: self.get(k) for k in self._remote.keys() | parsed.keys()}
            for key, old in self._remote.items():
                for session, view in old.items():
                    if session not in parsed.get(key, {}):
                        # Gone with its replica's session: remembered as gone since now.
                        gone = dataclasses.replace(view, streams=0, gone_since=at) if view.streams else view
                        self._memory.setdefault(key, {})[session] = gone
            for key, new in parsed.items():
                for session in new:
                    self._memory.get(key, {}).pop(session, None)
            self._remote = parsed
            for key in before:
                self._remerge(key)
            changes = {k: (b, self.get(k)) for k, b in before.items()}
        self._announce(changes)

    def expire(self, grace: float, now: float | None = None) -> None:
        """Mark unhealthy every workload whose stream has been gone longer than `grace` seconds."""
        at = time.time() if now is None else now
        with self._lock:
            due = [
                k
                for k, s in self._states.items()
                if s.streams == 0 and s.gone_since is not None and not s.expired and at - s.gone_since >= grace
            ]
            changes: dict[WorkloadKey, tuple[WorkloadHealth, WorkloadHealth]] = {}
            for key, remembered in self._memory.items():
                for session, view in list(remembered.items()):
                    if view.gone_since is not None and not view.expired and at - view.gone_since >= grace:
                        before = changes[key][0] if key in changes else self.get(key)
                        remembered[session] = dataclasses.replace(view, expired=True)
                        self._remerge(key)
                        changes[key] = (before, self.get(key))
        self._announce(changes)
        for key in due:
            self._update(key, lambda s: s if s.streams else dataclasses.replace(s, expired=True))

    def next_expiry(self, grace: float) -> float | None:
        """The wall-clock time of the next `expire` that would change something, if any."""
        with self._lock:
            views = [*self._states.values(), *(v for m in self._memory.values() for v in m.values())]
            times = [s.gone_since + grace for s in views if s.gone_since is not None and not s.expired]
        return min(times) if times else None

    def forget(self, keep: Iterable[WorkloadKey]) -> None:
        """Drop what is held of workloads no longer checked (their entries deleted)."""
        wanted = set(keep)
        with self._lock:
            dropped = [k for k in self._states if k not in wanted and not self._states[k].streams]
            for key in dropped:
                del self._states[key]
            for table in (self._memory, self._merged):
                for key in [k for k in table if k not in wanted and k not in self._states]:
                    del table[key]
        if self.on_local is not None:
            for key in dropped:
                self.on_local(key, None)

    def republish(self, keys: Iterable[WorkloadKey]) -> None:
        """Tell `on_local` this server's views of `keys` again (they became checked)."""
        if self.on_local is None:
            return
        with self._lock:
            found = [(k, self._states[k]) for k in keys if k in self._states]
        for key, state in found:
            self.on_local(key, state)

    def _remerge(self, key: WorkloadKey) -> None:
        """Recompute the merged health of `key`; called with the lock held."""
        views = [*self._remote.get(key, {}).values(), *self._memory.get(key, {}).values()]
        if not views:
            self._merged.pop(key, None)
            return
        local = self._states.get(key)
        self._merged[key] = merge_views([local, *views] if local is not None else views)

    def _update(self, key: WorkloadKey, change: Callable[[WorkloadHealth], WorkloadHealth]) -> None:
        with self._lock:
            before_local = self._states.get(key, _UNKNOWN)
            after_local = change(before_local)
            if after_local == before_local:
                return
            before = self.get(key)
            self._states[key] = after_local
            self._remerge(key)
            after = self.get(key)
        self._announce({key: (before, after)})
        if self.on_local is not None:
            self.on_local(key, after_local)

    def _announce(self, changes: Mapping[WorkloadKey, tuple[WorkloadHealth, WorkloadHealth]]) -> None:
        """One log line per workload whose health changed; listeners once, if anything did."""
        changed = False
        for key, (before, after) in changes.items():
            if before == after:
                continue
            changed = True
            old, new = before.verdict(), after.verdict()
            if old[0] is not new[0]:
                logger.info("workload %s/%s is %s: %s", key[0], key[1], new[0].value, new[1])
        if not changed:
            return
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
        self._checks = workload_checks(files.checkable(), self._base)
        self._model = apply_health(self._base, self._checks, reports, self._base)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-health")
        self._pending = False
        #: (healthy, why not) of the replicas' shared health, when replicas share it.
        self.shared_status: Callable[[], tuple[bool, str]] | None = None
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
        """The file registry's status, and whether the replicas' shared health can be reached."""
        status = self._files.status()
        healthy, message = self.shared_status() if self.shared_status is not None else (True, "")
        if healthy:
            return status
        return dataclasses.replace(status, healthy=False, message="; ".join(m for m in (message, status.message) if m))

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
        checks = workload_checks(self._files.checkable(), base)
        with self._lock:
            added = checks.keys() - self._checks.keys()
            self._base, self._checks = base, checks
            self._rebuild(settled=True if change is None else change.settled)
        self._reports.forget(checks)
        self._reports.republish(added)

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
