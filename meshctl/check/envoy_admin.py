"""Reading a live Envoy's admin `/config_dump?include_eds`, with one-line errors that say what is wrong.

The address people pass is often not an Envoy admin port: the wrong port, a stopped Envoy, the
proxy's listener, meshctl's own admin server. Each of those is a UsageError naming the address
(the CLI exits 2 for it), never a traceback, and never a comparison against something that is
not a config dump.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any, Final

from meshctl.check.fetch import AnswerTooLarge, fetch
from meshctl.errors import UsageError

CONFIG_DUMP_PATH = "/config_dump?include_eds"
#: The most read of a config dump: a mesh of ten thousand services dumps some tens of MB, and
#: a dump is parsed whole, at several times its size in memory.
MAX_CONFIG_DUMP_BYTES: Final = 256 * 1024 * 1024


def fetch_config_dump(admin_url: str, timeout: float = 30.0, limit: int = MAX_CONFIG_DUMP_BYTES) -> Any:
    """Envoy's config dump at `admin_url` (http://HOST:PORT or HOST:PORT), as parsed JSON, all of
    it within `timeout` seconds and `limit` bytes (`meshctl.check.fetch`)."""
    base = (admin_url if "://" in admin_url else f"http://{admin_url}").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"--live {admin_url}: give Envoy's admin address as http://HOST:PORT")
    url = base + CONFIG_DUMP_PATH
    try:
        answer = fetch(url, timeout=timeout, limit=limit)
    except TimeoutError:
        raise UsageError(f"{admin_url} did not answer within {timeout:g}s: is it an Envoy admin address?") from None
    except AnswerTooLarge as exc:
        raise UsageError(f"{url}: {exc}: is {admin_url} an Envoy admin address?") from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise UsageError(_unreachable(admin_url, exc)) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise UsageError(f"{admin_url} did not answer like an Envoy admin server: {exc}") from None
    if answer.status != 200:
        raise UsageError(f"{url}: HTTP {answer.status}: is {admin_url} an Envoy admin address?")
    try:
        data = json.loads(answer.body)
    except (ValueError, RecursionError):
        raise UsageError(f"{url} is not JSON: is {admin_url} an Envoy admin address?") from None
    if not isinstance(data, dict) or not isinstance(data.get("configs"), list):
        raise UsageError(f"{url} is JSON but not an Envoy config dump: is {admin_url} an Envoy admin address?")
    return data


def _unreachable(admin_url: str, reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return f"nothing listens on {admin_url}: is Envoy running, and is this its admin address?"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve {admin_url}: {reason.strerror}"
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"{admin_url} did not answer in time: is it an Envoy admin address?"
    text = getattr(reason, "strerror", None) or str(reason)
    return f"cannot reach {admin_url}: {text}"
