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
import urllib.error
import urllib.request
from typing import Any

from meshctl.errors import UsageError

CONFIG_DUMP_PATH = "/config_dump?include_eds"


def fetch_config_dump(admin_url: str, timeout: float = 10.0) -> Any:
    """Envoy's config dump at `admin_url` (http://HOST:PORT or HOST:PORT), as parsed JSON."""
    base = (admin_url if "://" in admin_url else f"http://{admin_url}").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"--live {admin_url}: give Envoy's admin address as http://HOST:PORT")
    url = base + CONFIG_DUMP_PATH
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as exc:
        raise UsageError(f"{url}: HTTP {exc.code}: is {admin_url} an Envoy admin address?") from None
    except urllib.error.URLError as exc:
        raise UsageError(_unreachable(admin_url, exc.reason)) from None
    except TimeoutError:
        raise UsageError(f"{admin_url} did not answer within {timeout:g}s: is it an Envoy admin address?") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise UsageError(f"{admin_url} did not answer like an Envoy admin server: {exc}") from None
    try:
        data = json.loads(body)
    except ValueError:
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
