"""The directory watcher against real files and a real watchdog observer.

Each test waits for the outcome it expects with a generous deadline; tests that assert something
did NOT happen (a second change) first wait for the watcher to go quiet.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.config import files as files_module
from meshctl.config import watcher as watcher_module
from meshctl.config.model import Config, ConfigKey
from meshctl.config.store import ConfigChange, ConfigStore
from meshctl.config.watcher import DirectoryWatcher, WatchOptions, is_relevant

DEADLINE = 20.0


def vs(name: str, host: str = "reviews.shop.mesh", timeout: str = "5s") -> str:
    """A VirtualService; its `timeout:` is on line 10 of the document."""
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: {name}
  namespace: shop
spec:
  hosts:
  - {host}
  http:
  - timeout: {timeout}
    route:
    - destination:
        host: {host}
"""


def se(name: str, host: str, port: int = 9080) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
  namespace: shop
spec:
  hosts:
  - {host}
  ports:
  - number: {port}
    name: http
    protocol: HTTP
  resolution: STATIC
"""


def documents(*texts: str) -> str:
    return "---\n".join(texts)


def vs_key(name: str) -> ConfigKey:
    return ConfigKey("VirtualService", "shop", name)


def se_key(name: str) -> ConfigKey:
    return ConfigKey("ServiceEntry", "shop", name)


def timeout_of(store: ConfigStore, name: str) -> int | None:
    config = store.get(vs_key(name))
    return None if config is None else int(config.spec.http[0].timeout.seconds)  # type: ignore[attr-defined]


def hosts_of(config: Config | None) -> list[str]:
    assert config is not None
    return list(config.spec.hosts)  # type: ignore[attr-defined]


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def settle(options: WatchOptions) -> None:
    """Give a pending reload every chance to happen before asserting there was none."""
    time.sleep(max(1.0, 5 * options.debounce))


class Changes:
    def __init__(self, store: ConfigStore) -> None:
        self.items: list[ConfigChange] = []
        store.subscribe(self.items.append)


FAST = WatchOptions(debounce=0.1, max_delay=5.0, retry_interval=0.2)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.mkdir()
    return path


@pytest.fixture
def store() -> ConfigStore:
    return ConfigStore()


@pytest.fixture
def watching(root: Path, store: ConfigStore) -> Iterator[DirectoryWatcher]:
    with DirectoryWatcher([root], store, FAST) as watcher:
        yield watcher


@pytest.mark.slow
def test_a_burst_of_writes_across_files_is_one_change(root: Path, store: ConfigStore) -> None:
    options = WatchOptions(debounce=0.5, max_delay=30.0)
    for i in range(10):
        (root / f"vs{i}.yaml").write_text(vs(f"r{i}", timeout="1s"))
    with DirectoryWatcher([root], store, options):
        changes = Changes(store)
        for round_ in range(2, 7):
            for i in range(10):
                (root / f"vs{i}.yaml").write_text(vs(f"r{i}", timeout=f"{round_}s"))
        wait_for(lambda: all(timeout_of(store, f"r{i}") == 6 for i in range(10)), "the last write of every file")
        settle(options)
    assert len(changes.items) == 1
    assert sorted((e.kind.value, e.key.name) for e in changes.items[0].events) == [
        ("updated", f"r{i}") for i in range(10)
    ]


def test_a_broken_edit_keeps_the_old_resources_until_it_is_fixed(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    path = root / "reviews.yaml"
    path.write_text(vs("reviews", timeout="5s"))
    wait_for(lambda: timeout_of(store, "reviews") == 5, "the first version")
    path.write_text(vs("reviews", timeout="soon"))
    wait_for(store.errors, "the error to be reported")
    (error,) = store.errors()
    assert (error.file, error.line) == (str(path), 10)
    assert f"{path}:10" in str(error) and "VirtualService shop/reviews" in str(error)
    assert timeout_of(store, "reviews") == 5
    path.write_text(vs("reviews", timeout="7s"))
    wait_for(lambda: timeout_of(store, "reviews") == 7, "the fixed version")
    assert store.errors() == []


def test_an_atomic_save_is_one_update_with_the_new_content(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    path = root / "reviews.yaml"
    path.write_text(vs("reviews", timeout="5s"))
    wait_for(lambda: timeout_of(store, "reviews") == 5, "the first version")
    changes = Changes(store)
    temporary = root / "reviews.yaml.tmp"
    temporary.write_text(vs("reviews", timeout="9s"))
    os.replace(temporary, path)
    wait_for(lambda: changes.items, "the save to be applied")
    settle(FAST)
    (change,) = changes.items
    ((kind, key),) = [(e.kind.value, e.key) for e in change.events]
    assert (kind, key) == ("updated", vs_key("reviews"))
    assert timeout_of(store, "reviews") == 9


def test_deleting_a_file_deletes_its_resources(root: Path, store: ConfigStore, watching: DirectoryWatcher) -> None:
    (root / "both.yaml").write_text(documents(vs("reviews"), se("ratings", "ratings.shop.mesh")))
    (root / "other.yaml").write_text(vs("other"))
    wait_for(lambda: len(store.configs) == 3, "three resources")
    changes = Changes(store)
    (root / "both.yaml").unlink()
    wait_for(lambda: changes.items, "the delete to be applied")
    assert sorted((e.kind.value, str(e.key)) for e in changes.items[0].events) == [
        ("deleted", "ServiceEntry shop/ratings"),
        ("deleted", "VirtualService shop/reviews"),
    ]
    assert list(store.configs) == [vs_key("other")]


def test_one_broken_document_keeps_the_old_version_of_every_document_in_the_file(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    path = root / "shop.yaml"
    path.write_text(documents(vs("a", timeout="1s"), vs("b", timeout="1s"), se("c", "c.shop.mesh", 9080)))
    wait_for(lambda: len(store.configs) == 3, "three resources")
    changes = Changes(store)
    path.write_text(documents(vs("a", timeout="2s"), vs("b", timeout="later"), se("c", "c.shop.mesh", 9090)))
    wait_for(store.errors, "the broken document to be reported")
    assert [(e.file, e.line) for e in store.errors()] == [(str(path), 24)]
    assert (timeout_of(store, "a"), timeout_of(store, "b")) == (1, 1)
    se_config = store.get(se_key("c"))
    assert se_config is not None and se_config.spec.ports[0].number == 9080  # type: ignore[attr-defined]
    assert changes.items == []
    path.write_text(documents(vs("a", timeout="2s"), vs("b", timeout="2s"), se("c", "c.shop.mesh", 9090)))
    wait_for(lambda: changes.items, "the fixed file")
    assert sorted(e.key.name for e in changes.items[0].events) == ["a", "b", "c"]
    assert store.errors() == []


def test_a_vanished_directory_deletes_nothing_and_is_picked_up_when_it_returns(
    root: Path, store: ConfigStore, watching: DirectoryWatcher, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="meshctl.config.watcher")
    (root / "reviews.yaml").write_text(vs("reviews", timeout="5s"))
    wait_for(lambda: timeout_of(store, "reviews") == 5, "the first version")
    changes = Changes(store)
    # Gone at once, as an unmounted volume goes (rmtree empties it first, and a scan in between
    # would rightly report an emptied directory instead).
    gone = root.with_name(root.name + ".gone")
    root.rename(gone)
    shutil.rmtree(gone)
    wait_for(store.errors, "the missing directory to be reported")
    (error,) = store.errors()
    expected = f"{root} does not exist; keeping the resources last loaded from it (1) until it can be read again"
    assert (error.file, error.message) == (str(root), expected)
    assert timeout_of(store, "reviews") == 5
    assert changes.items == []
    root.mkdir()
    (root / "reviews.yaml").write_text(vs("reviews", timeout="8s"))
    wait_for(lambda: timeout_of(store, "reviews") == 8, "the recreated directory's content")
    assert store.errors() == []
    # Watching resumed on the new directory, not just one reload.
    (root / "more.yaml").write_text(vs("more"))
    wait_for(lambda: store.get(vs_key("more")) is not None, "a file added to the recreated directory")
    # The log said so once when it went, and once when it came back.
    said = [(r.levelno, r.getMessage()) for r in caplog.records if str(root) in r.getMessage()]
    assert [level for level, message in said if "revision" not in message] == [logging.ERROR, logging.INFO], said


def test_a_directory_emptied_of_yaml_keeps_its_resources_until_a_file_says_otherwise(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    """An unmounted volume leaves an empty mount point: that must not delete the whole mesh."""
    (root / "reviews.yaml").write_text(vs("reviews"))
    (root / "other.yaml").write_text(vs("other"))
    wait_for(lambda: len(store.configs) == 2, "two resources")
    (root / "reviews.yaml").unlink()
    (root / "other.yaml").unlink()
    wait_for(store.errors, "the emptied directory to be reported")
    (error,) = store.errors()
    assert "holds no YAML files any more" in error.message and "(2)" in error.message
    assert sorted(k.name for k in store.configs) == ["other", "reviews"]
    (root / "empty.yaml").write_text("# an empty mesh, on purpose\n")
    wait_for(lambda: not store.configs, "the deliberate empty mesh")
    assert store.errors() == []


def test_a_resource_in_two_files_comes_from_the_first_in_path_order(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    (root / "b.yaml").write_text(vs("reviews", "second.shop.mesh"))
    (root / "sub").mkdir()
    (root / "sub" / "a.yaml").write_text(vs("reviews", "third.shop.mesh"))
    (root / "a.yaml").write_text(vs("reviews", "first.shop.mesh"))
    wait_for(lambda: len(store.errors()) == 2, "both duplicates to be reported")
    assert hosts_of(store.get(vs_key("reviews"))) == ["first.shop.mesh"]
    assert [e.file for e in store.errors()] == [str(root / "b.yaml"), str(root / "sub" / "a.yaml")]
    assert all("VirtualService shop/reviews is defined twice" in e.message for e in store.errors())
    (root / "a.yaml").unlink()
    wait_for(lambda: hosts_of(store.get(vs_key("reviews"))) == ["second.shop.mesh"], "the next file to win")
    assert [e.file for e in store.errors()] == [str(root / "sub" / "a.yaml")]


def test_reload_now_applies_at_once_without_waiting_for_the_debounce(root: Path, store: ConfigStore) -> None:
    (root / "reviews.yaml").write_text(vs("reviews", timeout="5s"))
    slow = WatchOptions(debounce=60.0, max_delay=120.0)
    with DirectoryWatcher([root], store, slow) as watcher:
        assert timeout_of(store, "reviews") == 5  # start() loads before returning
        (root / "reviews.yaml").write_text(vs("reviews", timeout="6s"))
        result = watcher.reload_now()
        assert result.change is not None and [e.key for e in result.change.events] == [vs_key("reviews")]
        assert timeout_of(store, "reviews") == 6
        assert watcher.reload_now().change is None


def test_reload_now_works_without_starting_the_watcher(root: Path, store: ConfigStore) -> None:
    (root / "a.yaml").write_text(vs("a"))
    (root / "broken.yaml").write_text("kind: [")
    result = DirectoryWatcher([root], store).reload_now()
    assert [str(k) for k in store.configs] == ["VirtualService shop/a"]
    assert [e.file for e in result.errors] == [str(root / "broken.yaml")]


@pytest.mark.slow
def test_a_never_ending_stream_of_events_still_reloads_after_max_delay(root: Path, store: ConfigStore) -> None:
    path = root / "reviews.yaml"
    path.write_text(vs("reviews", timeout="1s"))
    options = WatchOptions(debounce=1.0, max_delay=2.0)
    with DirectoryWatcher([root], store, options):
        applied = threading.Event()
        store.subscribe(lambda change: applied.set())
        deadline = time.monotonic() + DEADLINE
        n = 0
        # Never quiet for the debounce: without a max delay nothing would be applied until the end.
        while not applied.is_set() and time.monotonic() < deadline:
            n += 1
            path.write_text(vs("reviews", timeout=f"{n % 9 + 1}s"))
            time.sleep(0.05)
        assert applied.is_set(), "no reload while events kept coming"


@pytest.mark.slow
def test_unchanged_files_are_not_parsed_again(root: Path, store: ConfigStore) -> None:
    for i in range(20):
        (root / f"vs{i}.yaml").write_text(vs(f"r{i}"))
    watcher = DirectoryWatcher([root], store)
    assert watcher.reload_now().parsed == 20
    time.sleep(2.5)  # past the window where a same-size rewrite could keep the same timestamps
    watcher.reload_now()
    (root / "vs3.yaml").write_text(vs("r3", timeout="7s"))
    result = watcher.reload_now()
    assert (result.parsed, result.reused) == (1, 19)
    assert timeout_of(store, "r3") == 7


def test_a_tree_written_just_before_start_is_not_parsed_again_on_the_first_change(
    root: Path, store: ConfigStore
) -> None:
    """Files changed within the racy window are compared by content, not re-parsed: a server
    started on a freshly written tree must not parse all of it again when one file changes."""
    for i in range(20):
        (root / f"vs{i}.yaml").write_text(vs(f"r{i}"))
    watcher = DirectoryWatcher([root], store)
    assert watcher.reload_now().parsed == 20
    (root / "vs3.yaml").write_text(vs("r3", timeout="7s"))  # the same size, at once
    result = watcher.reload_now()
    assert (result.parsed, result.reused) == (1, 19)
    assert timeout_of(store, "r3") == 7
    (root / "vs3.yaml").write_text(vs("r3", timeout="8s"))
    assert watcher.reload_now().parsed == 1
    assert timeout_of(store, "r3") == 8


def test_a_failing_reload_is_reported_and_the_watcher_keeps_going(
    root: Path, store: ConfigStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "reviews.yaml").write_text(vs("reviews", timeout="5s"))
    real_merge = watcher_module.merge_files
    failures = [RuntimeError("disk on fire")]

    def flaky_merge(*args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return real_merge(*args, **kwargs)  # type: ignore[arg-type]

    with DirectoryWatcher([root], store, FAST) as watcher:
        monkeypatch.setattr(watcher_module, "merge_files", flaky_merge)
        result = watcher.reload_now()
        assert [e.message for e in result.errors] == [
            "reload failed, keeping the config loaded before: RuntimeError('disk on fire')"
        ]
        assert [e.file for e in store.errors()] == [str(root)]
        assert timeout_of(store, "reviews") == 5
        (root / "reviews.yaml").write_text(vs("reviews", timeout="6s"))
        wait_for(lambda: timeout_of(store, "reviews") == 6, "the next reload to succeed")
        assert store.errors() == []


def test_a_directory_moved_in_is_loaded(root: Path, tmp_path: Path, store: ConfigStore) -> None:
    staging = tmp_path / "staging"
    (staging / "team").mkdir(parents=True)
    (staging / "team" / "a.yaml").write_text(vs("a"))
    (staging / "team" / "b.yaml").write_text(se("b", "b.shop.mesh"))
    with DirectoryWatcher([root], store, FAST):
        changes = Changes(store)
        os.rename(staging / "team", root / "team")
        wait_for(lambda: len(store.configs) == 2, "both resources of the moved directory")
    assert len(changes.items) == 1


def test_a_kubernetes_configmap_update_is_seen(root: Path, store: ConfigStore) -> None:
    # kubelet's layout: files are symlinks through `..data`, which is swapped by a rename.
    (root / "..v1").mkdir()
    (root / "..v1" / "reviews.yaml").write_text(vs("reviews", timeout="5s"))
    (root / "..data").symlink_to("..v1")
    (root / "reviews.yaml").symlink_to("..data/reviews.yaml")
    with DirectoryWatcher([root], store, FAST):
        assert timeout_of(store, "reviews") == 5
        (root / "..v2").mkdir()
        (root / "..v2" / "reviews.yaml").write_text(vs("reviews", timeout="6s"))
        (root / "..data_tmp").symlink_to("..v2")
        os.replace(root / "..data_tmp", root / "..data")
        shutil.rmtree(root / "..v1")
        wait_for(lambda: timeout_of(store, "reviews") == 6, "the new ConfigMap version")
    assert list(store.configs) == [vs_key("reviews")]


@pytest.mark.parametrize(
    ("path", "is_directory", "relevant"),
    [
        ("/cfg/a.yaml", False, True),
        ("/cfg/team/a.yml", False, True),
        ("/cfg/team", True, True),
        ("/cfg", True, True),  # the root itself: deleted, recreated or re-pointed
        ("/cfg/notes.txt", False, False),
        ("/cfg/a.yaml.tmp", False, False),
        ("/cfg/.a.yaml.swp", False, False),
        ("/cfg/a.yaml~", False, False),
        ("/cfg/.git/config.yaml", False, False),
        ("/cfg/.git", True, False),
        ("/cfg/..data", False, True),
        ("/cfg/..2024_01_01", True, False),
        ("/other/a.yaml", False, False),
        ("/cfgx/a.yaml", False, False),
    ],
)
def test_which_events_schedule_a_reload(path: str, is_directory: bool, relevant: bool) -> None:
    assert is_relevant(path, ["/cfg"], is_directory=is_directory) is relevant


def test_a_watched_symlink_can_be_re_pointed(tmp_path: Path, store: ConfigStore) -> None:
    # The release layout: `current` points at one release directory and is swapped atomically.
    for release, timeout in (("v1", "1s"), ("v2", "2s")):
        (tmp_path / release).mkdir()
        (tmp_path / release / "reviews.yaml").write_text(vs("reviews", timeout=timeout))
    current = tmp_path / "current"
    current.symlink_to("v1")
    with DirectoryWatcher([current], store, FAST):
        assert timeout_of(store, "reviews") == 1
        (tmp_path / "v1" / "reviews.yaml").write_text(vs("reviews", timeout="3s"))
        wait_for(lambda: timeout_of(store, "reviews") == 3, "an edit seen through the link")
        (tmp_path / "next").symlink_to("v2")
        os.replace(tmp_path / "next", current)
        wait_for(lambda: timeout_of(store, "reviews") == 2, "the release the link now points at")
        (tmp_path / "v2" / "reviews.yaml").write_text(vs("reviews", timeout="4s"))
        wait_for(lambda: timeout_of(store, "reviews") == 4, "an edit in the new release")
    [config] = store.list()
    assert config.source.file == str(current / "reviews.yaml")


def test_with_several_directories_the_first_given_wins_a_duplicate(tmp_path: Path, store: ConfigStore) -> None:
    first, second = tmp_path / "z-team", tmp_path / "a-shared"
    for path, host in ((first, "team.shop.mesh"), (second, "shared.shop.mesh")):
        path.mkdir()
        (path / "reviews.yaml").write_text(vs("reviews", host))
    (second / "ratings.yaml").write_text(vs("ratings"))
    result = DirectoryWatcher([first, second], store).reload_now()
    assert hosts_of(store.get(vs_key("reviews"))) == ["team.shop.mesh"]
    assert store.get(vs_key("ratings")) is not None
    assert [e.file for e in result.errors] == [str(second / "reviews.yaml")]


# -- a file still being written --


def no_inotify(*args: object, **kwargs: object) -> object:
    """An Observer that cannot start (out of inotify instances): the watcher polls instead."""
    raise OSError(24, "Too many open files")


def test_a_file_seen_changing_while_read_keeps_its_old_version_and_is_read_again(
    root: Path, store: ConfigStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload (SIGHUP here) in the middle of a save must not load half of the file; it looks
    again soon by itself, with no event (there is no inotify here) and no poll due for a minute."""
    path = root / "reviews.yaml"
    path.write_text(vs("reviews", timeout="5s"))
    monkeypatch.setattr(watcher_module, "Observer", no_inotify)
    options = WatchOptions(debounce=0.1, max_delay=5.0, retry_interval=60.0)
    with DirectoryWatcher([root], store, options) as watcher:
        new = vs("reviews", timeout="6s")
        path.write_text(new[:100])  # the writer's first write
        real_read, rest = files_module.read_bounded, [new[100:]]

        def read_while_the_rest_is_written(*args: Any, **kwargs: Any) -> bytes:
            data = real_read(*args, **kwargs)
            if rest:
                with path.open("a") as f:
                    f.write(rest.pop())
            return data

        monkeypatch.setattr(files_module, "read_bounded", read_while_the_rest_is_written)
        result = watcher.reload_now()
        assert (result.deferred, result.change) == ((str(path),), None)
        assert timeout_of(store, "reviews") == 5
        assert [e.file for e in store.errors()] == [str(root)]  # only "cannot watch": nothing about the file
        wait_for(lambda: timeout_of(store, "reviews") == 6, "the retry to load the whole file", timeout=5.0)
        assert [e.file for e in store.errors()] == [str(root)]


def test_a_slow_writer_is_not_loaded_half_way_by_a_polling_reload(
    root: Path, store: ConfigStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polling (or a reload forced by max_delay) can come in the middle of a save: a file that
    changed less than `debounce` ago waits, so neither file is ever seen with half its documents."""
    shop, new = root / "shop.yaml", root / "new.yaml"
    shop.write_text(documents(vs("a", timeout="1s"), vs("b", timeout="1s"), se("c", "c.shop.mesh")))
    monkeypatch.setattr(watcher_module, "Observer", no_inotify)
    options = WatchOptions(debounce=1.0, max_delay=10.0, retry_interval=0.05)
    with DirectoryWatcher([root], store, options):
        changes = Changes(store)
        shop.write_text(documents(vs("a", timeout="2s"), vs("b", timeout="2s")) + "---\n")  # c comes later
        new.write_text(vs("x") + "---\n")
        time.sleep(0.4)  # a few polls
        shop.write_text(documents(vs("a", timeout="2s"), vs("b", timeout="2s"), se("c", "c.shop.mesh", 9090)))
        new.write_text(documents(vs("x"), vs("y")))
        wait_for(lambda: changes.items, "the finished files")
    (change,) = changes.items
    assert sorted((e.kind.value, e.key.name) for e in change.events) == [
        ("created", "x"),
        ("created", "y"),
        ("updated", "a"),
        ("updated", "b"),
        ("updated", "c"),
    ]


def test_files_of_one_save_are_applied_together_when_their_times_straddle_a_poll(
    root: Path, store: ConfigStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool writes two files, the second half a second after the first: a poll that finds the
    first settled and the second still fresh applies neither, so the save is one change."""
    first, second = root / "first.yaml", root / "second.yaml"
    monkeypatch.setattr(watcher_module, "Observer", no_inotify)
    options = WatchOptions(debounce=0.1, max_delay=10.0, retry_interval=0.05, settle=1.0)
    with DirectoryWatcher([root], store, options):
        changes = Changes(store)
        first.write_text(vs("one"))
        second.write_text(vs("two") + "---\n")
        time.sleep(0.5)  # within `settle` of the first file's write
        second.write_text(documents(vs("two"), vs("three")))
        wait_for(lambda: changes.items, "the save")
        settle(options)
    assert [sorted(e.key.name for e in c.events) for c in changes.items] == [["one", "three", "two"]]


def test_a_file_truncated_by_a_writer_keeps_its_resources_until_it_is_written(
    root: Path, store: ConfigStore, watching: DirectoryWatcher
) -> None:
    """`kubectl get ... > reviews.yaml`: the shell empties the file before kubectl has written
    anything; the fleet must not lose the file's routes in between."""
    path = root / "reviews.yaml"
    path.write_text(documents(vs("reviews", timeout="5s"), se("ratings", "ratings.shop.mesh")))
    wait_for(lambda: timeout_of(store, "reviews") == 5, "the first version")
    changes = Changes(store)
    with path.open("w") as f:  # truncated now
        time.sleep(1.0)  # ten times the debounce
        f.write(documents(vs("reviews", timeout="6s"), se("ratings", "ratings.shop.mesh")))
    wait_for(lambda: timeout_of(store, "reviews") == 6, "the written file")
    assert [(e.kind.value, e.key.name) for c in changes.items for e in c.events] == [("updated", "reviews")]


def test_a_file_emptied_on_purpose_is_applied_after_max_delay_or_at_once_by_reload_now(
    root: Path, store: ConfigStore
) -> None:
    (root / "a.yaml").write_text(vs("a"))
    (root / "b.yaml").write_text(vs("b"))
    options = WatchOptions(debounce=0.1, max_delay=0.5, retry_interval=0.2)
    with DirectoryWatcher([root], store, options) as watcher:
        (root / "a.yaml").write_text("")
        wait_for(lambda: store.get(vs_key("a")) is None, "the empty file to be applied", timeout=5.0)
        (root / "b.yaml").write_text("")
        assert watcher.reload_now().change is not None  # SIGHUP: the files are as meant
        assert not store.configs and store.errors() == []


def test_a_link_to_a_directory_outside_the_tree_is_not_walked_and_is_said_once(
    root: Path, tmp_path: Path, store: ConfigStore, caplog: pytest.LogCaptureFixture
) -> None:
    """`ln -s /usr mesh/usr`: a link that leads out of the config directory is not walked, on
    this reload or any later one; one warning says where it leads. Links within the tree, to a
    directory or to a file anywhere, are followed."""
    caplog.set_level(logging.INFO, logger="meshctl.config.watcher")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "stray.yaml").write_text(vs("stray"))
    (outside / "shared.yaml").write_text(vs("shared", host="shared.shop.mesh"))
    (root / "teams" / "a").mkdir(parents=True)
    (root / "teams" / "a" / "a.yaml").write_text(vs("a", host="a.shop.mesh"))
    (root / "team-a").symlink_to("teams/a")  # inside: read (once, as teams/a)
    (root / "out").symlink_to(outside)  # outside: not walked
    (root / "shared.yaml").symlink_to(outside / "shared.yaml")  # a file: read wherever it is
    (root / "reviews.yaml").write_text(vs("reviews"))
    with DirectoryWatcher([root], store, FAST) as watcher:
        assert {k.name for k in store.configs} == {"a", "reviews", "shared"}
        (root / "reviews.yaml").write_text(vs("reviews", timeout="7s"))
        wait_for(lambda: timeout_of(store, "reviews") == 7, "an edit")
        watcher.reload_now()
        assert store.get(vs_key("stray")) is None
        (warning,) = store.file_status()[str(root / "out")].findings
    assert "not read: a link to" in warning.message and str(outside) in warning.message
    said = [r.getMessage() for r in caplog.records if "not read: a link to" in r.getMessage()]
    assert len(said) == 1, said


def test_a_writer_that_pauses_between_two_parts_is_not_served_half_way(root: Path, store: ConfigStore) -> None:
    """A script writes the first documents of a file, works for half a second (five times the
    debounce), then writes the rest: the half file parses, and serving it would delete the
    resources of the second half for a moment. Default timings, real file events."""
    path = root / "shop.yaml"
    first = documents(vs("a", timeout="1s"), vs("b", timeout="1s"))
    second = documents(se("c", "c.shop.mesh"), se("d", "d.shop.mesh"))
    path.write_text(first + "---\n" + second)
    with DirectoryWatcher([root], store, WatchOptions()):
        assert len(store.configs) == 4
        changes = Changes(store)
        with path.open("w") as f:
            f.write(documents(vs("a", timeout="2s"), vs("b", timeout="2s")) + "---\n")
            f.flush()
            time.sleep(0.5)
            f.write(second)
        wait_for(lambda: timeout_of(store, "a") == 2, "the finished file")
        settle(FAST)
    assert [sorted((e.kind.value, e.key.name) for e in c.events) for c in changes.items] == [
        [("updated", "a"), ("updated", "b")]
    ]


def test_a_file_that_fails_to_load_and_changed_meanwhile_is_retried_without_an_error(
    root: Path, store: ConfigStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer finishes while the half it had written is being parsed: the half's parse
    error is not reported, the file keeps its last good contents and is read again."""
    path = root / "reviews.yaml"
    path.write_text(vs("reviews", timeout="5s"))
    finished = vs("reviews", timeout="6s")
    real_load = watcher_module.load_bytes

    def load_while_the_writer_finishes(raw: bytes, display: str, *args: Any, **kwargs: Any) -> Any:
        result = real_load(raw, display, *args, **kwargs)
        if raw == finished[:100].encode():
            path.write_text(finished)  # the rest arrives meanwhile
        return result

    with DirectoryWatcher([root], store, FAST) as watcher:
        monkeypatch.setattr(watcher_module, "load_bytes", load_while_the_writer_finishes)
        caplog.set_level(logging.INFO, logger="meshctl.config.watcher")
        path.write_text(finished[:100])  # the first 100 bytes: a YAML error
        result = watcher.reload_now()
        assert result.errors == () and result.deferred == (str(path),)
        assert timeout_of(store, "reviews") == 5 and store.errors() == []
        wait_for(lambda: timeout_of(store, "reviews") == 6, "the finished file")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
