"""The debounce and the snapshot build: off the event loop, in order, and failing safe.

The registry here is scripted: the test sets its model and says when it changed, and can hold a
read on a gate (a build that takes as long as the test wants) or make one fail. A build held on
the event loop would stop the test's own coroutines, so each "the loop keeps going" check
releases the gate from the loop: on the loop the gate would time out instead, and the test fails
rather than hangs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from meshctl.config.model import Config, make_config, spec_class
from meshctl.config.store import ConfigStore
from meshctl.registry.aggregate import AggregateRegistry
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import Protocol, RegistryChange, Service, ServiceModel, ServicePort, make_model
from meshctl.server.discovery import DebounceSettings, Discovery, Trigger
from meshctl.snapshot.model import Snapshot

#: How long a held read waits for the test to release it before giving up (a failed test).
HOLD = 5.0
FAST = DebounceSettings(quiet=0.02, max_delay=1.0)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def services(*hosts: str) -> ServiceModel:
    port = (ServicePort("http", 80, Protocol.HTTP),)
    return make_model([Service(h, "default", port) for h in hosts], {})


@dataclass(eq=False)
class Gate:
    """Holds one registry read until `release` is set; `released` says whether it was, in time."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    released: bool | None = None


class ScriptedRegistry(AggregateRegistry):
    """An aggregate with no members whose model the test sets; reads can be held or made to fail."""

    def __init__(self, model: ServiceModel) -> None:
        super().__init__([])
        self.current = model
        self.gates: deque[Gate] = deque()
        self.failures: deque[Exception] = deque()
        self.threads: list[threading.Thread] = []
        self._counting = threading.Lock()
        self.active = 0
        self.most_active = 0

    def hold_next(self) -> Gate:
        gate = Gate()
        self.gates.append(gate)
        return gate

    def change(self, model: ServiceModel) -> None:
        """What a registry thread does: swap the model, then tell the listeners."""
        self.current = model
        for listener in list(self._listeners):
            listener(RegistryChange(frozenset(model.services), endpoint_only=False))

    def model(self) -> ServiceModel:
        with self._counting:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            self.threads.append(threading.current_thread())
            model = self.current  # the inputs as they were when this build began
            gate = self.gates.popleft() if self.gates else None
            if gate is not None:
                gate.entered.set()
                gate.released = gate.release.wait(HOLD)
            if self.failures:
                raise self.failures.popleft()
            return model
        finally:
            with self._counting:
                self.active -= 1


class Published:
    """The publisher: records each snapshot handed to the server, in order."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []
        self.times: list[float] = []
        self.debounced: list[tuple[float, Trigger]] = []
        self._changed = asyncio.Event()

    async def __call__(self, snapshot: Snapshot, _seen: float) -> None:
        self.snapshots.append(snapshot)
        self.times.append(time.monotonic())
        self._changed.set()

    def hosts(self) -> list[list[str]]:
        return [sorted(s.services.services) for s in self.snapshots]

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        async def reached() -> None:
            while len(self.snapshots) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), timeout)


@dataclass
class Running:
    discovery: Discovery
    registry: ScriptedRegistry
    store: ConfigStore
    published: Published


@asynccontextmanager
async def running(
    model: ServiceModel | None = None, debounce: DebounceSettings = FAST, store: ConfigStore | None = None
) -> AsyncIterator[Running]:
    registry = ScriptedRegistry(model if model is not None else services("a.mesh"))
    store = store or ConfigStore()
    published = Published()
    discovery = Discovery(store, registry, published, debounce=debounce)
    discovery.on_debounced = lambda seconds, trigger: published.debounced.append((seconds, trigger))
    await discovery.start()
    try:
        yield Running(discovery, registry, store, published)
    finally:
        for gate in registry.gates:
            gate.release.set()
        await discovery.stop()


async def change_from_a_thread(registry: ScriptedRegistry, model: ServiceModel) -> None:
    await asyncio.to_thread(registry.change, model)


async def entered(gate: Gate) -> None:
    assert await asyncio.to_thread(gate.entered.wait, HOLD), "the build never read the registry"


class Ticker:
    """A coroutine on the loop that counts its wake-ups: it stops counting if the loop is blocked."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.005)

    async def advances(self, ticks: int, within: float = 10.0) -> bool:
        """Whether the ticker wakes `ticks` times while this coroutine waits: never, when a build
        holds the loop (the gate it waits on is released from the loop), and with time to spare
        on a loaded machine otherwise (a count per fixed interval failed under load)."""
        target = self.ticks + ticks
        end = time.monotonic() + within
        while self.ticks < target and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return self.ticks >= target


def test_the_defaults_are_istios() -> None:
    assert DebounceSettings() == DebounceSettings(quiet=0.1, max_delay=10.0)


def test_a_build_runs_on_a_worker_thread_while_the_loop_keeps_serving() -> None:
    async def test() -> None:
        ticker = Ticker()
        ticking = asyncio.create_task(ticker.run())
        async with running() as r:
            gate = r.registry.hold_next()
            await change_from_a_thread(r.registry, services("a.mesh", "b.mesh"))
            await entered(gate)
            # The build is inside the registry read: the loop still runs other coroutines.
            assert await ticker.advances(5)
            assert r.published.snapshots == []
            assert r.discovery.snapshot is not None
            assert sorted(r.discovery.snapshot.services.services) == ["a.mesh"]
            gate.release.set()
            await r.published.wait_for(1)
            assert gate.released, "the build held the loop until the gate timed out"
            assert r.registry.threads[-1] is not threading.current_thread()
            assert r.published.hosts() == [["a.mesh", "b.mesh"]]
            assert r.discovery.snapshot is r.published.snapshots[0]
        ticking.cancel()

    run(test)


def test_the_first_build_runs_off_the_loop_too() -> None:
    async def test() -> None:
        ticker = Ticker()
        ticking = asyncio.create_task(ticker.run())
        registry = ScriptedRegistry(services("a.mesh"))
        gate = registry.hold_next()
        discovery = Discovery(ConfigStore(), registry, Published(), debounce=FAST)
        starting = asyncio.create_task(discovery.start())
        await entered(gate)
        assert await ticker.advances(5)
        gate.release.set()
        first = await starting
        assert gate.released and sorted(first.services.services) == ["a.mesh"]
        await discovery.stop()
        ticking.cancel()

    run(test)


def test_changes_during_a_slow_build_wait_for_it_and_are_published_after_it() -> None:
    async def test() -> None:
        async with running() as r:
            gate = r.registry.hold_next()
            await change_from_a_thread(r.registry, services("a.mesh", "b.mesh"))
            await entered(gate)
            await change_from_a_thread(r.registry, services("a.mesh", "b.mesh", "c.mesh"))
            # Well past the quiet period: a second build would have started (and finished) by now.
            await asyncio.sleep(10 * FAST.quiet)
            assert r.published.snapshots == []
            assert r.registry.most_active == 1
            gate.release.set()
            await r.published.wait_for(2)
            assert r.published.hosts() == [["a.mesh", "b.mesh"], ["a.mesh", "b.mesh", "c.mesh"]]
            # The older build's snapshot went first and the newer one is what stays.
            assert r.discovery.snapshot is r.published.snapshots[-1]
            assert r.registry.most_active == 1
            await asyncio.sleep(5 * FAST.quiet)
            assert len(r.published.snapshots) == 2

    run(test)


def test_a_burst_of_changes_is_one_build_after_the_quiet_period() -> None:
    async def test() -> None:
        async with running(debounce=DebounceSettings()) as r:
            reads = len(r.registry.threads)
            last = 0.0
            for i in range(5):
                # Taken before the change: the quiet period starts when the change arrives, which
                # is later, so the build is at least 0.1 s after this whatever the machine's load
                # (after the sleep below it need not be: a busy machine can stretch that sleep).
                last = time.monotonic()
                await change_from_a_thread(r.registry, services("a.mesh", f"b{i}.mesh"))
                await asyncio.sleep(0.03)
            await r.published.wait_for(1)
            assert r.published.times[0] - last >= 0.1 - 0.01
            assert r.published.hosts() == [["a.mesh", "b4.mesh"]]
            assert len(r.registry.threads) == reads + 1
            assert [trigger for _, trigger in r.published.debounced] == [Trigger(service=5)]

    run(test)


def test_changes_that_never_stop_are_still_built_after_max_delay() -> None:
    async def test() -> None:
        debounce = DebounceSettings(quiet=0.2, max_delay=0.5)
        async with running(debounce=debounce) as r:
            first = time.monotonic()
            i = 0
            # Never quiet for 0.2 s: without the max delay nothing would be built until the end.
            while time.monotonic() - first < 1.6:
                await change_from_a_thread(r.registry, services("a.mesh", f"b{i}.mesh"))
                i += 1
                await asyncio.sleep(0.05)
            ended = time.monotonic()
            during = [t for t in r.published.times if t < ended]
            assert len(during) >= 2
            assert during[0] - first >= debounce.max_delay - 0.01
            seconds, _ = r.published.debounced[0]
            assert seconds >= debounce.max_delay - 0.01

    run(test)


def test_trigger_now_builds_without_waiting_for_quiet() -> None:
    async def test() -> None:
        async with running(debounce=DebounceSettings(quiet=60.0, max_delay=120.0)) as r:
            r.registry.current = services("a.mesh", "b.mesh")
            r.discovery.trigger_now()
            await r.published.wait_for(1, timeout=5.0)
            assert r.published.hosts() == [["a.mesh", "b.mesh"]]

    run(test)


def test_a_failed_build_keeps_the_last_snapshot_and_the_next_change_retries(caplog: pytest.LogCaptureFixture) -> None:
    async def test() -> None:
        async with running() as r:
            before = r.discovery.snapshot
            r.registry.failures.append(RuntimeError("consul answered garbage"))
            await change_from_a_thread(r.registry, services("a.mesh", "b.mesh"))
            deadline = time.monotonic() + 5
            while not any("building a snapshot" in m for m in caplog.messages):
                assert time.monotonic() < deadline, "the failed build was not logged"
                await asyncio.sleep(0.01)
            record = next(rec for rec in caplog.records if "building a snapshot" in rec.getMessage())
            assert record.levelno == logging.ERROR and record.exc_info is not None
            assert "consul answered garbage" in caplog.text
            assert r.discovery.snapshot is before
            assert r.published.snapshots == []
            await change_from_a_thread(r.registry, services("a.mesh", "c.mesh"))
            await r.published.wait_for(1)
            assert r.published.hosts() == [["a.mesh", "c.mesh"]]
            assert r.discovery.snapshot is r.published.snapshots[0]

    with caplog.at_level(logging.ERROR, logger="meshctl.server.discovery"):
        run(test)


def test_stopping_during_a_build_neither_waits_for_it_nor_publishes_it() -> None:
    async def test() -> None:
        async with running() as r:
            before = r.discovery.snapshot
            gate = r.registry.hold_next()
            await change_from_a_thread(r.registry, services("a.mesh", "b.mesh"))
            await entered(gate)
            await asyncio.wait_for(r.discovery.stop(), 1.0)
            gate.release.set()
            worker = r.registry.threads[-1]
            assert worker is not threading.current_thread()
            deadline = time.monotonic() + HOLD
            while worker.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert not worker.is_alive(), "the build's thread outlived stop()"
            assert gate.released
            assert r.published.snapshots == []
            assert r.discovery.snapshot is before
            # Changes after the stop are ignored, not errors.
            await change_from_a_thread(r.registry, services("a.mesh", "c.mesh"))
            await asyncio.sleep(5 * FAST.quiet)
            assert r.published.snapshots == []

    run(test)


def _generation(n: int, count: int = 20) -> list[Config]:
    spec = spec_class("VirtualService")
    return [
        make_config("VirtualService", f"vs-{i}", "shop", spec(hosts=[f"h{i}.mesh"]), labels={"generation": str(n)})
        for i in range(count + n % 3)
    ]


def test_a_build_reads_one_store_revision_while_the_watcher_thread_writes() -> None:
    async def test() -> None:
        store = ConfigStore()
        store.replace_all(_generation(0))
        stop = threading.Event()

        def write() -> None:
            n = 1
            while not stop.is_set():
                store.replace_all(_generation(n))
                n += 1
                time.sleep(0.001)

        async with running(debounce=DebounceSettings(quiet=0.0, max_delay=0.01), store=store) as r:
            writer = threading.Thread(target=write, name="writer")
            writer.start()
            try:
                await r.published.wait_for(5)
            finally:
                stop.set()
                await asyncio.to_thread(writer.join)
        for snapshot in r.published.snapshots:
            generations = {c.labels["generation"] for c in snapshot.configs.values()}
            assert len(generations) == 1
            (n,) = generations
            assert len(snapshot.configs) == len(_generation(int(n)))

    run(test)


def _entry(name: str) -> Config:
    spec = spec_class("ServiceEntry")(
        hosts=[f"{name}.shop.mesh"],
        location="MESH_INTERNAL",
        ports=[{"number": 80, "name": "http", "protocol": "HTTP"}],
    )
    return make_config("ServiceEntry", name, "shop", spec)


def test_a_file_edit_adding_a_service_is_one_build_though_the_registry_hears_of_it_first() -> None:
    """The file registry follows the store and tells the build of the new service before the
    store does; a follower in between that takes its time on the watcher's thread makes sure
    the loop wakes between the two. The build waits for the whole delivery: one build with both, not one woken by the
    registry's half and another that finds nothing new."""

    async def test() -> None:
        store = ConfigStore()
        files = FileRegistry()
        files.follow(store)
        store.subscribe(lambda _change: time.sleep(0.3))  # a slow follower after the registry
        published = Published()
        discovery = Discovery(store, AggregateRegistry([files]), published, debounce=FAST)
        discovery.on_debounced = lambda seconds, trigger: published.debounced.append((seconds, trigger))
        await discovery.start()
        try:
            await asyncio.to_thread(store.update, {(c := _entry("a")).key: c}, files={})
            await published.wait_for(1)
            await asyncio.sleep(0.5)  # a second build, if one came, is done by now
            assert [t for _, t in published.debounced] == [Trigger(config=1, service=1)]
            assert "a.shop.mesh" in published.snapshots[-1].services.services
        finally:
            await discovery.stop()

    run(test)
