"""Reading `meshctl serve`'s admin pages from the CLI, with one-line errors that say what to fix.

Operators point commands at the wrong port, at a server that is not running, or at one that
wants a token; each of those is a sentence with a hint here, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any

from meshctl.errors import UsageError

DEFAULT_ADMIN = "127.0.0.1:15014"
#: What an HTTP/2 server (gRPC, the xDS port) sends first: a SETTINGS frame, which an HTTP/1.1
#: client reads as a bad status line.
_HTTP2_SETTINGS_FRAME = b"\x00\x00"


def get_json(admin: str, path: str, token_file: str | None = None, timeout: float = 10.0) -> Any:
    """GET `path` of the admin server at `admin` (HOST:PORT or a URL) as JSON; raises UsageError
    with a hint for every way the address or the server can be wrong."""
    url = admin if "://" in admin else f"http://{admin}"
    request = urllib.request.Request(f"{url}{path}")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                request.add_header("Authorization", f"Bearer {f.read().strip()}")
        except OSError as exc:
            raise UsageError(f"cannot read the admin token file {token_file}: {exc.strerror or exc}") from None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        raise UsageError(_http_error(url, path, exc.code)) from None
    except (http.client.BadStatusLine, http.client.RemoteDisconnected) as exc:
        raise UsageError(_not_admin(admin, exc)) from None
    except urllib.error.URLError as exc:
        raise UsageError(_unreachable(admin, exc.reason)) from None
    except TimeoutError:
        raise UsageError(f"{admin} did not answer within {timeout:g}s: is it meshctl serve's admin address?") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise UsageError(f"{admin} did not answer like meshctl serve's admin server: {exc}") from None


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
