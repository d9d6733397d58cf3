"""Reading `meshctl serve`'s admin pages from the CLI, with one-line errors that say what to fix.

Operators point commands at the wrong port, at a server that is not running, or at one that
wants a token; each of those is a sentence with a hint here, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any, Final

from meshctl.check.fetch import AnswerTooLarge, fetch
from meshctl.errors import CredentialError, RefusedError, UsageError
from meshctl.security.files import read_credential

DEFAULT_ADMIN = "127.0.0.1:15014"
#: What an HTTP/2 server (gRPC, the xDS port) sends first: a SETTINGS frame, which an HTTP/1.1
#: client reads as a bad status line.
_HTTP2_SETTINGS_FRAME = b"\x00\x00"
#: The most read of one admin page: /debug/syncz of ten thousand proxies is some 10 MB.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


def get_json(
    admin: str,
    path: str,
    token_file: str | None = None,
    timeout: float = 10.0,
    *,
    expect: type[list[Any]] | type[dict[str, Any]] | None = None,
    method: str = "GET",
) -> Any:
    """GET `path` of the admin server at `admin` (HOST:PORT or a URL) as JSON, all of it within
    `timeout` seconds and `MAX_ANSWER_BYTES` (`meshctl.check.fetch`), and, with `expect`, a JSON
    array or object; raises UsageError with a hint for every way the address or the server can be
    wrong."""
    url = admin if "://" in admin else f"http://{admin}"
    headers = {}
    if token_file:
        try:  # a regular file, bounded: a FIFO or /dev/zero given by mistake is refused, not waited on
            token = read_credential(Path(token_file), 64 * 1024).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError, CredentialError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise UsageError(f"cannot read the admin token file {token_file}: {reason}") from None
        headers["Authorization"] = f"Bearer {token}"
    try:
        answer = fetch(f"{url}{path}", timeout=timeout, limit=MAX_ANSWER_BYTES, headers=headers, method=method)
    except TimeoutError:
        raise UsageError(f"{admin} did not answer within {timeout:g}s: is it meshctl serve's admin address?") from None
    except AnswerTooLarge as exc:
        raise UsageError(f"{url}{path}: {exc}: is {admin} meshctl serve's admin address?") from None
    except (http.client.BadStatusLine, http.client.RemoteDisconnected) as exc:
        raise UsageError(_not_admin(admin, exc)) from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise UsageError(_unreachable(admin, exc)) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise UsageError(f"{admin} did not answer like meshctl serve's admin server: {exc}") from None
    if answer.status == 409:  # the server's answer is no: it says why
        raise RefusedError(_error_of(answer.body) or f"{url}{path}: refused")
    if answer.status != 200:
        raise UsageError(_http_error(url, path, answer.status))
    try:
        data = json.loads(answer.body)
    except (ValueError, RecursionError):
        raise UsageError(f"{url}{path} is not JSON: is {admin} meshctl serve's admin address?") from None
    if expect is not None and not isinstance(data, expect):
        what = "an array" if expect is list else "an object"
        raise UsageError(f"{url}{path} is JSON but not {what}: is {admin} meshctl serve's admin address?")
    return data


def _error_of(body: bytes) -> str:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    return str(data.get("error", "")) if isinstance(data, dict) else ""


def syncz(admin: str, token_file: str | None = None) -> list[dict[str, Any]]:
    """/debug/syncz: one entry per proxy, `proxy` a string and `types` an object of objects,
    each field a string; anything else is UsageError (a server that is not meshctl's)."""
    entries = get_json(admin, "/debug/syncz", token_file, expect=list)
    for index, entry in enumerate(entries):
        problem = _syncz_problem(entry)
        if problem is not None:
            raise UsageError(f"{admin}/debug/syncz entry {index}: {problem}: is it meshctl serve's admin address?")
    return list(entries)


def _syncz_problem(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    if not isinstance(entry.get("proxy"), str) or not isinstance(entry.get("workload", ""), str):
        return "'proxy' is not a string"
    types = entry.get("types")
    if not isinstance(types, dict):
        return "'types' is not an object"
    for name, state in types.items():
        if state is None:
            continue
        plain = isinstance(state, dict) and all(isinstance(v, str | int | float | bool | None) for v in state.values())
        if not plain:
            return f"'types.{name}' is not an object of plain values"
    return None


def _http_error(url: str, path: str, status: int) -> str:
    if status == 401:
        return f"{url}{path}: 401, the server wants its admin token: pass --admin-token-file FILE"
    if status == 403:
        return (
            f"{url}{path}: 403, the server listens beyond loopback and has no admin token: "
            "start it with --admin-token-file, or ask from its host"
        )
    if status == 404:
        return f"{url}{path}: 404, this server has no such page: is it meshctl serve's admin address?"
    return f"{url}{path}: HTTP {status}"


def _not_admin(admin: str, exc: Exception) -> str:
    line = getattr(exc, "line", "")  # what BadStatusLine read
    raw = line.encode("latin-1", "replace") if isinstance(line, str) else b""
    if raw.startswith(_HTTP2_SETTINGS_FRAME) or isinstance(exc, http.client.RemoteDisconnected):
        return (
            f"{admin} speaks HTTP/2 (gRPC), not the admin pages: this looks like the xDS port; "
            f"give serve's --admin-address (default {DEFAULT_ADMIN})"
        )
    return f"{admin} did not answer like meshctl serve's admin server"


def _unreachable(admin: str, reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return (
            f"nothing listens on {admin}: is meshctl serve running, and is this its --admin-address "
            f"(default {DEFAULT_ADMIN})?"
        )
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve {admin}: {reason.strerror}"
    text = getattr(reason, "strerror", None) or str(reason)
    return f"cannot reach {admin}: {text}"
