"""One HTTP GET from a server the CLI does not control, bounded in bytes and in time.

`diff --live` reads an Envoy's admin port and `proxy-status`, `diff --server` and `version
--server` read meshctl's; the address is whatever the operator typed, and what answers there may
stream without end or trickle a byte every few seconds. urllib bounds neither: its timeout is per
socket operation (a byte every 5 s never trips a 10 s timeout) and `read()` takes everything.
Here the whole exchange has one deadline, and the body a byte limit:

- a timer shuts the socket down at the deadline, which ends whatever read is blocked (headers
  or body, plain or TLS), and the fetch raises TimeoutError;
- the body is read in chunks and refused (`AnswerTooLarge`) past `limit` bytes.

Everything else is the standard library's: OSError for a connection that fails,
`http.client.HTTPException` for an answer that is not HTTP.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

_CHUNK: Final = 256 * 1024


class AnswerTooLarge(Exception):
    """The body went past the fetch's byte limit; it was not read further."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is over {limit:,} bytes")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


def fetch(
    url: str, *, timeout: float, limit: int, headers: Mapping[str, str] | None = None, method: str = "GET"
) -> Answer:
    """GET (or `method`) `url` (http or https), all of it within `timeout` seconds and at most `limit` bytes of
    body; raises TimeoutError, AnswerTooLarge, OSError, http.client.HTTPException, or ValueError
    for a URL that is not http(s)://HOST[:PORT][/PATH]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url}: not an http:// or https:// address")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    deadline = _Deadline(connection)
    deadline.arm(timeout)
    try:
        connection.request(method, target, headers=dict(headers or {}))
        response = connection.getresponse()
        body = _read_body(response, limit)
        if deadline.expired:  # a close-delimited body read up to the shutdown is not the whole body
            raise TimeoutError
        return Answer(response.status, body)
    except (OSError, http.client.HTTPException, ValueError):
        if deadline.expired:
            raise TimeoutError from None
        raise
    finally:
        deadline.disarm()
        connection.close()


def _read_body(response: http.client.HTTPResponse, limit: int) -> bytes:
    declared = response.getheader("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(limit)
    chunks: list[bytes] = []
    total = 0
    while chunk := response.read(_CHUNK):
        total += len(chunk)
        if total > limit:
            raise AnswerTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class _Deadline:
    """Shuts a connection's socket down when its time is up (see the module's docstring)."""

    def __init__(self, connection: http.client.HTTPConnection) -> None:
        self._connection = connection
        self._done = threading.Event()
        self.expired = False
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        if self._done.is_set():
            return
        self.expired = True
        sock = self._connection.sock
        if sock is None:
            # Still connecting (its own timeout ends that): look again until there is a socket.
            self.arm(0.05)
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
