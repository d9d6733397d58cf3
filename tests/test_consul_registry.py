"""The Consul registry: the mapping from Consul's JSON, and the watches against a Consul.

Integration tests run against the fake Consul, and against a real `consul agent -dev` when the
binary is on PATH. Writes go through py-consul over HTTP, as a user's tooling would, so the same
test drives either backend; the fake's controls (outages, indexes going back, request counts) are
only used by the tests that need them.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import consul
import pytest

from meshctl.errors import RegistryError, UsageError
from meshctl.registry.consul import CATALOG_PATH, ConsulRegistry, health_path, read_consul_once
from meshctl.registry.consul_convert import ConsulMapping, assemble_model, convert_service
from meshctl.registry.consul_http import ConsulOptions
from meshctl.registry.consul_watch import next_index
from meshctl.registry.model import Health, Protocol, RegistryChange, Resolution
from meshctl.testing.envoy import free_port
from meshctl.testing.fake_consul import FakeConsul

pytestmark = pytest.mark.consul


# --- helpers ---------------------------------------------------------------------------------


def wait_for(condition: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll `condition` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.01)


@dataclass
class Backend:
    """A Consul to test against, written to over HTTP with py-consul."""

    address: str
    fake: FakeConsul | None
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:6]}")
    client: Any = None

    def __post_init__(self) -> None:
        host, port = self.address.rsplit(":", 1)
        self.client = consul.Consul(host=host, port=int(port))
        self.client.token = None  # py-consul would take CONSUL_HTTP_TOKEN from the environment

    def name(self, service: str) -> str:
        """A service name of this test alone (a real agent is shared by the session)."""
        return f"{self.prefix}-{service}"

    def host(self, service: str) -> str:
        return f"{self.name(service)}.service.consul"

    def register(
        self, service: str, address: str, port: int, *, instance: str = "", status: str = "passing", **svc: Any
    ) -> None:
        instance = instance or f"{service}-{address}"
        node = f"{self.prefix}-{address}"
        body = {"Service": self.name(service), "ID": instance, "Port": port, **svc}
        check = {"CheckID": f"{instance}-check", "Name": "check", "Status": status, "ServiceID": instance}
        assert self.client.catalog.register(node, address, service=body, check=check)

    def deregister(self, address: str, instance: str) -> None:
        assert self.client.catalog.deregister(f"{self.prefix}-{address}", service_id=instance)

    def close(self) -> None:
        self.client.http.session.close()


@pytest.fixture(scope="session")
def consul_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `consul agent -dev` on free ports, shared by the session."""
    binary = shutil.which("consul")
    if binary is None:
        pytest.skip("consul binary not on PATH")
    http, server, lan, wan = (free_port() for _ in range(4))
    ports = (
        f"ports {{ http = {http} dns = -1 grpc = -1 grpc_tls = -1 "
        f"server = {server} serf_lan = {lan} serf_wan = {wan} }}"
    )
    log = Path(tmp_path_factory.mktemp("consul")) / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "agent", "-dev", "-bind=127.0.0.1", "-client=127.0.0.1", f"-hcl={ports}", "-log-level=warn"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not _has_leader(http):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"consul agent -dev did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"127.0.0.1:{http}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(params=["fake", "agent"])
def kv_backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """(address, py-consul client) of the fake Consul and, when the binary is on PATH, of the real
    agent: the tests that hold the fake to Consul's API (KV, sessions) run on both."""
    if request.param == "agent":
        address = request.getfixturevalue("consul_agent")
        context: Any = None
    else:
        context = FakeConsul()
        context.start()
        address = context.address
    host, port = address.rsplit(":", 1)
    client = consul.Consul(host=host, port=int(port))
    client.token = None  # py-consul would take CONSUL_HTTP_TOKEN from the environment
    try:
        yield address, client
    finally:
        client.http.session.close()
        if context is not None:
            context.stop()


def _has_leader(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status/leader", timeout=1) as r:
            return len(r.read().strip(b'"')) > 0
    except OSError:
        return False


@pytest.fixture(params=["fake", "agent"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "agent":
        b = Backend(request.getfixturevalue("consul_agent"), None)
        yield b
        b.close()
        return
    with FakeConsul() as fake:
        b = Backend(fake.address, fake)
        yield b
        b.close()


@pytest.fixture
def fake() -> Iterator[FakeConsul]:
    with FakeConsul() as f:
        yield f


def instance(service: str, address: str, port: int, node: str = "", **svc: Any) -> dict[str, Any]:
    """A catalog registration body, for the fake's in-process writes."""
    sid = svc.pop("ID", f"{service}-{address}")
    return {
        "Node": node or f"node-{address}",
        "Address": address,
        "Service": {"Service": service, "ID": sid, "Port": port, **svc},
        "Check": {"CheckID": f"{sid}-check", "Status": "passing", "ServiceID": sid},
    }


@pytest.fixture
def registries() -> Iterator[Callable[..., ConsulRegistry]]:
    """Start registries for a test and stop every one of them at its end."""
    started: list[ConsulRegistry] = []

    def start(address: str, **options: Any) -> ConsulRegistry:
        registry = ConsulRegistry(ConsulOptions(address=address, **options))
        registry.start()
        started.append(registry)
        return registry

    yield start
    for registry in started:
        assert registry.stop(timeout=5), "a watch thread did not end"


class Changes:
    """Listener that records every change."""

    def __init__(self) -> None:
        self.seen: list[RegistryChange] = []
        self._lock = threading.Lock()

    def __call__(self, change: RegistryChange) -> None:
        with self._lock:
            self.seen.append(change)

    def about(self, host: str) -> list[RegistryChange]:
        with self._lock:
            return [c for c in self.seen if host in c.hosts]


def addresses(registry: ConsulRegistry, host: str) -> list[str]:
    return [e.address for e in registry.model().endpoints_of(host)]


# --- integration: against the fake, and a real agent when there is one -----------------------


def test_instances_registered_and_deregistered_reach_the_model_as_endpoint_changes(
    backend: Backend, registries: Callable[..., ConsulRegistry]
) -> None:
    backend.register("web", "10.0.0.1", 8080, Meta={"protocol": "http"})
    registry = registries(backend.address)
    changes = Changes()
    registry.subscribe(changes)
    host = backend.host("web")
    wait_for(lambda: addresses(registry, host) == ["10.0.0.1"], "the first instance")
    assert registry.status().healthy

    backend.register("web", "10.0.0.2", 8080, Meta={"protocol": "http"})
    wait_for(lambda: addresses(registry, host) == ["10.0.0.1", "10.0.0.2"], "the new instance", timeout=1)
    backend.deregister("10.0.0.1", "web-10.0.0.1")
    wait_for(lambda: addresses(registry, host) == ["10.0.0.2"], "the instance gone", timeout=1)

    later = changes.about(host)[-2:]
    assert [c.endpoint_only for c in later] == [True, True]
    assert registry.model().services[host].ports[0].protocol is Protocol.HTTP


def test_a_failing_check_marks_the_endpoint_unhealthy_without_touching_the_service(
    backend: Backend, registries: Callable[..., ConsulRegistry]
) -> None:
    backend.register("api", "10.0.1.1", 9000)
    registry = registries(backend.address)
    changes = Changes()
    registry.subscribe(changes)
    host = backend.host("api")
    wait_for(lambda: addresses(registry, host), "the instance")

    backend.register("api", "10.0.1.1", 9000, status="critical")
    wait_for(lambda: registry.model().endpoints_of(host)[0].health is Health.UNHEALTHY, "the check to fail")
    assert changes.about(host)[-1].endpoint_only


def test_each_service_gets_its_own_watch_which_ends_when_the_service_leaves(
    backend: Backend, registries: Callable[..., ConsulRegistry]
) -> None:
    backend.register("web", "10.0.0.1", 8080)
    registry = registries(backend.address)
    assert registry.wait_synced(5)

    backend.register("late", "10.0.2.1", 7000)
    late = backend.name("late")
    wait_for(lambda: backend.host("late") in registry.model().services, "the new service in the model")
    assert late in registry.watched()
    if backend.fake is not None:
        wait_for(lambda: backend.fake.in_flight(health_path(late)) == 1, "a blocking query on the new service")

    backend.deregister("10.0.2.1", "late-10.0.2.1")
    wait_for(lambda: backend.host("late") not in registry.model().services, "the service gone from the model")
    wait_for(lambda: late not in registry.watched(), "its watch gone")
    assert backend.host("web") in registry.model().services
    if backend.fake is not None:
        wait_for(lambda: backend.fake.in_flight(health_path(late)) == 0, "its query ended")


def test_read_once_sees_what_the_registry_sees(backend: Backend, registries: Callable[..., ConsulRegistry]) -> None:
    backend.register("web", "10.0.0.1", 8080, Tags=["version=v1"])
    backend.register("db", "10.0.3.1", 5432, Address="db.internal")
    registry = registries(backend.address)
    assert registry.wait_synced(5)

    once, watched = read_consul_once(ConsulOptions(address=backend.address)), registry.model()

    for host in (backend.host("web"), backend.host("db")):
        assert once.services[host] == watched.services[host]
        assert once.endpoints_of(host) == watched.endpoints_of(host)
    assert once.endpoints_of(backend.host("web"))[0].labels == {"version": "v1"}
    assert once.services[backend.host("db")].resolution is Resolution.DNS


# --- integration: the fake's controls --------------------------------------------------------


def test_an_index_that_goes_backwards_restarts_the_query(
    fake: FakeConsul, registries: Callable[..., ConsulRegistry]
) -> None:
    fake.register(instance("web", "10.0.0.1", 8080))
    fake.register(instance("web", "10.0.0.2", 8080))
    registry = registries(fake.address)
    path = health_path("web")

    def reads(blocking: bool) -> int:
        return sum(1 for r in fake.requests if r.path == path and ("index" in r.query) == blocking)

    wait_for(lambda: reads(blocking=True) and fake.in_flight(path) == 1, "a blocking query")
    assert reads(blocking=False) == 1

    fake.set_index(1)  # as after a snapshot restore: every index is lower than the one sent
    wait_for(lambda: reads(blocking=False) == 2, "a plain read to start over")
    # Still blocking on the old, higher index, this write would go unseen for good.
    fake.register(instance("web", "10.0.0.3", 8080))
    wait_for(lambda: len(addresses(registry, "web.service.consul")) == 3, "the write after the restore")


@pytest.mark.slow
def test_an_outage_keeps_every_endpoint_and_recovery_resumes_where_it_stopped(
    fake: FakeConsul, registries: Callable[..., ConsulRegistry]
) -> None:
    for n in range(3):
        for i in (1, 2):
            fake.register(instance(f"svc{n}", f"10.1.{n}.{i}", 8000 + n))
    registry = registries(fake.address, backoff_min=0.2, backoff_max=2.0)
    assert registry.wait_synced(5)
    before = registry.model()
    assert sum(len(e) for e in before.endpoints.values()) == 6

    fake.stop()
    wait_for(lambda: not registry.status().healthy, "the outage to show in status")
    assert "failing" in registry.status().message
    outage_end = time.monotonic() + 10
    while time.monotonic() < outage_end:
        assert registry.model().digest() == before.digest()
        time.sleep(0.5)
    first_after = len(fake.requests)
    fake.start()

    wait_for(lambda: registry.status().healthy, "recovery", timeout=10)
    assert registry.model().digest() == before.digest()
    health_after = [r for r in fake.requests[first_after:] if r.path.startswith("/v1/health/")]
    assert health_after and all("index" in r.query for r in health_after)  # no re-read from scratch
    fake.register(instance("svc0", "10.1.0.3", 8000))
    wait_for(lambda: len(addresses(registry, "svc0.service.consul")) == 3, "a write after recovery")
    assert sorted(addresses(registry, "svc0.service.consul")) == ["10.1.0.1", "10.1.0.2", "10.1.0.3"]


@pytest.mark.slow
def test_an_outage_and_its_recovery_are_each_one_log_line(
    fake: FakeConsul, registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    fake.register(instance("svc", "10.2.0.1", 8000))
    with caplog.at_level(logging.INFO, logger="meshctl.registry.consul"):
        registry = registries(fake.address, backoff_min=0.2, backoff_max=1.0)
        assert registry.wait_synced(5)
        fake.stop()
        wait_for(lambda: any(r.levelno == logging.WARNING for r in caplog.records), "the outage in the log")
        time.sleep(3)  # retries keep failing meanwhile: no more lines
        fake.start()
        wait_for(lambda: any("answers again" in r.getMessage() for r in caplog.records), "the recovery in the log", 10)
    lines = [r for r in caplog.records if r.name == "meshctl.registry.consul" and "index" not in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO], [r.getMessage() for r in lines]
    assert fake.address in lines[0].getMessage() and "is failing" in lines[0].getMessage()
    assert fake.address in lines[1].getMessage()


def test_a_hundred_idle_services_cost_almost_no_requests(
    fake: FakeConsul, registries: Callable[..., ConsulRegistry]
) -> None:
    for n in range(100):
        fake.register(instance(f"svc{n}", f"10.2.{n}.1", 8080))
    registry = registries(fake.address)
    # A hundred watch threads' first answers: seconds on a machine busy with other work.
    assert registry.wait_synced(60)
    paths = [CATALOG_PATH, *(health_path(f"svc{n}") for n in range(100))]
    wait_for(lambda: all(fake.in_flight(p) == 1 for p in paths), "every watch blocking")

    before = fake.request_count()
    time.sleep(2)
    # Polling each service every few seconds would be 30 and more in this window.
    assert fake.request_count() - before <= 3
    assert len(registry.model().services) == 100


def test_a_consul_that_answers_at_once_with_index_zero_is_not_busy_polled(
    fake: FakeConsul, registries: Callable[..., ConsulRegistry]
) -> None:
    fake.register(instance("web", "10.0.0.1", 8080))
    fake.zero_index = True
    registry = registries(fake.address)
    assert registry.wait_synced(5)
    time.sleep(2)
    # Two watches, each a burst of 4 and then one query per 5 s; a busy loop makes thousands.
    assert fake.request_count() <= 12
    assert addresses(registry, "web.service.consul") == ["10.0.0.1"]


def test_the_acl_token_is_sent_and_a_missing_one_is_reported() -> None:
    with FakeConsul(acl_token="s3cret") as fake:
        fake.register(instance("web", "10.0.0.1", 8080))
        with ConsulRegistry(ConsulOptions(address=fake.address, token="s3cret")) as registry:
            assert registry.wait_synced(5)
            assert addresses(registry, "web.service.consul") == ["10.0.0.1"]
        assert {r.token for r in fake.requests} == {"s3cret"}

        with ConsulRegistry(ConsulOptions(address=fake.address)) as anonymous:
            wait_for(lambda: "403" in anonymous.status().message, "the refusal in status")
            assert not anonymous.status().healthy
            assert not anonymous.model().services


def test_stop_ends_blocked_watches_at_once(fake: FakeConsul) -> None:
    for n in range(5):
        fake.register(instance(f"svc{n}", f"10.3.{n}.1", 8080))
    registry = ConsulRegistry(ConsulOptions(address=fake.address, wait=300))
    registry.start()
    assert registry.wait_synced(5)
    wait_for(lambda: fake.in_flight(health_path("svc4")) == 1, "blocking queries")

    assert registry.stop(timeout=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("consul /v1/")]


def test_read_once_reports_an_unreachable_consul() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError, match=address):
        read_consul_once(ConsulOptions(address=address, request_timeout=2))


# --- options and index rules -----------------------------------------------------------------


def test_options_come_from_flags_then_consul_environment_variables(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"CONSUL_HTTP_ADDR": "consul.example:8501", "CONSUL_HTTP_SSL": "true", "CONSUL_CACERT": "/ca.pem"}

    options = ConsulOptions.from_env({**env, "CONSUL_HTTP_TOKEN_FILE": str(token_file)})
    assert (options.url, options.token, options.ca_file) == ("https://consul.example:8501", "from-file", "/ca.pem")
    flags = ConsulOptions.from_env({**env, "CONSUL_HTTP_TOKEN": "env"}, address="10.0.0.9:8500", token="flag")
    assert (flags.url, flags.token) == ("https://10.0.0.9:8500", "flag")
    assert ConsulOptions.from_env({}).url == "http://127.0.0.1:8500"
    assert ConsulOptions(address="http://[::1]:8500").url == "http://[::1]:8500"
    assert ConsulOptions(address="consul.local").url == "http://consul.local:8500"


@pytest.mark.parametrize("address", ["ftp://consul:8500", "consul:port", "http://consul:8500/v1", ""])
def test_bad_addresses_are_usage_errors(address: str) -> None:
    with pytest.raises(UsageError, match="consul address"):
        ConsulOptions(address=address)


def test_wait_is_capped_as_consul_caps_it() -> None:
    with pytest.raises(UsageError, match="wait"):
        ConsulOptions(wait=900)


@pytest.mark.parametrize(
    ("sent", "returned", "expected"),
    [(0, 42, 42), (42, 42, 42), (42, 50, 50), (50, 42, 0), (0, 0, 1), (7, 0, 0)],
)
def test_next_index_follows_consuls_rules(sent: int, returned: int, expected: int) -> None:
    assert next_index(sent, returned) == expected


# --- mapping ---------------------------------------------------------------------------------


def entry(
    address: str = "10.0.0.1",
    port: int = 8080,
    *,
    sid: str = "web-1",
    service_address: str = "",
    tags: list[str] | None = None,
    meta: dict[str, str] | None = None,
    checks: list[tuple[str, str]] | None = None,
    node_meta: dict[str, str] | None = None,
    **svc: Any,
) -> dict[str, Any]:
    """One `/v1/health/service/web` entry as Consul sends it; `checks` are (ServiceID, Status)."""
    return {
        "Node": {"Node": f"node-{address}", "Address": address, "Datacenter": "dc1", "Meta": node_meta or {}},
        "Service": {
            "ID": sid,
            "Service": "web",
            "Tags": tags or [],
            "Address": service_address,
            "Meta": meta or {},
            "Port": port,
            **svc,
        },
        "Checks": [{"CheckID": f"c{i}", "ServiceID": s, "Status": st} for i, (s, st) in enumerate(checks or [])],
    }


MAPPING = ConsulMapping()


def test_key_value_tags_and_meta_become_labels_and_plain_tags_do_not() -> None:
    tags = ["version=v1", "primary", "team=payments", "traefik.rule=Host(`a`)", "app.example.com/tier=web"]
    converted = convert_service("web", [entry(tags=tags, meta={"team": "checkout", "protocol": "grpc"})], MAPPING)

    (ep,) = converted.endpoints
    assert dict(ep.labels) == {"version": "v1", "team": "checkout", "app.example.com/tier": "web"}
    assert converted.service is not None and converted.service.hostname == "web.service.consul"


def test_service_address_wins_over_node_address_and_hostnames_use_dns() -> None:
    ips = convert_service("web", [entry("10.0.0.1", service_address="10.9.9.9"), entry("10.0.0.2", sid="w2")], MAPPING)
    assert [e.address for e in ips.endpoints] == ["10.0.0.2", "10.9.9.9"]
    assert ips.service is not None and ips.service.resolution is Resolution.STATIC

    named = convert_service("web", [entry(service_address="web.internal")], MAPPING)
    assert named.service is not None and named.service.resolution is Resolution.DNS


@pytest.mark.parametrize(
    ("checks", "warning_is_healthy", "health"),
    [
        ([], True, Health.HEALTHY),
        ([("web-1", "passing"), ("", "passing")], True, Health.HEALTHY),
        ([("web-1", "warning")], True, Health.HEALTHY),
        ([("web-1", "warning")], False, Health.UNHEALTHY),
        ([("web-1", "critical")], True, Health.UNHEALTHY),
        ([("web-1", "passing"), ("", "critical")], True, Health.UNHEALTHY),  # the node is down (serfHealth)
        ([("other-instance", "critical")], True, Health.HEALTHY),  # not this instance's check
        ([("web-1", "maintenance")], True, Health.UNHEALTHY),
    ],
)
def test_checks_map_to_health(checks: list[tuple[str, str]], warning_is_healthy: bool, health: Health) -> None:
    mapping = ConsulMapping(warning_is_healthy=warning_is_healthy)
    (ep,) = convert_service("web", [entry(checks=checks)], mapping).endpoints
    assert ep.health is health


def test_each_instance_port_is_a_service_port_named_by_protocol() -> None:
    converted = convert_service(
        "web",
        [
            entry("10.0.0.1", 8080, sid="a", meta={"protocol": "HTTP"}),
            entry("10.0.0.2", 9090, sid="b", meta={"protocol": "grpc"}),
            entry("10.0.0.3", 8080, sid="c", meta={"protocol": "tcp"}),
            entry("10.0.0.4", 7070, sid="d", meta={"protocol": "thrift"}),
        ],
        MAPPING,
    )
    assert converted.service is not None
    assert [(p.name, p.number, p.protocol) for p in converted.service.ports] == [
        ("tcp-7070", 7070, Protocol.TCP),
        ("http-8080", 8080, Protocol.HTTP),
        ("grpc-9090", 9090, Protocol.GRPC),
    ]
    assert {e.name: dict(e.ports) for e in converted.endpoints}["b"] == {9090: 9090}
    assert any("unknown protocol 'thrift'" in n for n in converted.notes)
    assert any("port 8080 is TCP" in n for n in converted.notes)


def test_weights_locality_and_skipped_instances() -> None:
    converted = convert_service(
        "web",
        [
            entry("10.0.0.1", sid="a", Weights={"Passing": 10, "Warning": 1}, node_meta={"zone": "az1"}),
            entry("10.0.0.2", sid="b", Weights={"Passing": 10, "Warning": 2}, checks=[("b", "warning")]),
            entry("10.0.0.3", sid="c", Kind="connect-proxy"),
            entry("10.0.0.4", 0, sid="d"),
        ],
        ConsulMapping(default_protocol=Protocol.HTTP2),
    )
    assert [(e.name, e.weight, e.locality) for e in converted.endpoints] == [("a", 10, "dc1/az1"), ("b", 2, "dc1")]
    assert converted.service is not None and converted.service.ports[0].protocol is Protocol.HTTP2
    assert any("web/node-10.0.0.4/d is skipped" in n for n in converted.notes)


def test_a_service_whose_last_instance_left_keeps_its_ports() -> None:
    first = convert_service("web", [entry()], MAPPING)
    emptied = convert_service("web", [], MAPPING, previous=first.service)
    assert emptied.service == first.service and emptied.endpoints == ()
    assert convert_service("web", [], MAPPING).service is None


def test_names_that_are_not_dns_labels_are_skipped_with_a_note() -> None:
    converted = convert_service("web_api", [entry()], MAPPING)
    assert converted.service is None
    assert "not a DNS label" in converted.notes[0]


def test_two_names_for_one_hostname_keep_the_first_with_a_note() -> None:
    converted = {n: convert_service(n, [entry(sid=n)], MAPPING) for n in ("web", "Web")}
    model = assemble_model(converted, MAPPING)
    assert [e.name for e in model.endpoints_of("web.service.consul")] == ["Web"]
    assert any("'Web' and 'web' are both web.service.consul" in n for n in model.notes)
