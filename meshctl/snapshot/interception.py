"""How traffic reaches a proxy, as its node metadata says (`INTERCEPTION_MODE`): a module of its
own so the CLI can offer the choices without importing the snapshot machinery. The DNS listener's
settings live here too: like the interception mode, they say how the app's lookups reach the
proxy."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class InterceptionMode(enum.StrEnum):
    """How traffic reaches the proxy. NONE (no iptables) is the VM default: outbound listeners
    bind real ports on 127.0.0.1 and inbound listeners bind the workload's own address."""

    NONE = "NONE"
    REDIRECT = "REDIRECT"
    TPROXY = "TPROXY"


#: Istio's DNS proxy port, where a sidecar's DNS listener is unless its node metadata says.
DEFAULT_DNS_PORT = 15053
#: The node metadata keys of the DNS listener: Istio's `DNS_CAPTURE` (ISTIO_META_DNS_CAPTURE),
#: and meshctl's `DNS_PORT` and `DNS_FORWARD`, which `meshctl bootstrap --dns-port` writes.
DNS_METADATA_KEYS = ("DNS_CAPTURE", "DNS_PORT", "DNS_FORWARD")


def _flag(value: object, key: str) -> bool | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{key} must be true or false")


def dns_settings(metadata: Mapping[str, Any]) -> tuple[int, bool]:
    """(port of the DNS listener on 127.0.0.1, 0 for none; whether names outside the mesh are
    forwarded to the VM's resolvers rather than refused). `DNS_CAPTURE: false` turns it off,
    `DNS_PORT` places it (0: off), `DNS_CAPTURE: true` alone serves it on Istio's 15053; a node
    that says nothing gets none. Raises ValueError naming the key that is wrong."""
    capture = _flag(metadata.get("DNS_CAPTURE"), "DNS_CAPTURE")
    forward = _flag(metadata.get("DNS_FORWARD"), "DNS_FORWARD")
    raw = metadata.get("DNS_PORT")
    port = 0
    if raw is not None and raw != "":
        text = str(raw).strip()
        if not text.isdigit() or int(text) > 65535:
            raise ValueError("DNS_PORT must be a port number (0 for no DNS listener)")
        port = int(text)
    elif capture:
        port = DEFAULT_DNS_PORT
    if capture is False:
        port = 0
    return port, forward is not False
