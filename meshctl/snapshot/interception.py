"""How traffic reaches a proxy, as its node metadata says (`INTERCEPTION_MODE`): a module of its
own so the CLI can offer the choices without importing the snapshot machinery."""

from __future__ import annotations

import enum


class InterceptionMode(enum.StrEnum):
    """How traffic reaches the proxy. NONE (no iptables) is the VM default: outbound listeners
    bind real ports on 127.0.0.1 and inbound listeners bind the workload's own address."""

    NONE = "NONE"
    REDIRECT = "REDIRECT"
    TPROXY = "TPROXY"
