"""The config store: one change per write, precise create/update/delete events, safe to share."""

from __future__ import annotations

import logging
import threading

import pytest

from meshctl.config.findings import Finding, Severity
from meshctl.config.model import Config, ConfigKey, Source, make_config, spec_class
from meshctl.config.store import ConfigChange, ConfigStore, EventKind, FileStatus


def virtual_service(
    name: str, host: str = "reviews.shop.mesh", *, namespace: str = "shop", line: int = 1, team: str = "a"
) -> Config:
    spec = spec_class("VirtualService")(hosts=[host])
    return make_config("VirtualService", name, namespace, spec, labels={"team": team}, source=Source("vs.yaml", line))


def service_entry(name: str, host: str, *, namespace: str = "shop") -> Config:
    spec = spec_class("ServiceEntry")(hosts=[host])
    return make_config("ServiceEntry", name, namespace, spec)


class Recorder:
    def __init__(self) -> None:
        self.changes: list[ConfigChange] = []

    def __call__(self, change: ConfigChange) -> None:
        self.changes.append(change)


def summary(change: ConfigChange | None) -> list[tuple[str, str]]:
    assert change is not None
    return [(e.kind.value, e.key.name) for e in change.events]


def test_first_write_creates_everything_in_one_change() -> None:
    store, seen = ConfigStore(), Recorder()
    store.subscribe(seen)
    change = store.replace_all([virtual_service("b"), virtual_service("a"), service_entry("a", "x.mesh")])
    assert seen.changes == [change]
    assert change is not None and change.revision == 1 == store.revision
    # Events come in key order, so consumers and logs see a stable sequence.
    assert [(e.kind, e.key) for e in change.events] == [
        (EventKind.CREATED, ConfigKey("ServiceEntry", "shop", "a")),
        (EventKind.CREATED, ConfigKey("VirtualService", "shop", "a")),
        (EventKind.CREATED, ConfigKey("VirtualService", "shop", "b")),
    ]
    assert all(e.old is None and e.new is not None for e in change.events)
    assert change.kinds == {"ServiceEntry", "VirtualService"}
    assert store.get(ConfigKey("VirtualService", "shop", "a")) is change.events[1].new


def test_update_only_when_content_changes_and_delete_what_is_missing() -> None:
    store, seen = ConfigStore(), Recorder()
    a, b, c = virtual_service("a"), virtual_service("b"), virtual_service("c")
    store.replace_all([a, b, c])
    store.subscribe(seen)
    b2 = virtual_service("b", "ratings.shop.mesh")
    c2 = virtual_service("c", team="b")  # a label is content too: it selects and is shown
    change = store.replace_all([a, b2, c2])
    assert summary(change) == [("updated", "b"), ("updated", "c")]
    assert change is not None and (change.events[0].old, change.events[0].new) == (b, b2)
    change = store.replace_all([b2])
    assert summary(change) == [("deleted", "a"), ("deleted", "c")]
    assert change is not None and change.events[1].old is c2 and change.events[1].new is None
    assert [c.name for c in store.list()] == ["b"]
    assert [ch.revision for ch in seen.changes] == [2, 3]


def test_rewriting_the_same_content_is_no_change_but_keeps_the_new_source_position() -> None:
    store, seen = ConfigStore(), Recorder()
    store.replace_all([virtual_service("a", line=1)])
    store.subscribe(seen)
    moved = virtual_service("a", line=40)
    assert store.replace_all([moved]) is None
    assert seen.changes == []
    assert store.revision == 1
    found = store.get(moved.key)
    assert found is not None and found.source.line == 40


def test_list_filters_by_kind_and_namespace_in_key_order() -> None:
    store = ConfigStore()
    store.replace_all(
        [
            virtual_service("z", namespace="shop"),
            virtual_service("a", namespace="web"),
            virtual_service("m", namespace="shop"),
            service_entry("m", "m.mesh", namespace="shop"),
        ]
    )
    assert [(c.kind, c.namespace, c.name) for c in store.list()] == [
        ("ServiceEntry", "shop", "m"),
        ("VirtualService", "shop", "m"),
        ("VirtualService", "shop", "z"),
        ("VirtualService", "web", "a"),
    ]
    assert [c.name for c in store.list(kind="VirtualService", namespace="shop")] == ["m", "z"]
    assert [c.kind for c in store.list(namespace="shop", kind="ServiceEntry")] == ["ServiceEntry"]
    assert store.list(kind="Gateway") == []


def test_views_are_read_only_and_do_not_move_under_a_reader() -> None:
    store = ConfigStore()
    store.replace_all([virtual_service("a")])
    before = store.view()
    store.replace_all([virtual_service("b")])
    assert before.revision == 1 and [k.name for k in before.configs] == ["a"]
    assert store.view().revision == 2 and [k.name for k in store.configs] == ["b"]
    with pytest.raises(TypeError):
        store.configs[ConfigKey("VirtualService", "shop", "x")] = virtual_service("x")  # type: ignore[index]


def test_the_same_resource_twice_in_one_write_is_refused() -> None:
    store = ConfigStore()
    with pytest.raises(ValueError, match="VirtualService shop/a given twice"):
        store.replace_all([virtual_service("a"), virtual_service("a", "other.mesh")])
    assert store.revision == 0 and not store.configs


def test_a_failing_listener_is_logged_and_the_others_still_hear(caplog: pytest.LogCaptureFixture) -> None:
    store, after = ConfigStore(), Recorder()

    def broken(change: ConfigChange) -> None:
        raise RuntimeError("listener bug")

    store.subscribe(broken)
    store.subscribe(after)
    with caplog.at_level(logging.ERROR, logger="meshctl.config.store"):
        change = store.replace_all([virtual_service("a")])
        store.replace_all([virtual_service("b")])
    assert after.changes[0] is change and len(after.changes) == 2
    assert store.revision == 2 and [c.name for c in store.list()] == ["b"]
    assert [r.getMessage() for r in caplog.records if r.name == "meshctl.config.store"] == [
        f"config listener {broken!r} failed on revision 1",
        f"config listener {broken!r} failed on revision 2",
    ]


def test_unsubscribed_listeners_hear_nothing_more() -> None:
    store, seen = ConfigStore(), Recorder()
    unsubscribe = store.subscribe(seen)
    store.replace_all([virtual_service("a")])
    unsubscribe()
    unsubscribe()  # twice is harmless
    store.replace_all([virtual_service("b")])
    assert [c.revision for c in seen.changes] == [1]


def test_a_listener_may_write_and_every_listener_still_sees_revisions_in_order() -> None:
    store, first, second = ConfigStore(), Recorder(), Recorder()

    def add_service_entry(change: ConfigChange) -> None:
        first(change)
        if change.revision == 1:
            current = store.list()
            store.replace_all([*current, service_entry("derived", "derived.mesh")])

    store.subscribe(add_service_entry)
    store.subscribe(second)
    store.replace_all([virtual_service("a")])
    assert [c.revision for c in first.changes] == [1, 2]
    assert [c.revision for c in second.changes] == [1, 2]
    assert summary(second.changes[1]) == [("created", "derived")]


def test_concurrent_writers_produce_gapless_ordered_revisions_and_consistent_reads() -> None:
    store, seen = ConfigStore(), Recorder()
    store.subscribe(seen)
    mismatches: list[str] = []

    def check(change: ConfigChange) -> None:
        # A reader inside a listener sees at least this change's revision, never an older state.
        if store.revision < change.revision:
            mismatches.append(f"store at {store.revision} while delivering {change.revision}")

    store.subscribe(check)

    def writer(n: int) -> None:
        for i in range(50):
            store.replace_all([virtual_service("shared", f"h{n}-{i}.mesh"), virtual_service(f"w{n}")])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    revisions = [c.revision for c in seen.changes]
    assert revisions == list(range(1, store.revision + 1))
    assert store.revision == 200  # every write gives the shared resource a new host
    assert mismatches == []


def test_file_status_keeps_errors_visible_until_replaced() -> None:
    store = ConfigStore()
    error = Finding(Severity.ERROR, "bad duration", "b.yaml", 7, 14)
    warning = Finding(Severity.WARNING, "skipped v1 Service", "a.yaml", 1, 1)
    store.replace_all(
        [virtual_service("a")],
        files=[FileStatus("a.yaml", (warning,)), FileStatus("b.yaml", (error,)), FileStatus("c.yaml")],
    )
    assert store.errors() == [error]
    assert not store.file_status()["b.yaml"].ok and store.file_status()["a.yaml"].ok
    # A write that does not mention files leaves their status alone...
    store.replace_all([virtual_service("b")])
    assert store.errors() == [error]
    # ...and a status update alone changes no resource and makes no revision.
    store.set_file_status([FileStatus("b.yaml")])
    assert store.errors() == [] and store.revision == 2
