"""Inputs to snapshots: the config store (fed by the directory watcher) and the registries,
debounced into one new snapshot per burst of changes.

Changes arrive on the watcher's and the registries' threads; they only note the time and wake
the debounce task on the event loop. After 100 ms without a new change (or 10 s after the first,
however busy the inputs are, as istiod does) one snapshot is built from everything current and
handed to the server. An input that fails keeps what it had: the store keeps a broken file's
last good resources and Consul's registry keeps its last endpoints, so a snapshot never loses
config because an input failed; a build that fails publishes nothing, and the next change tries
again.

Builds run on a worker thread of their own, never on the event loop: at a thousand services a
build takes a good fraction of a second, during which no stream could be read or written.
Reading the inputs from that thread needs no lock. The store hands out an immutable view swapped
in one assignment, and every registry publishes a frozen `ServiceModel` the same way, so a build
reads one consistent revision of each while the watcher and Consul threads write the next.

Order: the debounce task awaits each build and its publication before it starts the next, and the
worker is a single thread, so builds never overlap and snapshots are published in the order of
the changes. The thread is Discovery's own rather than the ADS servicer's generation thread, which
works through a whole fleet after each publication: a build queued there would wait behind that,
and a proxy connecting meanwhile would wait behind the build. Nor is it the default executor
(`asyncio.to_thread`): that is a pool, shared with the watcher's loads, in which only the debounce
task's discipline would keep two builds apart; a thread of its own makes that a property of the
thread, even for a build that `stop` abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from meshctl.config.findings import format_path
from meshctl.config.gateway_api.status import Condition
from meshctl.config.store import ConfigChange, ConfigStore
from meshctl.debounce import Debouncer
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.model import RegistryChange
from meshctl.snapshot.collectors import collector_problems
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

    def __add__(self, other: Trigger) -> Trigger:
        return Trigger(self.config + other.config, self.endpoint + other.endpoint, self.service + other.service)


class Discovery:
    """Owns the debounce and the current snapshot; started once and stopped once."""

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
        #: The burst of changes since the last build (`meshctl.debounce`); on the loop only.
        self._burst = Debouncer(self._debounce.quiet, self._debounce.max_delay)
        self._pending = Trigger()
        #: Changes waiting for the store's delivery to end (`_hold`), and whether all were settled.
        self._held: tuple[Trigger, bool] | None = None
        self._held_lock = threading.Lock()
        #: The snapshot last published; written on the event loop only.
        self.snapshot: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None
        # Created here, started on first use: a Discovery that never starts costs no thread.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-snapshot")
        #: (store revision, snapshot) of the last build on the worker, which the next one updates.
        self._base: tuple[int, Snapshot] | None = None
        #: The collector problems last warned of (`_warn_collectors`); on the worker only.
        self._collector_problems: list[str] = []
        self._gateway_api_warned: set[Condition] = set()
        #: Observers for metrics: called with (debounce seconds, trigger counts) per snapshot.
        self.on_debounced: Callable[[float, Trigger], None] = lambda _t, _tr: None

    @property
    def mesh(self) -> MeshSettings:
        """The mesh-wide settings the next snapshot is built with."""
        return self._mesh

    # -- inputs (any thread) -----------------------------------------------------------------

    def config_changed(self, _change: ConfigChange) -> None:
        # The store changes once the watcher saw the files quiet for its own debounce.
        self._hold(Trigger(config=1), settled=True)

    def set_mesh(self, mesh: MeshSettings) -> None:
        """New mesh-wide settings (a MeshConfig file changed): the next snapshot uses them."""
        self._mesh = mesh
        self._notify(Trigger(config=1))

    def registry_changed(self, change: RegistryChange) -> None:
        self._hold(Trigger(endpoint=1) if change.endpoint_only else Trigger(service=1), settled=change.settled)

    def _hold(self, trigger: Trigger, *, settled: bool) -> None:
        """Wake the build for a change, or, while the store is handing a change to its followers
        on this thread, once they all have it. One file edit reaches the build as the file
        registry's change (a ServiceEntry), then the store's: when the loop woke between the two
        (it did for about half of the edits of `bench/envoy_edit.py`), the first started a build
        and the second another, which found nothing new."""
        with self._held_lock:
            first = self._held is None
            held, all_settled = self._held or (Trigger(), True)
            self._held = (held + trigger, all_settled and settled)
        if first:
            self._store.after_delivery(self._release)

    def _release(self) -> None:
        with self._held_lock:
            held, self._held = self._held, None
        if held is not None:
            self._notify(held[0], settled=held[1])

    def _notify(self, trigger: Trigger, *, settled: bool = False) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # The loop may close between the check and the call (a registry thread outliving the
        # server); a change nobody will build is no error.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._mark, trigger, settled)

    def _mark(self, trigger: Trigger, settled: bool = False) -> None:
        self._burst.note(time.monotonic(), settled=settled)
        self._pending += trigger
        self._event.set()

    # -- building (the worker thread) --------------------------------------------------------

    def build(self) -> Snapshot:
        """A snapshot of the inputs as they are now, built from scratch; safe on any thread (see
        the module docstring)."""
        return build_snapshot(self._store.view().configs, self._registry.model(), self._mesh)

    def build_next(self) -> Snapshot:
        """The snapshot of the inputs as they are now, built from the one this method built last
        and the config keys changed since (`ConfigStore.changed_since`): the same snapshot as
        `build`, at the cost of what changed. Called on the worker thread only (the debounce
        task's builds, in order), which alone touches what it remembers."""
        base = self._base
        if base is None:
            view, changed, previous = self._store.view(), None, None
        else:
            view, changed = self._store.changed_since(base[0])
            previous = base[1]
        snapshot = build_snapshot(view.configs, self._registry.model(), self._mesh, previous=previous, changed=changed)
        self._base = (view.revision, snapshot)
        self._warn_gateway_api(snapshot)
        return snapshot

    def _warn_gateway_api(self, snapshot: Snapshot) -> None:
        """Log the Gateway API status conditions (`meshctl validate` reports them too) once each,
        when they first appear: a route that attached nowhere serves nothing, and says why only here."""
        conditions = set(snapshot.gateway_api.conditions)
        for condition in sorted(conditions - self._gateway_api_warned, key=lambda c: (str(c.key), c.path)):
            config = snapshot.configs.get(condition.key)
            place = f"{config.source} " if config is not None else ""
            logger.warning("%s%s %s: %s", place, condition.key, format_path(condition.path), condition.text())
        self._gateway_api_warned = conditions

    def _build_new(self, current: str | None) -> Snapshot:
        """On the worker: `build_next`, and, for a snapshot that differs from version `current`,
        its index, so that neither the loop (the identity check binds proxies there) nor the
        first stream to generate pays for it."""
        snapshot = self.build_next()
        if snapshot.version != current:
            snapshot.index.endpoints_at("")  # builds the index and its lookup by address
            self._warn_collectors(snapshot)
        return snapshot

    def _warn_collectors(self, snapshot: Snapshot) -> None:
        """Say once (until it changes) which tracing and log collectors the registry lacks:
        their providers are left out of every proxy's config (`snapshot/collectors.py`)."""
        problems = [f"MeshConfig {p.field}.service: {why}" for p, why in collector_problems(snapshot)]
        if problems != self._collector_problems:
            for problem in problems:
                logger.warning("%s", problem)
            self._collector_problems = problems

    async def _build_off_loop(self) -> Snapshot:
        current = self.snapshot.version if self.snapshot is not None else None
        return await asyncio.get_running_loop().run_in_executor(self._worker, self._build_new, current)

    # -- the loop ----------------------------------------------------------------------------

    async def start(self) -> Snapshot:
        """Build the first snapshot and start following changes."""
        self._loop = asyncio.get_running_loop()
        self._store.subscribe(self.config_changed)
        self._registry.subscribe(self.registry_changed)
        self.snapshot = await self._build_off_loop()
        self._task = asyncio.create_task(self._run(), name="meshctl-debounce")
        return self.snapshot

    async def stop(self) -> None:
        """Stop following changes, without waiting for a build in progress.

        A build cannot be interrupted; it finishes on the worker and its snapshot is dropped.
        The worker thread then ends (the interpreter waits for it at exit, at most one build)."""
        self._loop = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._worker.shutdown(wait=False, cancel_futures=True)

    def trigger_now(self) -> None:
        """Rebuild at once (SIGHUP), without waiting for the quiet period."""
        self._mark(Trigger(config=1))
        self._burst.force(time.monotonic())

    async def _settle(self) -> None:
        """Return once the inputs have been quiet for `quiet`, or `max_delay` after the first change.

        Changes that arrive settled (the config files: the watcher waited for them to be quiet
        for its own debounce, and the file registry's changes follow from them) are built at
        once: a second quiet period would only add its length to every edit's way to Envoy."""
        while (due := self._burst.due()) is not None and (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            await self._settle()
            # Changes from here on wake the next round: the build below may or may not see them.
            self._event.clear()
            trigger, self._pending = self._pending, Trigger()
            started = self._burst.take() or time.monotonic()
            try:
                snapshot = await self._build_off_loop()
            except Exception:
                logger.exception(
                    "building a snapshot (after %d config, %d service and %d endpoint changes) failed;"
                    " proxies keep version %s until the next change builds one",
                    trigger.config,
                    trigger.service,
                    trigger.endpoint,
                    self.snapshot.version if self.snapshot is not None else "(none)",
                )
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
