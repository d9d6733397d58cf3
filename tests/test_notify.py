"""sd_notify: what `meshctl serve` tells systemd, seen from a datagram socket standing in for it."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REVIEWS_V1, examples_copy

from meshctl.server.notify import NotifySettings, SystemdNotifier, service_status, socket_address
from meshctl.testing.ads_client import AdsClient

Message = dict[str, str]


def parse(datagram: bytes) -> Message:
    """One notification as systemd reads it: newline-separated KEY=VALUE assignments."""
    text = datagram.decode()
    assert text.endswith("\n"), text
    return dict(line.split("=", 1) for line in text.splitlines())


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket at a path, as systemd's /run/systemd/notify is."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    yield str(path), sock
    sock.close()


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "usec"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30_000_000),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30_000_000),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({}, None),
    ],
)
def test_watchdog_settings_follow_sd_watchdog_enabled(environ: dict[str, str], usec: int | None) -> None:
    settings = NotifySettings.from_environ({"NOTIFY_SOCKET": "/run/systemd/notify", **environ}, pid=4242)
    assert settings.socket == "/run/systemd/notify"
    assert settings.watchdog_usec == usec
    assert settings.watchdog_interval == (usec / 2_000_000 if usec else None)


def test_no_notify_socket_means_no_notifier() -> None:
    settings = NotifySettings.from_environ({"NOTIFY_SOCKET": "", "WATCHDOG_USEC": "1000000"}, pid=1)
    notifier = SystemdNotifier(settings, lambda: "status")
    assert settings.socket is None
    assert not notifier.enabled
    assert notifier.send("READY=1") is False
    notifier.ready()
    notifier.stopping()


@pytest.mark.parametrize(
    ("name", "address"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@meshctl-test", "\0meshctl-test"),
        ("@", None),
        ("vsock:2:1234", None),
        ("relative/path", None),
    ],
)
def test_socket_address(name: str, address: str | None) -> None:
    assert socket_address(name) == address


# -- sending --------------------------------------------------------------------------------


def test_lifecycle_messages(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = SystemdNotifier(NotifySettings(socket=path), lambda: "3 resources, 1 service, 0 proxies connected")

    notifier.ready()
    assert parse(sock.recv(4096)) == {"READY": "1", "STATUS": "3 resources, 1 service, 0 proxies connected"}

    before = time.monotonic_ns() // 1000
    notifier.reloading()
    after = time.monotonic_ns() // 1000
    reloading = parse(sock.recv(4096))
    assert reloading["RELOADING"] == "1"
    # CLOCK_MONOTONIC is one clock for the whole host: the value sent lies between our readings.
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after
    notifier.ready()
    assert parse(sock.recv(4096))["READY"] == "1"

    notifier.stopping()
    assert parse(sock.recv(4096))["STOPPING"] == "1"
    asyncio.run(notifier.close())


def test_abstract_socket() -> None:
    name = f"meshctl-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        notifier = SystemdNotifier(NotifySettings(socket="@" + name), lambda: "up")
        assert notifier.send("READY=1", "STATUS=up")
        assert parse(sock.recv(4096)) == {"READY": "1", "STATUS": "up"}
        asyncio.run(notifier.close())


def test_a_vanished_socket_is_reported_once_and_never_raises(
    listener: tuple[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    path, sock = listener
    notifier = SystemdNotifier(NotifySettings(socket=path), lambda: "up")
    assert notifier.send("WATCHDOG=1")
    sock.close()
    os.unlink(path)
    with caplog.at_level(logging.DEBUG, logger="meshctl.server.notify"):
        assert notifier.send("WATCHDOG=1") is False
        assert notifier.send("WATCHDOG=1") is False
    levels = [r.levelno for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]
    asyncio.run(notifier.close())


def test_unreachable_socket_kind_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="meshctl.server.notify"):
        notifier = SystemdNotifier(NotifySettings(socket="vsock:2:1234"), lambda: "up")
    assert not notifier.enabled
    assert "vsock:2:1234" in caplog.text


# -- the heartbeat --------------------------------------------------------------------------


async def _receive(sock: socket.socket, count: int) -> list[Message]:
    loop = asyncio.get_running_loop()
    return [parse(await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)) for _ in range(count)]


def test_heartbeat_pings_the_watchdog_and_sends_status_only_when_it_changes(
    listener: tuple[str, socket.socket],
) -> None:
    path, sock = listener
    sock.setblocking(False)
    statuses = iter(["a", "a", "b"])

    def status() -> str:
        return next(statuses, "b")

    async def scenario() -> list[Message]:
        # 20 ms watchdog: a ping every 10 ms, so the test sees several ticks without waiting long.
        notifier = SystemdNotifier(NotifySettings(socket=path, watchdog_usec=20_000), status)
        notifier.ready()
        notifier.start()
        try:
            return await _receive(sock, 4)
        finally:
            await notifier.close()

    assert asyncio.run(scenario()) == [
        {"READY": "1", "STATUS": "a"},
        {"WATCHDOG": "1"},
        {"WATCHDOG": "1", "STATUS": "b"},
        {"WATCHDOG": "1"},
    ]


def test_a_failing_status_does_not_stop_the_watchdog(
    listener: tuple[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    path, sock = listener
    sock.setblocking(False)

    def status() -> str:
        raise RuntimeError("broken")

    async def scenario() -> list[Message]:
        notifier = SystemdNotifier(NotifySettings(socket=path, watchdog_usec=20_000), status)
        notifier.start()
        try:
            return await _receive(sock, 2)
        finally:
            await notifier.close()

    with caplog.at_level(logging.ERROR, logger="meshctl.server.notify"):
        assert asyncio.run(scenario()) == [{"WATCHDOG": "1"}, {"WATCHDOG": "1"}]
    assert "computing the systemd status failed" in caplog.text


def test_service_status_line() -> None:
    def server(proxies: int, errors: int, ready: bool) -> Any:
        return SimpleNamespace(
            describe=lambda: {"version": "v1", "configs": 19, "services": 1, "proxies": proxies},
            store=SimpleNamespace(errors=lambda: ["error"] * errors),
            ready=lambda: ready,
        )

    assert service_status(server(1, 0, True)) == "19 resources, 1 service, 1 proxy connected"
    assert service_status(server(2, 3, False)) == (
        "19 resources, 1 service, 2 proxies connected; 3 config errors (see /debug/configz); "
        "waiting for the registries' first sync"
    )


# -- `meshctl serve` under a stand-in systemd ------------------------------------------------


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET, keeping every notification in order."""

    def __init__(self, log: Path) -> None:
        self.name = f"@meshctl-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.2)
        self.messages: list[Message] = []
        self._seen = 0
        self._log = log

    def next(self, predicate: Callable[[Message], bool], what: str, timeout: float = 60) -> Message:
        """The first notification after the last one returned that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        while True:
            while self._seen < len(self.messages):
                message = self.messages[self._seen]
                self._seen += 1
                if predicate(message):
                    return message
            if time.monotonic() > deadline:
                log = self._log.read_text(errors="replace")[-3000:] if self._log.exists() else ""
                pytest.fail(f"no {what} in {timeout}s; received {self.messages}\nserve's log:\n{log}")
            try:
                self.messages.append(parse(self.sock.recv(4096)))
            except TimeoutError:
                continue


def _xds_port(log: Path) -> int:
    match = re.search(r"serving xDS on \S+:(\d+)", log.read_text())
    assert match, log.read_text()
    return int(match.group(1))


@pytest.mark.slow
def test_serve_reports_its_lifecycle_to_systemd(tmp_path: Path) -> None:
    config = examples_copy(tmp_path)
    log = tmp_path / "serve.log"
    systemd = FakeSystemd(log)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHCTL_", "WATCHDOG_", "JOURNAL_STREAM"))}
    env |= {"NOTIFY_SOCKET": systemd.name, "WATCHDOG_USEC": "1000000"}
    command = [sys.executable, "-m", "meshctl", "serve", "--config-dir", str(config)]
    command += ["--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0", "--debounce", "0.05"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = systemd.next(lambda m: m.get("READY") == "1", "READY=1")
        counts = re.fullmatch(r"(\d+) resources, (\d+) services, 0 proxies connected", ready.get("STATUS", ""))
        assert counts, ready
        assert int(counts.group(1)) > 0 and int(counts.group(2)) > 0

        systemd.next(lambda m: m.get("WATCHDOG") == "1", "a first WATCHDOG=1")
        systemd.next(lambda m: m.get("WATCHDOG") == "1", "a second WATCHDOG=1")

        async def with_a_proxy() -> Message:
            async with AdsClient(f"127.0.0.1:{_xds_port(log)}", REVIEWS_V1) as client:
                await client.wait_for(lambda c: c.complete(), timeout=30)
                return await asyncio.to_thread(
                    systemd.next, lambda m: "1 proxy connected" in m.get("STATUS", ""), "a STATUS with the proxy"
                )

        connected = asyncio.run(with_a_proxy())
        assert connected["STATUS"] == f"{counts[1]} resources, {counts[2]} services, 1 proxy connected"

        before = time.monotonic_ns() // 1000
        proc.send_signal(signal.SIGHUP)
        reloading = systemd.next(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
        assert before <= int(reloading["MONOTONIC_USEC"]) <= time.monotonic_ns() // 1000
        assert systemd.next(lambda m: m.get("READY") == "1", "READY=1 after the reload")["STATUS"]

        proc.send_signal(signal.SIGTERM)
        systemd.next(lambda m: m.get("STOPPING") == "1", "STOPPING=1")
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        systemd.sock.close()
