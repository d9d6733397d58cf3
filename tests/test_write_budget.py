"""The bound on response bytes in gRPC's hands at once: a fleet connecting together waits its
turn for room instead of doubling the server's memory, and a client that stops reading never
holds the others' room for longer than the linger."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from test_ads_client_leaves import METHOD, big_mesh

from meshctl.server.app import Server
from meshctl.server.write_budget import CHANGE_FACTOR, WriteBudget
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.server import run, serving
from meshctl.xds import types


def _services(client: AdsClient) -> int:
    return sum(name.startswith("outbound|") for name in client.resources[types.CLUSTER])


@contextlib.asynccontextmanager
async def _twelve_clients(server: Server, subnet: int) -> AsyncIterator[list[AdsClient]]:
    """Twelve sidecars of `shop` connected together to `server`, closed at the end."""
    address = f"127.0.0.1:{server.xds_port}"
    clients = [
        AdsClient(address, f"sidecar~10.40.{subnet}.{i}~client-{i}.shop~shop.svc.cluster.local") for i in range(12)
    ]
    for client in clients:
        await client.start()
    try:
        yield clients
    finally:
        for client in clients:
            await client.close()


def test_room_is_given_in_turn_and_a_large_write_goes_alone() -> None:
    async def test() -> None:
        budget = WriteBudget(limit=100, linger=60)
        first = await budget.take(60)
        order: list[str] = []

        async def wait(name: str, size: int) -> None:
            hold = await budget.take(size)
            order.append(name)
            await asyncio.sleep(0.01)
            budget.give_back(hold)

        # 50 does not fit beside 60; 10 would, but waits behind it (first come, first served).
        tasks = [asyncio.create_task(wait("fifty", 50)), asyncio.create_task(wait("ten", 10))]
        await asyncio.sleep(0.05)
        assert order == [] and budget.held == 60
        budget.give_back(first)
        await asyncio.gather(*tasks)
        assert order == ["fifty", "ten"] and budget.held == 0
        # Larger than the whole budget: written when nothing else is.
        big = await budget.take(1_000)
        assert budget.held == 1_000 and budget.peak == 1_000
        budget.give_back(big)
        budget.give_back(big)  # twice is once
        assert budget.held == 0

    asyncio.run(test())


def test_a_write_stops_counting_after_the_linger_and_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def test() -> None:
        budget = WriteBudget(limit=100, linger=0.1)
        stuck = await budget.take(100)  # a client that never reads: never given back
        cancelled = asyncio.create_task(budget.take(100))
        behind = asyncio.create_task(budget.take(100))
        await asyncio.sleep(0.02)
        cancelled.cancel()
        hold = await asyncio.wait_for(behind, 5)
        assert budget.lingered == 1 and budget.held == 100
        budget.give_back(hold)
        budget.give_back(stuck)  # late: the linger gave its room back already
        assert budget.held == 0

    asyncio.run(test())


def test_a_change_waits_only_for_changes_and_goes_before_first_responses() -> None:
    async def test() -> None:
        budget = WriteBudget(limit=100, linger=60, change_limit=400)
        connect = await budget.take(90)
        # A first response waits beyond 100 bytes; a change's push only beyond 400.
        late_connect = asyncio.create_task(budget.take(50))
        change = await asyncio.wait_for(budget.take(200, first=False), 1)
        await asyncio.sleep(0.02)
        assert not late_connect.done() and budget.held == 290
        # Full for changes too: when room comes, the waiting change goes before the connect.
        big_change = await budget.take(110, first=False)
        order: list[str] = []
        waiting_change = asyncio.create_task(budget.take(10, first=False))
        waiting_change.add_done_callback(lambda _: order.append("change"))
        late_connect.add_done_callback(lambda _: order.append("connect"))
        await asyncio.sleep(0.02)
        assert order == []
        for hold in (connect, change, big_change):
            budget.give_back(hold)
        await asyncio.wait_for(asyncio.gather(late_connect, waiting_change), 1)
        assert order == ["change", "connect"]
        assert budget.first_waits.count == 1 and budget.change_waits.count == 1
        budget.give_back(late_connect.result())
        budget.give_back(waiting_change.result())
        assert budget.held == 0

    asyncio.run(test())


@pytest.mark.slow
def test_a_change_reaches_a_connected_fleet_without_waiting_for_room(tmp_path: Path) -> None:
    mesh = big_mesh(tmp_path, services=600)

    async def test() -> None:
        async with serving(mesh) as server:
            # Room for about one first-cluster response among twelve proxies: their connects wait.
            budget = server.ads.write_budget = WriteBudget(limit=600_000, linger=30)
            async with _twelve_clients(server, 2) as clients:
                for client in clients:
                    await client.wait_for(lambda c: c.complete() and _services(c) == 600, timeout=60)
                connects_waited = budget.waited
                assert connects_waited > 0, "no connect waited: the budget was not in the way"
                # One more service: every proxy is pushed its whole cluster set again, twelve
                # responses larger than the bound on first responses, and none waits for room.
                big_mesh(tmp_path, services=601)
                for client in clients:
                    await client.wait_for(lambda c: c.complete() and _services(c) == 601, timeout=60)
            assert budget.waited == connects_waited, "the change's pushes waited for room"
            assert budget.lingered == 0

    run(test, timeout=120)


@pytest.mark.slow
def test_a_fleet_connecting_together_waits_for_room_and_every_proxy_converges(tmp_path: Path) -> None:
    mesh = big_mesh(tmp_path, services=600)

    async def test() -> None:
        async with serving(mesh) as server:
            # A budget of about two first-cluster responses among twelve proxies: most wait.
            budget = server.ads.write_budget = WriteBudget(limit=600_000, linger=30)
            async with _twelve_clients(server, 1) as clients:
                for client in clients:
                    await client.wait_for(lambda c: _services(c) == 600, timeout=60)
            assert budget.waited > 0, "no write waited: the budget was not in the way"
            assert budget.peak <= budget.limit
            assert budget.lingered == 0

    run(test, timeout=120)


@pytest.mark.slow
def test_a_client_that_stops_reading_holds_the_room_no_longer_than_the_linger(tmp_path: Path) -> None:
    mesh = big_mesh(tmp_path)

    async def test() -> None:
        async with serving(mesh) as server:
            # Smaller than one first-cluster response: each write goes alone.
            budget = server.ads.write_budget = WriteBudget(limit=1_000, linger=1.0)
            address = f"127.0.0.1:{server.xds_port}"
            options = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 1 << 30)]
            async with grpc.aio.insecure_channel(address, options=options) as channel:
                hog = channel.stream_stream(
                    METHOD,
                    request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
                )()
                request = discovery_pb2.DiscoveryRequest(type_url=types.CLUSTER)
                request.node.id = "sidecar~10.40.0.9~client.shop~shop.svc.cluster.local"
                await hog.write(request)
                # Its write waits on flow control for good: this client never reads.
                for _ in range(100):
                    if budget.held:
                        break
                    await asyncio.sleep(0.05)
                assert budget.held, "the hog's response was never handed to gRPC"
                async with AdsClient(address, "sidecar~10.40.0.10~other.shop~shop.svc.cluster.local") as good:
                    await good.wait_for(lambda c: _services(c) == 1500, timeout=30)
                assert budget.lingered >= 1
                hog.cancel()

    run(test, timeout=90)


def test_the_bound_is_the_serve_setting_and_zero_turns_it_off(tmp_path: Path) -> None:
    mesh = big_mesh(tmp_path, services=3)

    async def test() -> None:
        async with serving(mesh, max_write_bytes=0) as server:
            assert server.ads.write_budget is None
            async with AdsClient(
                f"127.0.0.1:{server.xds_port}", "sidecar~10.40.0.9~a.shop~shop.svc.cluster.local"
            ) as c:
                await c.wait_for(lambda c: _services(c) == 3, timeout=30)
        async with serving(mesh, max_write_bytes=5_000_000) as server:
            budget = server.ads.write_budget
            assert budget is not None and budget.limit == 5_000_000
            assert budget.change_limit == 5_000_000 * CHANGE_FACTOR

    run(test, timeout=90)
