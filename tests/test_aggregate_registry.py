"""Several registries as one model: the first member owns a hostname both define, and one member
change is one change event for the whole."""

from __future__ import annotations

import threading
import time

import pytest

from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.model import Config
from meshctl.registry.aggregate import AggregateRegistry, merge_models
from meshctl.registry.consul import ConsulRegistry
from meshctl.registry.consul_http import ConsulOptions
from meshctl.registry.files import FileRegistry
from meshctl.registry.model import RegistryChange, Resolution
from meshctl.testing.fake_consul import FakeConsul


def load(text: str) -> list[Config]:
    result = load_text(text, "<test>", LoadOptions())
    assert result.ok, [str(f) for f in result.findings]
    return list(result.configs)


def se(name: str, host: str, *, resolution: str = "STATIC", selector: str = "", port: int = 80) -> str:
    selector_line = f"  workloadSelector: {{labels: {{app: {selector}}}}}\n" if selector else ""
    return f"""---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  hosts: [{host}]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  resolution: {resolution}
{selector_line}"""


def we(name: str, address: str, app: str) -> str:
    return f"""---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  address: {address}
  labels: {{app: {app}}}
"""


SHARED_IN_FILES = se("shared", "shared.example.com", selector="shared") + we("vm-a", "10.0.0.1", "shared")
SHARED_ELSEWHERE = (
    se("shared-elsewhere", "shared.example.com", resolution="DNS", selector="shared")
    + we("vm-b", "10.1.0.1", "shared")
    + se("only-elsewhere", "other.example.com", selector="other")
    + we("vm-c", "10.1.0.2", "other")
)


def members() -> tuple[FileRegistry, FileRegistry]:
    return FileRegistry(load(SHARED_IN_FILES)), FileRegistry(load(SHARED_ELSEWHERE), name="consul")


def test_services_of_every_member_and_the_first_member_owns_a_shared_host() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    model = aggregate.model()
    assert sorted(model.services) == ["other.example.com", "shared.example.com"]
    shared = model.services["shared.example.com"]
    assert (shared.origin, shared.resolution) == ("ServiceEntry shop/shared", Resolution.STATIC)
    assert [e.address for e in model.endpoints_of("shared.example.com")] == ["10.0.0.1"]
    assert [e.address for e in model.endpoints_of("other.example.com")] == ["10.1.0.2"]
    (note,) = model.notes
    assert "shared.example.com" in note
    assert "ServiceEntry shop/shared (files)" in note
    assert "ServiceEntry shop/shared-elsewhere (consul)" in note
    assert note.endswith("using ServiceEntry shop/shared (files)")


def test_member_order_is_precedence() -> None:
    files, other = members()
    model = AggregateRegistry([other, files]).model()
    assert model.services["shared.example.com"].origin == "ServiceEntry shop/shared-elsewhere"
    assert [e.address for e in model.endpoints_of("shared.example.com")] == ["10.1.0.1"]


def test_members_notes_are_kept() -> None:
    duplicated = se("a", "dup.example.com") + se("b", "dup.example.com")
    model = merge_models([("files", FileRegistry(load(duplicated)).model())])
    (note,) = model.notes
    assert "dup.example.com" in note


def test_one_member_change_is_one_event_endpoint_only_when_it_is() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    events: list[RegistryChange] = []
    aggregate.subscribe(events.append)

    other.replace(load(SHARED_ELSEWHERE + we("vm-d", "10.1.0.3", "other")))
    assert events == [RegistryChange(frozenset({"other.example.com"}), endpoint_only=True, settled=True)]
    assert [e.address for e in aggregate.model().endpoints_of("other.example.com")] == ["10.1.0.2", "10.1.0.3"]

    moved = se("shared", "shared.example.com", selector="shared", port=81)
    files.replace(load(moved + we("vm-a", "10.0.0.1", "shared")))
    assert events[1:] == [RegistryChange(frozenset({"shared.example.com"}), endpoint_only=False, settled=True)]


def test_a_change_hidden_by_precedence_is_no_event() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    events: list[RegistryChange] = []
    aggregate.subscribe(events.append)
    other.replace(load(SHARED_ELSEWHERE + we("vm-e", "10.1.0.9", "shared")))  # endpoints of a host files own
    assert events == []
    assert [e.address for e in aggregate.model().endpoints_of("shared.example.com")] == ["10.0.0.1"]


def test_a_host_dropped_by_the_owner_falls_to_the_next_member() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    events: list[RegistryChange] = []
    aggregate.subscribe(events.append)
    files.replace([])
    assert events == [RegistryChange(frozenset({"shared.example.com"}), endpoint_only=False, settled=True)]
    model = aggregate.model()
    assert model.services["shared.example.com"].origin == "ServiceEntry shop/shared-elsewhere"
    assert [e.address for e in model.endpoints_of("shared.example.com")] == ["10.1.0.1"]
    assert model.notes == ()


def test_status_combines_members() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    status = aggregate.status()
    assert (status.healthy, status.services, status.endpoints) == (True, 2, 2)
    assert [s.name for s in aggregate.member_statuses()] == ["files", "consul"]


def test_status_is_degraded_when_any_member_is() -> None:
    files = FileRegistry(load(SHARED_IN_FILES))
    consul = ConsulRegistry(ConsulOptions(address="127.0.0.1:8500"))  # never started: not read yet
    status = AggregateRegistry([files, consul]).status()
    assert not status.healthy
    assert status.message.startswith("consul: ")
    assert "files" not in status.message
    assert (status.services, status.endpoints) == (1, 1)


def test_a_failing_listener_does_not_stop_the_others() -> None:
    files, other = members()
    aggregate = AggregateRegistry([files, other])
    seen: list[RegistryChange] = []

    def broken(_change: RegistryChange) -> None:
        raise RuntimeError("listener bug")

    aggregate.subscribe(broken)
    aggregate.subscribe(seen.append)
    files.replace([])
    assert len(seen) == 1


@pytest.mark.consul
def test_files_and_a_live_consul_one_consul_change_is_one_event() -> None:
    web_in_files = se("web", "web.service.consul", selector="web") + we("vm-web", "10.0.0.5", "web")
    files = FileRegistry(load(web_in_files))
    with FakeConsul() as fake:
        fake.register({"Node": "n1", "Address": "10.2.0.1", "Service": {"Service": "web", "ID": "w1", "Port": 80}})
        fake.register({"Node": "n2", "Address": "10.2.0.2", "Service": {"Service": "pay", "ID": "p1", "Port": 90}})
        with ConsulRegistry(ConsulOptions(address=fake.address)) as consul:
            assert consul.wait_synced(10)
            aggregate = AggregateRegistry([files, consul])
            model = aggregate.model()
            assert model.services["web.service.consul"].registry == "files"
            assert [e.address for e in model.endpoints_of("web.service.consul")] == ["10.0.0.5"]
            assert [e.address for e in model.endpoints_of("pay.service.consul")] == ["10.2.0.2"]
            assert aggregate.status().healthy

            events: list[RegistryChange] = []
            arrived = threading.Event()

            def record(change: RegistryChange) -> None:
                events.append(change)
                arrived.set()

            aggregate.subscribe(record)
            fake.register({"Node": "n3", "Address": "10.2.0.3", "Service": {"Service": "pay", "ID": "p2", "Port": 90}})
            assert arrived.wait(10)
            time.sleep(0.3)  # room for a second event, which must not come
            assert events == [RegistryChange(frozenset({"pay.service.consul"}), endpoint_only=True)]
            addresses = [e.address for e in aggregate.model().endpoints_of("pay.service.consul")]
            assert addresses == ["10.2.0.2", "10.2.0.3"]
