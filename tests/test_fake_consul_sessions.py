"""Consul's sessions as the fake serves them, held to what Consul does.

Run through py-consul over HTTP against the fake and, when the binary is on PATH, a real `consul
agent -dev` (the session's agent of `test_consul_registry`), as the KV tests of `test_kv_push`
are: meshctl's replicas keep their shared health under sessions, so the fake must expire and
release them as Consul would.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import consul
import pytest

from meshctl.testing.fake_consul import FakeConsul

pytest_plugins = ["test_consul_registry"]  # its `kv_backend`: the fake and a real agent

pytestmark = pytest.mark.consul


def test_a_session_holds_keys_until_it_is_destroyed(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    prefix = f"t{uuid.uuid4().hex[:6]}/"
    ephemeral = c.session.create(name="holder", behavior="delete", lock_delay=0, ttl=30, checks=[])
    lasting = c.session.create(name="other", behavior="release", lock_delay=0, checks=[])
    _, info = c.session.info(ephemeral)
    assert info["Behavior"] == "delete" and info["TTL"] == "30s" and info["LockDelay"] == 0

    assert c.kv.put(prefix + "a", b"one", acquire=ephemeral) is True
    entry = c.kv.get(prefix + "a")[1]
    assert entry["Session"] == ephemeral and entry["LockIndex"] == 1
    # Held: another session cannot acquire it, its holder can (and updates it without a new LockIndex).
    assert c.kv.put(prefix + "a", b"two", acquire=lasting) is False
    assert c.kv.put(prefix + "a", b"two", acquire=ephemeral) is True
    entry = c.kv.get(prefix + "a")[1]
    assert entry["Value"] == b"two" and entry["LockIndex"] == 1
    # A plain write keeps the lock.
    assert c.kv.put(prefix + "a", b"three") is True
    assert c.kv.get(prefix + "a")[1]["Session"] == ephemeral

    assert c.kv.put(prefix + "b", b"kept", acquire=lasting) is True
    assert c.kv.put(prefix + "b", b"kept", release=ephemeral) is False  # not its lock
    assert c.session.renew(ephemeral)["ID"] == ephemeral

    # Destroyed: `delete` takes its keys away, `release` leaves them unlocked.
    c.session.destroy(ephemeral)
    c.session.destroy(lasting)
    assert c.kv.get(prefix + "a")[1] is None
    kept = c.kv.get(prefix + "b")[1]
    assert kept["Value"] == b"kept" and "Session" not in {k for k, v in kept.items() if v}
    with pytest.raises(consul.NotFound):
        c.session.renew(ephemeral)
    c.kv.delete(prefix, recurse=True)


def test_a_session_keeps_its_keys_from_others_for_its_lock_delay(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    key = f"t{uuid.uuid4().hex[:6]}/lock"
    first = c.session.create(behavior="release", lock_delay=30, checks=[])
    second = c.session.create(behavior="release", lock_delay=0, checks=[])
    assert c.kv.put(key, b"1", acquire=first) is True
    c.session.destroy(first)
    assert c.kv.put(key, b"2", acquire=second) is False  # within the lock delay of the first
    c.session.destroy(second)
    c.kv.delete(key)


def test_a_ttl_below_the_agents_least_is_refused() -> None:
    with FakeConsul() as fake:
        body = json.dumps({"TTL": "2s"}).encode()
        request = urllib.request.Request(f"{fake.url}/v1/session/create", data=body, method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400
        assert "TTL must be between [10s-24h0m0s]" in refused.value.read().decode()


def test_a_session_not_renewed_for_twice_its_ttl_loses_its_keys() -> None:
    """Consul invalidates a session no earlier than its TTL, and at about twice it; a blocked
    query on the prefix wakes when it does."""
    with FakeConsul(session_ttl_min=1) as fake:
        session = fake.create_session({"TTL": "1s", "Behavior": "delete", "LockDelay": "0s"})
        assert fake.kv_lock("p/a", b"x", session)
        c = consul.Consul(host="127.0.0.1", port=fake.port)
        c.token = None
        index, _ = c.kv.get("p/", recurse=True)
        started = time.monotonic()
        after, entries = c.kv.get("p/", recurse=True, index=index, wait="20s")
        took = time.monotonic() - started
        c.http.session.close()
        assert entries is None and int(after) > int(index)
        assert took >= 1.0  # never before the TTL
        assert fake.renew_session(session) is None
