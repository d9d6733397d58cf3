"""Inputs to snapshots: the config store (fed by the directory watcher) and the registries,
debounced into one new snapshot per burst of changes.

Changes arrive on the watcher's and the registries' threads; they only note the time and wake
the debounce task on the event loop. After 100 ms without a new change (or 10 s after the first,
however busy the inputs are, as istiod does) one snapshot is built from everything current and
handed to the server. An input that fails keeps what it had: the store keeps a broken file's
last good resources and Consul's registry keeps its last endpoints, so a snapshot never loses
config because an input failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from meshctl.config.store import ConfigChange, ConfigStore
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.model import RegistryChange
from meshctl.snapshot.model import MeshSettings, Snapshot, build_snapshot

logger = logging.getLogger("meshctl.server.discovery")

Publisher = Callable[[Snapshot, float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DebounceSettings:
    quiet: float = 0.1
    max_delay: float = 10.0


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why a snapshot was built, for pilot_push_triggers."""

    config: int = 0
    endpoint: int = 0
    service: int = 0


class Discovery:
    """Owns the debounce and the current snapshot."""

    def __init__(
        self,
        store: ConfigStore,
        registry: AggregateRegistry,
        publish: Publisher,
        *,
        mesh: MeshSettings | None = None,
        debounce: DebounceSettings | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._publish = publish
        self._mesh = mesh or MeshSettings()
        self._debounce = debounce or DebounceSettings()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()
        self._first: float | None = None
        self._last = 0.0
        self._pending = Trigger()
        self.snapshot: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None
        #: Observers for metrics: called with (debounce seconds, trigger counts) per snapshot.
        self.on_debounced: Callable[[float, Trigger], None] = lambda _t, _tr: None

    # -- inputs (any thread) -----------------------------------------------------------------

    def config_changed(self, _change: ConfigChange) -> None:
        self._notify(Trigger(config=1))

    def registry_changed(self, change: RegistryChange) -> None:
        self._notify(Trigger(endpoint=1) if change.endpoint_only else Trigger(service=1))

    def _notify(self, trigger: Trigger) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._mark, trigger)

    def _mark(self, trigger: Trigger) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        self._last = now
        p = self._pending
        self._pending = Trigger(p.config + trigger.config, p.endpoint + trigger.endpoint, p.service + trigger.service)
        self._event.set()

    # -- the loop ----------------------------------------------------------------------------

    def build(self) -> Snapshot:
        return build_snapshot(self._store.configs.values(), self._registry.model(), self._mesh)

    async def start(self) -> Snapshot:
        """Build the first snapshot and start following changes."""
        self._loop = asyncio.get_running_loop()
        self._store.subscribe(self.config_changed)
        self._registry.subscribe(self.registry_changed)
        self.snapshot = self.build()
        self._task = asyncio.create_task(self._run(), name="meshctl-debounce")
        return self.snapshot

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def trigger_now(self) -> None:
        """Rebuild at once (SIGHUP), without waiting for the quiet period."""
        self._mark(Trigger(config=1))
        self._first = time.monotonic() - self._debounce.max_delay

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            while True:
                now = time.monotonic()
                first = self._first if self._first is not None else now
                wait = min(self._last + self._debounce.quiet - now, first + self._debounce.max_delay - now)
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            self._event.clear()
            trigger, self._pending = self._pending, Trigger()
            started = self._first or time.monotonic()
            self._first = None
            try:
                snapshot = self.build()
            except Exception:
                logger.exception("building a snapshot failed; proxies keep the previous config")
                continue
            self.on_debounced(time.monotonic() - started, trigger)
            if self.snapshot is not None and snapshot.version == self.snapshot.version:
                continue
            self.snapshot = snapshot
            logger.info(
                "snapshot %s: %d configs, %d services",
                snapshot.version,
                len(snapshot.configs),
                len(snapshot.services.services),
            )
            try:
                await self._publish(snapshot, started)
            except Exception:
                logger.exception("publishing snapshot %s failed", snapshot.version)
