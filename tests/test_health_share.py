"""Health shared between replicas: the merge of their views, and the share through (fake) Consul.

The merge is pure and tested on values. The share runs against the fake Consul over HTTP, two
`ConsulShare`s standing for two replicas: what one holds reaches the other, goes when its session
ends (stopped, or forgotten by Consul), comes back under a new session, and an outage is said in
`status()` while the last views are kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from meshctl.registry.consul_http import ConsulOptions
from meshctl.registry.health import NOT_REPORTED, HealthReports, WorkloadHealth, merge_views
from meshctl.registry.health_share import HEALTH_PREFIX, ConsulShare, ShareOptions, Views
from meshctl.registry.model import Health
from meshctl.testing.fake_consul import FakeConsul

KEY = ("shop", "api-v1")
GRACE = 10.0


def test_a_connected_view_and_the_latest_report_win() -> None:
    gone = WorkloadHealth(True, "tcp probe passing", 0, gone_since=100.0, reported_at=50.0)
    here = WorkloadHealth(False, "tcp probe: port 80 failing", 1, reported_at=120.0)
    merged = merge_views([gone, here])
    assert merged.verdict() == (Health.UNHEALTHY, "tcp probe: port 80 failing")
    assert merged.streams == 1 and merged.gone_since is None
    # A proxy that moved to a replica where it has not reported yet keeps its last report.
    moved = merge_views([gone, WorkloadHealth(streams=1)])
    assert moved.verdict() == (Health.HEALTHY, "tcp probe passing")
    # Expired views say nothing: with every view expired and none connected, it is gone.
    expired = merge_views([WorkloadHealth(True, "ok", 0, 90.0, True, 10.0), WorkloadHealth(None, "", 0, 95.0, True)])
    assert expired.verdict()[0] is Health.UNHEALTHY and "stream gone since" in expired.verdict()[1]
    assert merge_views([WorkloadHealth(streams=1), WorkloadHealth(streams=1)]).verdict()[1] == NOT_REPORTED


def test_a_view_that_disappears_is_gone_since_then_and_expires_after_the_grace() -> None:
    reports = HealthReports()
    seen: list[int] = []
    reports.subscribe(lambda: seen.append(1))
    healthy = WorkloadHealth(True, "tcp probe passing", 1, reported_at=10.0).to_json()
    reports.set_remote({KEY: {"session-a": healthy}}, now=100.0)
    assert reports.get(KEY).verdict() == (Health.HEALTHY, "tcp probe passing") and seen
    reports.set_remote({}, now=200.0)  # replica A's session ended
    assert reports.get(KEY).verdict()[0] is Health.HEALTHY  # within the grace the last report stands
    assert reports.next_expiry(GRACE) == 200.0 + GRACE
    reports.expire(GRACE, now=200.0 + GRACE - 1)
    assert reports.get(KEY).verdict()[0] is Health.HEALTHY
    reports.expire(GRACE, now=200.0 + GRACE)
    health, reason = reports.get(KEY).verdict()
    assert health is Health.UNHEALTHY and "stream gone since" in reason
    # The Envoy reconnects here and reports: healthy again, whatever was remembered.
    reports.opened(KEY)
    assert reports.get(KEY).verdict()[0] is Health.UNHEALTHY  # no report since it came back
    reports.report(KEY, True, "tcp probe passing")
    assert reports.get(KEY).verdict() == (Health.HEALTHY, "tcp probe passing")


def test_views_in_another_shape_are_ignored() -> None:
    reports = HealthReports()
    reports.set_remote({KEY: {"s": {"healthy": "yes"}, "t": {"streams": -1}, "u": {"goneSince": True}}})
    assert reports.get(KEY) == WorkloadHealth()


# --- the share through Consul ------------------------------------------------------------------


class Replica:
    """One `ConsulShare` and the views it was last handed."""

    def __init__(self, fake: FakeConsul, name: str) -> None:
        self.health: Views = {}
        self.changed = threading.Event()
        options = ConsulOptions(address=fake.address, backoff_min=0.1, backoff_max=0.2, request_timeout=2.0)
        self.share = ConsulShare(ShareOptions(options, session_ttl=1.0, replica=name), self._on_health, lambda _: None)

    def _on_health(self, views: Views) -> None:
        self.health = views
        self.changed.set()

    def views_of(self, key: tuple[str, str]) -> list[Any]:
        return list(self.health.get(key, {}).values())


def wait_for(condition: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.02)


@pytest.fixture
def pair() -> Iterator[tuple[FakeConsul, Replica, Replica]]:
    with FakeConsul(session_ttl_min=1.0) as fake:
        a, b = Replica(fake, "a"), Replica(fake, "b")
        a.share.start()
        b.share.start()
        try:
            yield fake, a, b
        finally:
            a.share.stop()
            b.share.stop()


def test_what_one_replica_holds_reaches_the_other_and_goes_with_its_session(
    pair: tuple[FakeConsul, Replica, Replica],
) -> None:
    fake, a, b = pair
    assert a.share.synced() and b.share.synced()
    a.share.put(HEALTH_PREFIX, KEY, WorkloadHealth(True, "tcp probe passing", 1, reported_at=5.0).to_json())
    wait_for(lambda: b.views_of(KEY), "A's view at B")
    (view,) = b.views_of(KEY)
    assert view["healthy"] is True and view["replica"] == "a" and a.views_of(KEY) == []  # its own are not its views
    (key,) = fake.kv_keys(HEALTH_PREFIX)
    session = key.rsplit("/", 1)[1]
    assert key == f"{HEALTH_PREFIX}shop/api-v1/{session}"

    # Consul forgets A's session (its TTL ran out, say): the key goes, and A writes it again
    # under a new session.
    fake.destroy_session(session)
    wait_for(lambda: fake.kv_keys(HEALTH_PREFIX) and fake.kv_keys(HEALTH_PREFIX) != [key], "A's view written again")
    wait_for(lambda: b.views_of(KEY), "A's view back at B")

    # A stops: its session is destroyed and its views go at once.
    a.share.stop()
    wait_for(lambda: not b.views_of(KEY), "A's view gone from B")
    assert fake.kv_keys(HEALTH_PREFIX) == []


def test_an_outage_is_said_and_the_last_views_kept(pair: tuple[FakeConsul, Replica, Replica]) -> None:
    fake, a, b = pair
    failing: list[bool] = []
    a.share.on_failing = failing.append  # the server's meshctl_shared_health_failing
    a.share.put(HEALTH_PREFIX, KEY, WorkloadHealth(True, "ok", 1, reported_at=5.0).to_json())
    wait_for(lambda: b.views_of(KEY), "A's view at B")
    fake.stop()
    a.share.put(HEALTH_PREFIX, KEY, WorkloadHealth(False, "failing", 1, reported_at=6.0).to_json())
    wait_for(lambda: not a.share.status()[0], "A saying it cannot write")
    _, message = a.share.status()
    assert "failing since" in message and "keeping the last known state" in message
    assert b.views_of(KEY)[0]["healthy"] is True  # B keeps what it last read
    fake.start()
    wait_for(lambda: b.views_of(KEY) and b.views_of(KEY)[0]["healthy"] is False, "A's new report at B")
    wait_for(lambda: a.share.status() == (True, ""), "A's share healthy again")
    assert failing == [True, False]
