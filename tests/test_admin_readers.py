"""The CLI's readers of a server (`proxy-status`, `version --server`, `diff --live`) against
what may answer at an address an operator typed: a server that streams without end, one that
trickles a byte a second, JSON of the wrong shape. Each ends with one line and exit 2, within
its deadline and its byte limit. And the server's own admin port against idle connections.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import EXAMPLES, PRODUCTPAGE

from meshctl.testing.serve_process import ServeProcess, limited_meshctl_command

pytestmark = pytest.mark.slow

#: Far above what the CLI needs, far below what reading an endless answer whole would take.
_MEMORY_LIMIT = 2 * 1024**3

Handler = Callable[[socket.socket, threading.Event], None]


@contextmanager
def answering(handler: Handler) -> Iterator[str]:
    """A loopback HTTP server (HOST:PORT) whose every connection `handler` answers, until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=_answer, args=(conn, handler, stop), daemon=True)
            thread.start()
            threads.append(thread)

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(5)
        for thread in threads:
            thread.join(5)
        listener.close()


def _answer(conn: socket.socket, handler: Handler, stop: threading.Event) -> None:
    with conn:
        conn.settimeout(2)
        try:
            conn.recv(65536)  # the request (small, in one segment on loopback)
            handler(conn, stop)
        except OSError:
            pass  # the client left: what it should do


def endless(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
    chunk = b'{"proxy": "x", "types": {}},' * 40_000
    sent = 0
    while not stop.is_set() and sent < 8 * 1024**3:  # bounded all the same
        conn.sendall(chunk)
        sent += len(chunk)


def trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(100):
        if stop.wait(1.0):
            return
        conn.sendall(b" ")


def trickle_head(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(100):
        if stop.wait(1.0):
            return
        conn.sendall(b"a")


def answer(body: bytes) -> Handler:
    def handler(conn: socket.socket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        conn.sendall(head.encode() + body)

    return handler


def meshctl(*args: str) -> tuple[str, float]:
    """Run the CLI; returns its one error line and the seconds it took, after checking exit 2."""
    started = time.monotonic()
    proc = subprocess.run(
        [*limited_meshctl_command(_MEMORY_LIMIT), *args], capture_output=True, text=True, timeout=120, check=False
    )
    took = time.monotonic() - started
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "internal error" not in line, line
    return line, took


def proxy_status(address: str) -> tuple[str, float]:
    return meshctl("proxy-status", "--admin", address)


def version(address: str) -> tuple[str, float]:
    return meshctl("version", "--server", address)


def diff_live(address: str) -> tuple[str, float]:
    return meshctl("diff", "--live", f"http://{address}", "--proxy", PRODUCTPAGE, "--config-dir", str(EXAMPLES))


# -- bytes and time -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [proxy_status, version, diff_live])
def test_an_endless_answer_is_refused_at_the_byte_limit(command: Callable[[str], tuple[str, float]]) -> None:
    with answering(endless) as address:
        line, _ = command(address)
    assert "the answer is over" in line and "bytes" in line


@pytest.mark.parametrize(("command", "handler"), [(proxy_status, trickle_head), (version, trickle_body)])
def test_a_trickle_ends_at_the_deadline(command: Callable[[str], tuple[str, float]], handler: Handler) -> None:
    with answering(handler) as address:
        line, took = command(address)
    assert f"{address} did not answer within 10s" in line
    assert took < 60  # the deadline is 10 s; without one, a byte a second never ends


def test_diff_live_against_a_trickle_ends_at_its_deadline() -> None:
    with answering(trickle_body) as address:
        line, took = meshctl(
            "diff",
            "--live",
            f"http://{address}",
            "--live-timeout",
            "3",
            "--proxy",
            PRODUCTPAGE,
            "--config-dir",
            str(EXAMPLES),
        )
    assert "did not answer within 3s" in line
    assert took < 30  # a byte a second never ends without the deadline


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_diff_live_takes_only_a_usable_deadline(value: str) -> None:
    line, _ = meshctl(
        "diff",
        "--live",
        "http://127.0.0.1:1",
        "--live-timeout",
        value,
        "--proxy",
        PRODUCTPAGE,
        "--config-dir",
        str(EXAMPLES),
    )
    assert "--live-timeout" in line and "finite number of seconds" in line


# -- JSON of the wrong shape ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"[1]",
        b'{"proxy": "x"}',
        b'[{"proxy": 1, "types": {}}]',
        b'[{"proxy": "x", "types": []}]',
        b'[{"proxy": "x", "types": {"CDS": [1]}}]',
        b"[" * 100_000,
    ],
)
def test_syncz_of_the_wrong_shape_is_one_line(body: bytes) -> None:
    with answering(answer(body)) as address:
        line, _ = proxy_status(address)
    assert address in line


def test_a_version_page_of_the_wrong_shape_is_one_line() -> None:
    with answering(answer(b"[]")) as address:
        line, _ = version(address)
    assert "is JSON but not an object" in line


@pytest.mark.parametrize(
    "body",
    [
        b'{"configs": [1]}',
        b'{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump", "dynamic_listeners": [1]}]}',
        b'{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", '
        b'"dynamic_active_clusters": [{"cluster": 5}]}]}',
        b'{"configs": ' + b"[" * 100_000,
    ],
)
def test_a_config_dump_of_the_wrong_shape_is_one_line(body: bytes) -> None:
    with answering(answer(body)) as address:
        line, _ = diff_live(address)
    assert address in line


# -- the server's admin port ------------------------------------------------------------------------


def test_idle_admin_connections_are_bounded_and_counted_in_one_line() -> None:
    with ServeProcess([EXAMPLES]) as server:
        host, port = server.admin_address.rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(600)]
        try:
            assert server.ready()  # answered while they wait
            # Past the time a request head may take, and past the old one (10 s): all closed.
            deadline = time.monotonic() + 60
            while "admin connection" not in server.log() or not _all_closed(idle):
                assert time.monotonic() < deadline, server.log()[-3000:]
                time.sleep(0.2)
            assert server.ready()
        finally:
            for conn in idle:
                conn.close()
        server.stop()
        log = server.log()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "admin connection" in line]
    assert 1 <= len(lines) <= 2, lines  # the first, then at most one a minute (and one at stop)


def _all_closed(conns: list[socket.socket]) -> bool:
    for conn in conns:
        conn.settimeout(0.001)
        try:
            if conn.recv(1) != b"":
                return False
        except TimeoutError:
            return False
        except OSError:
            pass  # reset: closed
    return True


def test_a_token_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with answering(answer(b"[]")) as address:
        line, _ = meshctl("proxy-status", "--admin", address, "--admin-token-file", str(fifo))
    assert f"cannot read the admin token file {fifo}" in line and "not a regular file (a FIFO)" in line
