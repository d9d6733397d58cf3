"""What the fleet keeps alive leaves the cyclic collector's reach once the server is quiet, so a
change's collections do not walk every stream's objects; garbage in cycles among them is still
freed, by a whole collection at most every `full_every` seconds."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ads_client_leaves import big_mesh

from meshctl.server.collector import QuietFreezer
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving


class _Node:
    """An object the collector tracks, in a cycle with itself."""

    def __init__(self) -> None:
        self.me = self


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    """Every test starts and ends with nothing frozen in this process."""
    gc.unfreeze()
    yield
    gc.unfreeze()


async def _until(condition: object, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)


def test_what_is_alive_is_frozen_once_quiet_and_not_while_busy() -> None:
    async def test() -> None:
        clock = _Clock()
        kept = [_Node() for _ in range(1000)]
        freezer = QuietFreezer(asyncio.get_running_loop(), quiet=0.02, full_every=3600, clock=clock)
        freezer.busy()
        # Busy as far as the freezer's clock says: the timer fires and waits again.
        await asyncio.sleep(0.2)
        assert freezer.freezes == 0 and gc.get_freeze_count() == 0
        clock.now = 1.0
        await _until(lambda: freezer.freezes == 1)
        assert freezer.freezes == 1 and freezer.full_collections == 0
        assert gc.get_freeze_count() >= len(kept)
        # Nothing happened since: no second freeze.
        await asyncio.sleep(0.1)
        assert freezer.freezes == 1
        freezer.stop()

    asyncio.run(test())


def test_cycles_frozen_and_dropped_are_freed_by_the_next_whole_collection() -> None:
    async def test() -> None:
        clock = _Clock()
        freezer = QuietFreezer(asyncio.get_running_loop(), quiet=0.02, full_every=600, clock=clock)
        node = _Node()
        gone = weakref.ref(node)
        clock.now = 1.0
        freezer.busy()
        clock.now = 2.0
        await _until(lambda: freezer.freezes == 1)
        del node
        gc.collect()
        assert gone() is not None  # frozen: out of the collector's reach, as the fleet's objects
        clock.now = 700.0  # a whole collection is due at the next quiet moment
        freezer.busy()
        clock.now = 701.0
        await _until(lambda: freezer.freezes == 2)
        assert freezer.full_collections == 1
        assert gone() is None
        freezer.stop()

    asyncio.run(test())


def test_the_servicer_freezes_once_a_connected_proxy_has_its_config_and_all_is_quiet(tmp_path: Path) -> None:
    mesh = big_mesh(tmp_path, services=20)

    async def test() -> None:
        clock = _Clock()
        async with serving(mesh) as server:
            freezer = QuietFreezer(asyncio.get_running_loop(), quiet=0.02, full_every=3600, clock=clock)
            server.ads.quiet_freezer = freezer
            client = AdsClient(f"127.0.0.1:{server.xds_port}", "sidecar~10.40.3.1~client.shop~shop.svc.cluster.local")
            await client.start()
            try:
                await client.wait_for(lambda c: c.complete(), timeout=30)

                def later() -> bool:
                    # Time passes on the freezer's clock while the test waits: the server's last
                    # write may end (and count as busy) after the client already holds its
                    # config, and a clock set once, before that, would never be quiet after it.
                    clock.now += 1.0
                    return freezer.freezes == 1

                await _until(later)
                assert freezer.freezes == 1
            finally:
                await client.close()
                freezer.stop()

    run(test)
