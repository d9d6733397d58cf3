"""Telling systemd how `meshctl serve` is doing, over the sd_notify protocol (sd_notify(3)).

The protocol is one datagram of `KEY=VALUE` lines sent to the unix socket that `$NOTIFY_SOCKET`
names: a path, or `@name` for the abstract namespace. That is a few lines over the standard
library; the PyPI packages for it either build against libsystemd or predate `MONOTONIC_USEC`.
Without `$NOTIFY_SOCKET` (a terminal, a test, another supervisor) every call here does nothing.

What `meshctl serve` sends, and why:

    start-up done       READY=1, STATUS=        the config is loaded, the registries started and
                                                 the ports open: `systemctl start` returns and
                                                 units ordered After= meshctl may start
    every tick          WATCHDOG=1              at half of $WATCHDOG_USEC, from a task on the
                                                 event loop: a wedged loop stops the pings and
                                                 systemd (WatchdogSec=) restarts the service
                        STATUS=                 counts of resources, services and connected
                                                 proxies, sent when they change
    SIGHUP              RELOADING=1,            while the config directories are re-read;
                        MONOTONIC_USEC=         systemd >= 253 ignores a RELOADING=1 without the
                                                 monotonic time when it drives the reload itself
                                                 (Type=notify-reload); older ones ignore the field
                        READY=1                 once re-read, so `systemctl reload` returns then
    SIGTERM, SIGINT     STOPPING=1              while the xDS streams drain

The values are read from the environment by the CLI (`NotifySettings.from_environ`) and passed
down, so a `Server` built by a test in a process that happens to run under systemd stays quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from meshctl.config.store import ConfigStore


class ServedState(Protocol):
    """What the status line reads of the running server (`meshctl.server.app.Server` has it)."""

    store: ConfigStore

    def describe(self) -> dict[str, Any]: ...

    def ready(self) -> bool: ...


logger = logging.getLogger("meshctl.server.notify")

#: How long one send may block when systemd is slow to read its socket; a notification is never
#: worth wedging the event loop for, and the next tick sends the watchdog ping again.
SEND_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class NotifySettings:
    """Where to notify and how often; the default notifies nobody."""

    #: `$NOTIFY_SOCKET`: a socket path, or `@name` in the abstract namespace.
    socket: str | None = None
    #: `$WATCHDOG_USEC` when it is meant for this process (`$WATCHDOG_PID` unset or ours).
    watchdog_usec: int | None = None
    #: How often STATUS= is recomputed (and sent if it changed) when the watchdog ticks slower.
    status_interval: float = 10.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], pid: int) -> NotifySettings:
        """Read systemd's variables as sd_notify(3) and sd_watchdog_enabled(3) do.

        A `$WATCHDOG_PID` naming another process means the variables were inherited from a
        parent that systemd watches, not meant for us; a malformed value disables the watchdog
        rather than failing start-up over it.
        """
        watchdog_usec: int | None = None
        raw_usec = environ.get("WATCHDOG_USEC", "")
        raw_pid = environ.get("WATCHDOG_PID", "")
        if raw_usec.isdigit() and int(raw_usec) > 0 and (not raw_pid or raw_pid == str(pid)):
            watchdog_usec = int(raw_usec)
        elif raw_usec:
            logger.debug("ignoring WATCHDOG_USEC=%s (WATCHDOG_PID=%s, we are %d)", raw_usec, raw_pid, pid)
        return cls(socket=environ.get("NOTIFY_SOCKET") or None, watchdog_usec=watchdog_usec)

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half the timeout, as sd_watchdog_enabled(3) advises."""
        return self.watchdog_usec / 2_000_000 if self.watchdog_usec else None


def socket_address(name: str) -> str | None:
    """The `sendto` address for `$NOTIFY_SOCKET`, or None for a kind we cannot reach.

    `@name` is Linux's abstract namespace, spelled with a leading NUL byte on the wire; systemd
    also hands out `vsock:` addresses to virtual machines, which a VM's control plane never sees.
    """
    if name.startswith("@") and len(name) > 1:
        return "\0" + name[1:]
    if name.startswith("/"):
        return name
    return None


class SystemdNotifier:
    """Sends `meshctl serve`'s lifecycle and health to systemd; a no-op without a socket.

    Every method is called from the event loop (signal handlers included, as the server installs
    them with `loop.add_signal_handler`), so nothing here needs a lock.
    """

    def __init__(self, settings: NotifySettings, status: Callable[[], str]) -> None:
        self.settings = settings
        self._status = status
        self._address = socket_address(settings.socket) if settings.socket else None
        if settings.socket and self._address is None:
            logger.warning("NOTIFY_SOCKET=%s is neither a path nor @abstract; not notifying", settings.socket)
        self._sock: socket.socket | None = None
        self._last_status: str | None = None
        self._failed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *lines: str) -> bool:
        """Send one datagram of `KEY=VALUE` lines; False (and a log line) if it could not go.

        A failed send is never fatal: systemd may be restarting, and a service that dies because
        its supervisor blinked is worse than one whose status line is a tick late.
        """
        if self._address is None or not lines:
            return False
        payload = ("\n".join(lines) + "\n").encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.settimeout(SEND_TIMEOUT)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            # The first failure is worth a warning; repeating it every tick is noise.
            logger.log(logging.DEBUG if self._failed else logging.WARNING, "cannot notify systemd: %s", exc)
            self._failed = True
            return False
        self._failed = False
        return True

    # -- the lifecycle ---------------------------------------------------------------------

    def ready(self) -> None:
        """Start-up or a reload is done: READY=1 with the current status."""
        self.send("READY=1", self._status_line(force=True))

    def reloading(self) -> None:
        """A reload starts. MONOTONIC_USEC is CLOCK_MONOTONIC, as Python's `time.monotonic`."""
        self._last_status = "reloading the config directories"
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}", f"STATUS={self._last_status}")

    def stopping(self) -> None:
        self._last_status = "stopping: draining xDS streams"
        self.send("STOPPING=1", f"STATUS={self._last_status}")

    def start(self) -> None:
        """Start the heartbeat on the running loop: watchdog pings and status updates."""
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="meshctl-sd-notify")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _heartbeat(self) -> None:
        watchdog = self.settings.watchdog_interval
        interval = min(watchdog, self.settings.status_interval) if watchdog else self.settings.status_interval
        while True:
            await asyncio.sleep(interval)
            lines = ["WATCHDOG=1"] if watchdog else []
            status = self._status_line(force=False)
            if status:
                lines.append(status)
            self.send(*lines)

    def _status_line(self, *, force: bool) -> str:
        """`STATUS=...` if the status changed (or `force`), else ''.

        A status that fails to compute must not stop the watchdog pings that share its tick: the
        loop is alive, which is all the watchdog asks.
        """
        try:
            text = self._status()
        except Exception:
            logger.exception("computing the systemd status failed")
            return ""
        if text == self._last_status and not force:
            return ""
        self._last_status = text
        return f"STATUS={text}"


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def service_status(server: ServedState) -> str:
    """The line `systemctl status meshctl` shows: what is served, to how many proxies, what is wrong."""
    facts = server.describe()
    text = (
        f"{_count(facts['configs'], 'resource')}, {_count(facts['services'], 'service')}, "
        f"{_count(facts['proxies'], 'proxy', 'proxies')} connected"
    )
    errors = len(server.store.errors())
    if errors:
        text += f"; {_count(errors, 'config error')} (see /debug/configz)"
    if not server.ready() and not facts["configs"] and not facts["services"]:
        text += "; not ready: no config and no services yet (see the log)"
    elif not server.ready():
        text += "; waiting for the registries' first sync"
    return text
