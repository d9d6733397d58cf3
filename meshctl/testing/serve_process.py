"""`meshctl serve` as a real process, as systemd runs it: for end-to-end tests with a real Envoy.

In-process servers cannot show what operators see: the CLI's flags, the log line with the ports,
SIGTERM leaving Envoy to reconnect, and a restart on the same ports (Envoy's bootstrap names one
xDS address, so a replacement must come back there). `ServeProcess` starts the command with port 0
for both servers, reads the ports it chose from its log, waits for `/ready`, and `restart()`
brings a new process up on the very same ports. `bootstrap()` runs `meshctl bootstrap` for a node
against this server, so the Envoy under test starts from what users run.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshctl.testing.envoy import free_port

_SERVING = re.compile(
    r"serving xDS on (?P<xds>\S+):(?P<xds_port>\d+) and admin on http://(?P<admin>\S+):(?P<admin_port>\d+)"
)


class ServeError(Exception):
    """`meshctl serve` did not come up, or did not stop; the message ends with its log."""


def meshctl_command() -> list[str]:
    """The meshctl CLI of the running interpreter (the venv under test), whatever is on PATH."""
    return [sys.executable, "-m", "meshctl"]


def limited_meshctl_command(address_space: int) -> list[str]:
    """`meshctl_command()` with its address space bounded to `address_space` bytes (RLIMIT_AS).

    The bound is set by a small interpreter that then execs the CLI, not by a `preexec_fn`: that
    runs Python in the forked child of a process whose gRPC threads may be mid-call (a test
    worker that ran a server), and gRPC's fork handling can then abort the child before it
    execs (seen as SIGABRT with "epoll_wait error: Bad file descriptor")."""
    launcher = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space})); "
        "os.execv(sys.executable, [sys.executable, '-m', 'meshctl', *sys.argv[1:]])"
    )
    return [sys.executable, "-c", launcher]


#: How `meshctl serve` says a port it was given is taken.
_PORT_TAKEN = re.compile(r"cannot serve: .*address already in use", re.IGNORECASE)


class ServeProcess:
    """One `meshctl serve` subprocess on 127.0.0.1; a context manager.

    Its xDS and admin ports are chosen when it is made, below the kernel's ephemeral range
    (`free_port`), and kept for `restart()`: a port the server had from the ephemeral range (port
    0) could be taken, while it is down, as the local port of any connection the machine opens,
    and the restart would find it in use. The log of every run goes to one file, readable with
    `log()`.
    """

    def __init__(
        self,
        config_dirs: Sequence[Path],
        *,
        consul: str | None = None,
        debounce: float = 0.05,
        log_level: str = "info",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.config_dirs = tuple(config_dirs)
        self.consul = consul
        self.debounce = debounce
        self.log_level = log_level
        self.extra_args = tuple(extra_args)
        self.xds_port = free_port()
        self.admin_port = free_port()
        #: whether a run has bound its ports: a restart must bind the same
        self._bound = False
        self.runs = 0
        self._dir = tempfile.TemporaryDirectory(prefix="meshctl-serve-")
        self.log_path = Path(self._dir.name) / "serve.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def xds_address(self) -> str:
        return f"127.0.0.1:{self.xds_port}"

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        cmd = [*meshctl_command(), "serve"]
        for directory in self.config_dirs:
            cmd += ["--config-dir", str(directory)]
        cmd += [
            "--xds-address",
            self.xds_address,
            "--admin-address",
            self.admin_address,
            "--debounce",
            str(self.debounce),
            "--log-level",
            self.log_level,
        ]
        if self.consul is not None:
            cmd += ["--consul", self.consul]
        if "--state-dir" not in self.extra_args and "--ca-dir" not in self.extra_args:
            # Its own CA, kept across `restart()` as a real state directory is.
            cmd += ["--state-dir", str(Path(self._dir.name) / "state")]
        return [*cmd, *self.extra_args]

    def start(self, *, timeout: float = 60.0, ready: bool = True) -> None:
        """Start and wait until the log names the ports and (with `ready`) `/ready` answers 200:
        a server whose registries have not synced serves no proxy yet, and says so there.

        A port picked below the ephemeral range is safe from this machine's connections, not
        from another program binding it between the pick and the server's bind (a second test
        run beside this one): until the server has bound its ports once, a port found taken is
        picked again. A restart keeps its ports, as a real one does."""
        for attempt in range(3):
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start(offset, timeout=timeout, ready=ready)
                return
            except ServeError:
                if self._bound or attempt == 2 or not _PORT_TAKEN.search(self._log_since(offset)):
                    raise
                self.xds_port, self.admin_port = free_port(), free_port()

    def _start(self, offset: int, *, timeout: float, ready: bool) -> None:
        if self._proc is not None:
            raise ServeError("already running")
        self.runs += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- run {self.runs}: {' '.join(self.command())}\n".encode())
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._read_ports(offset):
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServeError(f"no 'serving xDS on' line after {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        while ready and not self.ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ServeError(f"/ready not 200 after {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def _read_ports(self, offset: int) -> bool:
        match = _SERVING.search(self._log_since(offset))
        if match is None:
            return False
        xds, admin = int(match["xds_port"]), int(match["admin_port"])
        # (The first run may have been given its addresses in `extra_args`: those are its ports.)
        if self._bound and (xds != self.xds_port or admin != self.admin_port):
            raise ServeError(f"restarted on {xds}/{admin}, not {self.xds_port}/{self.admin_port}")
        self.xds_port, self.admin_port = xds, admin
        self._bound = True
        return True

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            self._proc = None
            raise ServeError(f"meshctl serve exited with {code}:\n{self.log()[-3000:]}")

    def stop(self, *, timeout: float = 30.0) -> int:
        """SIGTERM, as systemd stops it, and wait for the exit; returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise ServeError(
                    f"meshctl serve did not stop {timeout}s after SIGTERM:\n{self.log()[-3000:]}"
                ) from None
        return proc.returncode

    def restart(self, *, timeout: float = 60.0, ready: bool = True) -> None:
        """Stop with SIGTERM and start a new process on the same xDS and admin ports."""
        self.stop()
        self.start(timeout=timeout, ready=ready)

    def reload(self) -> None:
        """SIGHUP: the server reads its config directories at once."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGHUP)

    def __enter__(self) -> ServeProcess:
        try:
            self.start()
        except BaseException:
            # A server that came up but never got ready must not outlive the test.
            with contextlib.suppress(ServeError):
                self.stop(timeout=10)
            self._dir.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._dir.cleanup()

    # -- reading the server --------------------------------------------------------------------

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.admin_address}/ready", timeout=5) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://{self.admin_address}/{path.lstrip('/')}", timeout=10) as r:
            body: bytes = r.read()
            return body.decode()

    def admin_json(self, path: str) -> Any:
        return json.loads(self.admin(path))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def bootstrap(self, node_id: str, *, delta: bool | None = None, extra_args: Sequence[str] = ()) -> dict[str, Any]:
        """`meshctl bootstrap -o json` for `node_id` against this server, as a dict for Envoy: on
        the protocol `delta` says (True: incremental, False: state of the world), or by default
        on meshctl's (incremental)."""
        cmd = [*meshctl_command(), "bootstrap", "--proxy", node_id, "--xds-address", self.xds_address, "-o", "json"]
        if delta is not None:
            cmd.append("--delta" if delta else "--sotw")
        # Not the fixed 15090, 15021 and 15053: tests run many Envoys side by side on one host.
        for flag in ("--stats-port", "--health-port", "--dns-port"):
            if flag not in extra_args:
                cmd += [flag, "0"]
        proc = subprocess.run([*cmd, *extra_args], capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise ServeError(f"meshctl bootstrap failed ({proc.returncode}): {proc.stderr.strip()}")
        config: dict[str, Any] = json.loads(proc.stdout)
        return config
