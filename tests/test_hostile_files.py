"""What a config directory may hold besides config: FIFOs, devices, endless files, symlink cycles.

`meshctl validate` and `meshctl serve` must each report such a name as a finding that names it,
keep going with every other file, and never block, loop or read without end. Each test runs the
code under test in a thread with a bounded wait, so a regression fails instead of hanging the run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config import files
from meshctl.config.findings import Severity
from meshctl.config.loader import LoadOptions, discover, load_file
from meshctl.config.model import ConfigKey
from meshctl.config.store import ConfigStore
from meshctl.config.tree import load_paths
from meshctl.config.watcher import DirectoryWatcher, WatchOptions
from meshctl.errors import ConfigError

T = TypeVar("T")
BOUND = 10.0  # seconds; everything here takes milliseconds

SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
  namespace: shop
spec:
  hosts: [{name}.shop.mesh]
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  resolution: DNS
"""

FAST = WatchOptions(debounce=0.1, max_delay=5.0, retry_interval=0.2)


def se(name: str, port: int = 9080) -> str:
    return SE.format(name=name, port=port)


def se_key(name: str) -> ConfigKey:
    return ConfigKey("ServiceEntry", "shop", name)


def port_of(store: ConfigStore, name: str) -> int | None:
    config = store.get(se_key(name))
    return None if config is None else int(config.spec.ports[0].number)  # type: ignore[attr-defined]


def within(seconds: float, work: Callable[[], T]) -> T:
    """`work()`, failing the test if it has not returned after `seconds` (it may be blocked)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s: blocked or looping"
    if errors:
        raise errors[0]
    return out[0]


def wait_for(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def messages_for(findings: object, path: Path) -> list[str]:
    return [f.message for f in findings if f.file == str(path)]  # type: ignore[attr-defined]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A config directory with one good file beside whatever a test adds."""
    root = tmp_path / "config"
    root.mkdir()
    (root / "good.yaml").write_text(se("good"))
    return root


# -- what is not a regular file --


@pytest.mark.timeout(20)
def test_a_fifo_named_yaml_is_refused_without_blocking(tree: Path) -> None:
    fifo = tree / "pipe.yaml"
    os.mkfifo(fifo)
    result = within(BOUND, lambda: load_paths([tree]))
    assert messages_for(result.all_findings(), fifo) == ["not a regular file (a FIFO); only regular files are read"]
    assert [c.key for c in result.files[str(tree / "good.yaml")].configs] == [se_key("good")]


@pytest.mark.timeout(20)
def test_a_socket_and_a_device_are_refused(tree: Path) -> None:
    import socket

    (tree / "zero.yaml").symlink_to("/dev/zero")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tree / "s.yaml"))
        result = within(BOUND, lambda: load_paths([tree]))
    finally:
        sock.close()
    assert messages_for(result.all_findings(), tree / "zero.yaml") == [
        "not a regular file (a character device); only regular files are read"
    ]
    assert "(a socket)" in messages_for(result.all_findings(), tree / "s.yaml")[0]
    assert result.files[str(tree / "good.yaml")].ok


@pytest.mark.timeout(20)
def test_validate_reports_a_fifo_and_exits_1(tree: Path) -> None:
    os.mkfifo(tree / "pipe.yaml")
    result = within(BOUND, lambda: CliRunner().invoke(app, ["validate", str(tree)]))
    assert result.exit_code == 1, result.output
    assert f"error {tree / 'pipe.yaml'}: not a regular file (a FIFO)" in result.stdout


# -- the size limit holds on what is read --


def test_a_file_whose_size_says_0_is_read_only_up_to_the_limit(tree: Path) -> None:
    """A file in /proc is a regular file of size 0 with content: the limit must hold anyway."""
    link = tree / "maps.yaml"
    link.symlink_to("/proc/self/maps")
    assert os.stat(link).st_size == 0 and len(Path("/proc/self/maps").read_bytes()) > 1000
    result = within(BOUND, lambda: load_file(link, LoadOptions(max_file_bytes=1000)))
    assert [f.message for f in result.findings] == ["file is over the 1000-byte limit for a config file"]


def test_reading_stops_one_byte_past_the_limit() -> None:
    served: list[int] = []

    def endless(n: int) -> bytes:
        served.append(n)
        return b"x" * n

    with pytest.raises(ConfigError, match="over the 1000-byte limit"):
        files.read_bounded(endless, 1000)
    assert sum(served) == 1001


def test_a_file_over_the_limit_by_its_size_is_not_read(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tree / "big.yaml"
    big.write_text("# " + "x" * 5000 + "\n")
    monkeypatch.setattr(files, "read_bounded", lambda *a, **k: pytest.fail("read a file its size refuses"))
    (finding,) = load_file(big, LoadOptions(max_file_bytes=1000)).findings
    assert finding.message == "file is 5003 bytes, over the 1000-byte limit for a config file"


# -- symlink cycles --


@pytest.mark.timeout(20)
def test_symlink_cycles_are_walked_once_with_a_warning(tree: Path) -> None:
    """`a -> .` and `b -> .` once made the walk visit 2^40 copies of the tree."""
    (tree / "team").mkdir()
    (tree / "team" / "t.yaml").write_text(se("t"))
    for name in ("a", "b"):
        (tree / name).symlink_to(".")
    (tree / "team" / "up").symlink_to("..")
    result = within(BOUND, lambda: load_paths([tree]))
    assert [Path(p).relative_to(tree).as_posix() for p in result.files] == ["good.yaml", "team/t.yaml"]
    warnings = {f.file: f.message for f in result.findings}
    assert warnings == {
        str(tree / "a"): f"not read again: it leads to {tree}, already read",
        str(tree / "b"): f"not read again: it leads to {tree}, already read",
        str(tree / "team" / "up"): f"not read again: it leads to {tree}, already read",
    }
    assert all(f.severity is Severity.WARNING for f in result.findings)


def test_a_directory_linked_twice_is_read_once_under_its_real_name(tree: Path) -> None:
    (tree / "team").mkdir()
    (tree / "team" / "t.yaml").write_text(se("t"))
    (tree / "alias").symlink_to("team")  # sorts first, but the real directory claims it
    result = load_paths([tree])
    assert [Path(p).relative_to(tree).as_posix() for p in result.files] == ["good.yaml", "team/t.yaml"]
    assert [f.file for f in result.findings] == [str(tree / "alias")]
    assert not [f for f in result.all_findings() if f.severity is Severity.ERROR]  # no "defined twice"


def test_the_walk_order_is_that_of_os_walk(tmp_path: Path) -> None:
    """The watcher's path order (which file wins a duplicate) relies on it."""
    for rel in ["b.yaml", "a.yml", "z/x.yaml", "z/a/y.yaml", "m/k.yaml", "m/.hidden/h.yaml", ".h.yaml", "n.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "l").symlink_to("m")  # would be read twice by os.walk; kept out of the comparison
    expected: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(tmp_path, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "l")
        expected += [Path(dirpath) / n for n in sorted(filenames) if n.endswith((".yaml", ".yml")) and n[0] != "."]
    assert discover([tmp_path]) == expected


# -- the server --


@pytest.fixture
def watching(tree: Path) -> Iterator[tuple[DirectoryWatcher, ConfigStore]]:
    store = ConfigStore()
    watcher = DirectoryWatcher([tree], store, FAST)
    within(BOUND, watcher.start)
    try:
        yield watcher, store
    finally:
        within(BOUND, watcher.stop)


@pytest.mark.timeout(30)
def test_the_server_reports_a_fifo_and_keeps_applying_edits(tree: Path) -> None:
    os.mkfifo(tree / "pipe.yaml")
    (tree / "zero.yaml").symlink_to("/dev/zero")
    store = ConfigStore()
    watcher = DirectoryWatcher([tree], store, FAST)
    result = within(BOUND, watcher.start)  # the first load: blocked for good, before
    try:
        assert sorted(e.file or "" for e in result.errors) == [str(tree / "pipe.yaml"), str(tree / "zero.yaml")]
        assert [k.name for k in store.configs] == ["good"]
        (tree / "good.yaml").write_text(se("good", port=9090))  # the watcher thread is not stuck
        wait_for(lambda: port_of(store, "good") == 9090, "an edit after the FIFO")
        assert "(a FIFO)" in store.file_status()[str(tree / "pipe.yaml")].findings[0].message
    finally:
        within(BOUND, watcher.stop)


@pytest.mark.timeout(30)
def test_a_file_replaced_by_a_fifo_keeps_its_last_good_resources(
    tree: Path, watching: tuple[DirectoryWatcher, ConfigStore]
) -> None:
    watcher, store = watching
    (tree / "other.yaml").write_text(se("other"))
    wait_for(lambda: port_of(store, "other") == 9080, "the file")
    os.mkfifo(tree / "fifo.tmp")
    os.replace(tree / "fifo.tmp", tree / "other.yaml")
    wait_for(store.errors, "the FIFO to be reported")
    (error,) = store.errors()
    assert (error.file, error.message) == (
        str(tree / "other.yaml"),
        "not a regular file (a FIFO); only regular files are read",
    )
    assert port_of(store, "other") == 9080
    assert within(BOUND, watcher.reload_now).errors == (error,)  # SIGHUP: not blocked either


@pytest.mark.timeout(30)
def test_the_server_walks_a_symlink_cycle_once(tree: Path) -> None:
    for name in ("a", "b"):
        (tree / name).symlink_to(".")
    store = ConfigStore()
    watcher = DirectoryWatcher([tree], store, FAST)
    result = within(BOUND, watcher.start)
    try:
        assert result.errors == ()  # in particular, no resource "defined twice"
        assert [k.name for k in store.configs] == ["good"]
        status = store.file_status()
        assert status[str(tree / "a")].findings[0].message == f"not read again: it leads to {tree}, already read"
    finally:
        within(BOUND, watcher.stop)


def test_the_server_logs_a_file_of_many_broken_documents_in_a_few_lines(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each finding is logged: a file of 20,000 `{}` documents once made 20,000 log lines."""
    (tree / "junk.yaml").write_text("{}\n---\n" * 20_000)
    store = ConfigStore()
    with caplog.at_level("WARNING", logger="meshctl.config.watcher"):
        result = DirectoryWatcher([tree], store, FAST).reload_now()
    assert [e.message for e in result.errors] == ["missing kind (and 19,999 more like it in this file)"]
    assert len(caplog.records) == 1
    assert [k.name for k in store.configs] == ["good"]
