"""A running `meshctl serve` (and `meshctl validate`) against a config directory an attacker or an
unlucky operator filled: nesting that once overflowed the C stack, a FIFO, a link to /dev/zero, link
cycles, a million empty documents. The server must not crash, hang or balloon; it names each bad
file, keeps serving the last good config, and still follows edits, SIGHUP and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import PRODUCTPAGE, examples_copy

from meshctl.testing.ads_client import AdsClient
from meshctl.testing.serve_process import ServeProcess, meshctl_command
from meshctl.xds import types

#: Resident memory the server may reach on the example mesh with every hostile file in place; it
#: peaked at 1.7 GB on the empty documents alone, and at 2.6 GB read from /dev/zero.
MAX_RSS_BYTES = 400 * 1024 * 1024

pytestmark = pytest.mark.slow


def add_hostile_entries(root: Path) -> dict[str, str]:
    """Fill `root/hostile` and return, per file, what the server must say about it."""
    hostile = root / "hostile"
    hostile.mkdir()
    (hostile / "nested.yaml").write_text("[" * 30_000)
    (hostile / "compact.yaml").write_text("- " * 30_000 + "x\n")
    (hostile / "documents.yaml").write_text("---\n" * 900_000)
    (hostile / "empties.yaml").write_text("{}\n---\n" * 20_000)
    os.mkfifo(hostile / "pipe.yaml")
    os.symlink("/dev/zero", hostile / "zero.yaml")
    os.symlink(".", hostile / "a")
    os.symlink(".", hostile / "b")
    os.symlink("..", hostile / "up")
    return {
        "nested.yaml": "nesting deeper than 100 levels",
        "compact.yaml": "nesting deeper than 100 levels",
        "documents.yaml": "more than",
        "empties.yaml": "more like it",
        "pipe.yaml": "not a regular file",
        "zero.yaml": "not a regular file",
    }


def wait_until(what: str, check: Callable[[], bool], log: Callable[[], str], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}\n--- log:\n{log()[-4000:]}")
        time.sleep(0.1)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    return examples_copy(tmp_path)


@pytest.fixture
def serve(mesh: Path) -> Iterator[ServeProcess]:
    with ServeProcess([mesh]) as process:
        yield process


def resources(serve: ServeProcess) -> set[tuple[str, str, str]]:
    return {(r["kind"], r["namespace"], r["name"]) for r in serve.admin_json("debug/configz")["resources"]}


def test_serve_survives_every_hostile_entry_and_keeps_serving(serve: ServeProcess, mesh: Path) -> None:
    before = resources(serve)
    expected = add_hostile_entries(mesh)
    serve.reload()  # SIGHUP as well as the file events: neither may hang on the FIFO

    def all_reported() -> bool:
        errors = " ".join(f"{e['file']}: {e['message']}" for e in serve.admin_json("debug/configz")["errors"])
        return all(f"{name}: " in errors and words in errors for name, words in expected.items())

    wait_until("every hostile file reported on /debug/configz", all_reported, serve.log)
    assert serve.ready()
    assert resources(serve) == before  # nothing lost, nothing half-read

    # Still following edits: a new resource next to the hostile files arrives.
    (mesh / "later.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: later, namespace: bookinfo}\n"
        "spec: {hosts: [later.example.com], resolution: DNS, location: MESH_EXTERNAL,"
        " ports: [{number: 80, name: http, protocol: HTTP}]}\n"
    )
    later = ("ServiceEntry", "bookinfo", "later")
    wait_until("the edit after the hostile files", lambda: later in resources(serve), serve.log)
    assert serve.pid is not None and peak_rss(serve.pid) < MAX_RSS_BYTES

    # Each bad file is logged, in a bounded number of lines.
    log = serve.log()
    for name in expected:
        assert name in log, name
    assert log.count("\n") < 2_000

    # A proxy gets its whole config from the server all along.
    async def proxy() -> None:
        async with AdsClient(serve.xds_address, PRODUCTPAGE) as client:
            cluster = "outbound|80||later.example.com"
            await client.wait_for(lambda c: c.complete() and cluster in c.names(types.CLUSTER), timeout=20)

    asyncio.run(proxy())
    started = time.monotonic()
    assert serve.stop(timeout=20) == 0
    assert time.monotonic() - started < 20


def test_validate_reports_each_hostile_entry_and_exits_1(mesh: Path) -> None:
    expected = add_hostile_entries(mesh)
    proc = subprocess.run(
        [*meshctl_command(), "validate", str(mesh)], capture_output=True, text=True, timeout=120, check=False
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 1, report[-3000:]
    for name, words in expected.items():
        assert any(name in line and words in line for line in report.splitlines()), (name, report[-3000:])
    assert report.count("\n") < 1_000


def test_validate_of_stdin_stops_reading_at_the_size_limit() -> None:
    """`validate -` reads at most the limit, whatever arrives on stdin (here: /dev/zero)."""
    with open("/dev/zero", "rb") as zero:
        proc = subprocess.run(
            [*meshctl_command(), "validate", "-"], stdin=zero, capture_output=True, text=True, timeout=60, check=False
        )
    assert proc.returncode == 1
    assert "limit" in proc.stdout + proc.stderr
