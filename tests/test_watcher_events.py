"""The directory watcher reloads what file events name, and its full passes repair what no
event told: real files, a real watchdog observer, the watcher's own thread."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.config.model import ConfigKey
from meshctl.config.store import ConfigStore
from meshctl.config.watcher import DirectoryWatcher, WatchOptions
from meshctl.testing.serve_process import ServeProcess

DEADLINE = 20.0


def vs(name: str, host: str = "reviews.shop.mesh", timeout: str = "5s") -> str:
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


def vs_key(name: str) -> ConfigKey:
    return ConfigKey("VirtualService", "shop", name)


def timeout_of(store: ConfigStore, name: str) -> int | None:
    config = store.get(vs_key(name))
    return None if config is None else int(config.spec.http[0].timeout.seconds)  # type: ignore[attr-defined]


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def test_a_change_no_event_tells_of_is_picked_up_by_the_periodic_full_pass(tmp_path: Path) -> None:
    """A link to a file outside the tree: an edit of what it leads to makes no event in any
    watched directory, and only a full pass reads it again."""
    root, outside = tmp_path / "mesh", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (outside / "reviews.yaml").write_text(vs("reviews", timeout="5s"))
    (root / "reviews.yaml").symlink_to(outside / "reviews.yaml")
    (root / "ratings.yaml").write_text(vs("ratings", host="ratings.shop.mesh"))
    store = ConfigStore()
    options = WatchOptions(debounce=0.1, max_delay=5.0, resync_period=0.5)
    with DirectoryWatcher([root], store, options):
        assert timeout_of(store, "reviews") == 5
        (outside / "reviews.yaml").write_text(vs("reviews", timeout="7s"))
        wait_for(lambda: timeout_of(store, "reviews") == 7, "the periodic pass to read the linked file again")
        # Watching goes on as before: an edit inside the tree is still applied by its event.
        (root / "ratings.yaml").write_text(vs("ratings", host="ratings.shop.mesh", timeout="9s"))
        wait_for(lambda: timeout_of(store, "ratings") == 9, "an edit in the tree")


class FileAccess:
    """The files under `root` that the watcher's own thread stats or opens, by wrapping the
    os functions every reader in meshctl reaches them through."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = str(root) + os.sep
        self.paths: set[str] = set()
        self.counting = False
        for name in ("stat", "lstat", "open", "scandir"):
            monkeypatch.setattr(os, name, self._counted(getattr(os, name)))

    def _counted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
            if self.counting and threading.current_thread().name == "meshctl-config-watcher":
                text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
                if text.startswith(self.root):
                    self.paths.add(text)
            return real(path, *args, **kwargs)

        return counted


@pytest.fixture
def big_tree(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "mesh"
    for team in range(20):
        (root / f"team-{team}").mkdir(parents=True)
        for i in range(100):
            name = f"r{team}-{i}"
            (root / f"team-{team}" / f"{name}.yaml").write_text(vs(name, host=f"{name}.shop.mesh"))
    yield root


def test_an_edit_in_a_large_tree_reads_that_file_and_no_other(big_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 files: the reload after one file's event stats and opens that file only, and the
    edit is applied."""
    store = ConfigStore()
    access = FileAccess(big_tree, monkeypatch)
    edited = big_tree / "team-7" / "r7-42.yaml"
    with DirectoryWatcher([big_tree], store, WatchOptions(debounce=0.1, max_delay=5.0)):
        assert len(store.configs) == 2000
        access.counting = True
        edited.write_text(vs("r7-42", host="r7-42.shop.mesh", timeout="8s"))
        wait_for(lambda: timeout_of(store, "r7-42") == 8, "the edit")
        access.counting = False
    assert len(store.configs) == 2000
    assert access.paths == {str(edited)}, sorted(access.paths)[:5]


def test_a_file_deleted_and_one_created_by_events_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files come and go in a directory the watcher has walked: each event's path is read alone
    (no directory is listed again, no other file looked at), and the result is what a full pass
    finds."""
    root = tmp_path / "mesh"
    (root / "team").mkdir(parents=True)
    for name in "abde":
        (root / "team" / f"{name}.yaml").write_text(vs(name))
    store = ConfigStore()
    access = FileAccess(root, monkeypatch)
    with DirectoryWatcher([root], store, WatchOptions(debounce=0.1, max_delay=5.0, resync_period=0)) as watcher:
        access.counting = True
        (root / "team" / "a.yaml").unlink()
        (root / "team" / "c.yaml").write_text(vs("c"))
        wait_for(lambda: sorted(k.name for k in store.configs) == ["b", "c", "d", "e"], "the delete and the create")
        access.counting = False
        assert access.paths <= {str(root / "team" / "a.yaml"), str(root / "team" / "c.yaml")}
        by_events = dict(store.configs)
        assert watcher.reload_now().change is None  # a full pass finds nothing more to do
    assert dict(store.configs) == by_events
    assert sorted(store.configs) == [vs_key(n) for n in "bcde"]


@pytest.mark.slow
def test_serve_resync_period_repairs_what_no_event_told_of(tmp_path: Path) -> None:
    """`meshctl serve --resync-period`: the same repair in the server, as its admin page shows."""
    root, outside = tmp_path / "mesh", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (outside / "reviews.yaml").write_text(vs("reviews"))
    (root / "reviews.yaml").symlink_to(outside / "reviews.yaml")
    with ServeProcess([root], extra_args=["--resync-period", "0.5"]) as server:

        def names() -> set[str]:
            return {r["name"] for r in server.admin_json("/debug/configz")["resources"]}

        assert names() == {"reviews"}
        (outside / "reviews.yaml").write_text(vs("reviews-v2"))
        wait_for(lambda: names() == {"reviews-v2"}, "the server's periodic pass to read the linked file again")


def test_a_file_a_meshctlignore_names_is_not_served_when_its_event_comes(tmp_path: Path) -> None:
    """Whether a file is read is the ignore rules' to say: an event on an ignored file's path
    does not make the watcher read it alone."""
    root = tmp_path / "mesh"
    root.mkdir()
    (root / ".meshctlignore").write_text("*.tmpl.yaml\n")
    (root / "reviews.yaml").write_text(vs("reviews"))
    store = ConfigStore()
    with DirectoryWatcher([root], store, WatchOptions(debounce=0.1, max_delay=5.0, resync_period=0)):
        (root / "draft.tmpl.yaml").write_text(vs("draft"))
        (root / "ratings.yaml").write_text(vs("ratings", host="ratings.shop.mesh"))
        wait_for(lambda: store.get(vs_key("ratings")) is not None, "the file that is config")
    assert sorted(k.name for k in store.configs) == ["ratings", "reviews"]
