"""Real gRPC applications for proxyless tests: a server answering with its own name (generic
handlers, no generated code) and a client process dialing `xds:///NAME:PORT` through grpcio's
own xDS client.

The client is a subprocess because gRPC reads its xDS bootstrap once per process, from the
environment, when the first xDS channel is made: each test gets its own. It keeps one channel
for its whole life (so a config change reaches it as a live update, as in production) and
answers requests on stdin, one JSON line each: `{"calls": N, "metadata": {...}}` makes N calls
and prints `{"replies": {NAME: COUNT}, "errors": {STATUS: COUNT}}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent import futures
from typing import Any

import grpc
import grpc.experimental

SERVICE = "meshctl.test.Echo"
METHOD = f"/{SERVICE}/Who"


class NamedServer:
    """A gRPC server on `address` (`IP:PORT`) whose `Who` method answers `name`; a context manager.
    With `flaky`, every other call (the first, the third, ...) fails with UNAVAILABLE instead;
    with `credentials`, it serves TLS."""

    def __init__(
        self, address: str, name: str, *, flaky: bool = False, credentials: grpc.ServerCredentials | None = None
    ) -> None:
        self.address = address
        self.name = name
        self.calls = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls += 1
                fail = flaky and self.calls % 2 == 1
            if fail:
                context.abort(grpc.StatusCode.UNAVAILABLE, "every other call fails")
            return name.encode()

        handler = grpc.method_handlers_generic_handler(SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)})
        self._server.add_generic_rpc_handlers((handler,))
        bound = (
            self._server.add_secure_port(address, credentials)
            if credentials is not None
            else self._server.add_insecure_port(address)
        )
        if not bound:
            raise OSError(f"cannot listen on {address}")

    def __enter__(self) -> NamedServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait()


class XdsClient:
    """The client process (see the module docstring); a context manager."""

    def __init__(
        self, target: str, bootstrap: Mapping[str, Any], *, timeout: float = 5.0, xds_credentials: bool = False
    ) -> None:
        """With `xds_credentials`, the channel takes its TLS from xDS (`grpc.xds_channel_credentials`,
        plaintext where xDS says none); without, it is plaintext whatever xDS says."""
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "meshctl.testing.grpc_apps", target, str(timeout), str(int(xds_credentials))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def calls(self, n: int, metadata: Mapping[str, str] | None = None) -> tuple[Counter[str], Counter[str]]:
        """`n` calls; what answered them (server names) and how the others failed (status names)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"calls": n, "metadata": dict(metadata or {})}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the gRPC client exited ({self._proc.wait()})")
        answer = json.loads(line)
        return Counter(answer["replies"]), Counter(answer["errors"])

    def __enter__(self) -> XdsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class XdsServer:
    """A gRPC xDS server process (`grpc.server(xds=True)` with `xds_server_credentials`) on
    `address`, answering `name`: it serves once meshctl sends its listener, with the TLS the
    listener says; a context manager."""

    def __init__(self, address: str, name: str, bootstrap: Mapping[str, Any]) -> None:
        env = dict(os.environ)
        env.pop("GRPC_XDS_BOOTSTRAP", None)
        env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(bootstrap)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "meshctl.testing.grpc_apps", "--serve", address, name],
            stdin=subprocess.PIPE,
            env=env,
        )

    def __enter__(self) -> XdsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # the server stops when its stdin closes
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _server_main(address: str, name: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=True)

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        return name.encode()

    handler = grpc.method_handlers_generic_handler(SERVICE, {"Who": grpc.unary_unary_rpc_method_handler(who)})
    server.add_generic_rpc_handlers((handler,))
    server.add_secure_port(address, grpc.xds_server_credentials(grpc.insecure_server_credentials()))
    server.start()
    sys.stdin.read()
    server.stop(grace=None).wait()


def _client_main(target: str, timeout: float, xds_credentials: bool) -> None:
    if xds_credentials:
        # grpc.experimental is untyped: its plaintext credentials are what xDS falls back to
        plain = grpc.experimental.insecure_channel_credentials()  # type: ignore[no-untyped-call]
        creds = grpc.xds_channel_credentials(fallback_credentials=plain)
        channel = grpc.secure_channel(f"xds:///{target}", creds)
    else:
        channel = grpc.insecure_channel(f"xds:///{target}")
    who = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    for line in sys.stdin:
        request = json.loads(line)
        replies: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        metadata = tuple(request["metadata"].items())
        for _ in range(request["calls"]):
            try:
                replies[who(b"", timeout=timeout, metadata=metadata).decode()] += 1
            except grpc.RpcError as exc:
                errors[exc.code().name] += 1
        print(json.dumps({"replies": replies, "errors": errors}), flush=True)
    channel.close()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _server_main(sys.argv[2], sys.argv[3])
    else:
        _client_main(sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1")
