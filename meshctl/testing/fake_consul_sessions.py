"""Consul's sessions for the fake agent (`meshctl.testing.fake_consul`), as Consul documents them.

- `PUT /v1/session/create` (Name, Node, LockDelay, Behavior `release` or `delete`, TTL, Checks /
  NodeChecks) answers `{"ID": ...}`; a TTL outside [`ttl_min`, 24h] is refused with 400, as the
  agent's `session_ttl_min` makes it (10 s by default; tests lower it, as an operator can);
- `PUT /v1/session/renew/ID` answers `[session]`, or 404 once the session is gone;
  `PUT /v1/session/destroy/ID` answers `true`; `GET /v1/session/info/ID` and `/v1/session/list`;
- a session with a TTL is invalidated when it has not been renewed for twice its TTL (Consul
  multiplies the TTL by 2: the TTL is a lower bound, never the moment of expiry);
- on invalidation (destroy, or the TTL) the keys it holds are deleted (`delete`) or released
  (`release`: Session cleared, ModifyIndex moved), and for `LockDelay` none of them can be
  acquired again.

The KV side (`?acquire=`, `?release=`, the `lock` and `unlock` transaction verbs) lives in the
fake's KV code, which asks this table whether a session exists and whether a key is delayed.
Node checks are recorded, never followed: a session here ends by destroy or TTL only.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

_TTL_MAX: Final = 86400.0
_LOCK_DELAY_MAX: Final = 60.0
_DEFAULT_LOCK_DELAY: Final = 15.0
#: Consul waits this many TTLs after the last renewal before it invalidates a session.
TTL_MULTIPLIER: Final = 2


class SessionError(Exception):
    """A session request Consul would refuse, with its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Session:
    id: str
    name: str
    node: str
    lock_delay: float
    behavior: str
    ttl: float
    checks: list[str]
    create_index: int
    #: Monotonic time after which the session is invalidated (None: no TTL).
    deadline: float | None = None

    def json(self) -> dict[str, Any]:
        return {
            "ID": self.id,
            "Name": self.name,
            "Node": self.node,
            "LockDelay": int(self.lock_delay * 1e9),
            "Behavior": self.behavior,
            "TTL": _format(self.ttl) if self.ttl else "",
            "NodeChecks": list(self.checks),
            "ServiceChecks": None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.create_index,
        }

    def renew(self, now: float) -> None:
        if self.ttl:
            self.deadline = now + self.ttl * TTL_MULTIPLIER


class SessionTable:
    """The sessions of one fake agent and the lock delays they left; the fake's lock guards it."""

    def __init__(self, node: str, ttl_min: float = 10.0) -> None:
        self.node = node
        self.ttl_min = ttl_min
        self.sessions: dict[str, Session] = {}
        #: key -> monotonic time until which it cannot be acquired (an invalidated holder's delay)
        self.delays: dict[str, float] = {}

    def create(self, body: dict[str, Any], index: int, parse: Any) -> Session:
        """A new session from Consul's create body (field names in any case); `parse` reads a
        Go duration into seconds (None when it is not one)."""
        fields = {k.lower(): v for k, v in body.items()}
        node = fields.get("node") or self.node
        if node != self.node:
            raise SessionError(500, f"Missing node registration: {node}")
        behavior = fields.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise SessionError(400, f"Invalid Behavior setting '{behavior}'")
        ttl = 0.0
        if fields.get("ttl"):
            parsed = parse(str(fields["ttl"]))
            if parsed is None:
                raise SessionError(400, f"Request decode failed: invalid TTL {fields['ttl']!r}")
            ttl = parsed
            if ttl and not self.ttl_min <= ttl <= _TTL_MAX:
                raise SessionError(400, f"TTL must be between [{_format(self.ttl_min)}-{_format(_TTL_MAX)}]")
        delay = _DEFAULT_LOCK_DELAY
        if "lockdelay" in fields:
            raw = fields["lockdelay"]
            # A bare number is seconds when small, nanoseconds otherwise (Consul's FixupLockDelay).
            delay = (raw if raw < 1000 else raw / 1e9) if isinstance(raw, int | float) else parse(str(raw))
            if delay is None or delay < 0:
                raise SessionError(400, f"Request decode failed: invalid LockDelay {raw!r}")
            delay = min(delay, _LOCK_DELAY_MAX)
        checks = fields.get("nodechecks", fields.get("checks"))
        checks = ["serfHealth"] if checks is None else [str(c) for c in checks]
        unknown = [c for c in checks if c != "serfHealth"]
        if unknown:
            raise SessionError(500, f"Missing check '{unknown[0]}' registration")
        session = Session(str(uuid.uuid4()), str(fields.get("name") or ""), node, delay, behavior, ttl, checks, index)
        session.renew(time.monotonic())
        self.sessions[session.id] = session
        return session

    def due(self, now: float) -> list[str]:
        """Sessions whose TTL has run out (twice over) without a renewal."""
        return [s.id for s in self.sessions.values() if s.deadline is not None and now >= s.deadline]

    def delayed(self, key: str, now: float) -> bool:
        until = self.delays.get(key)
        if until is not None and now >= until:
            del self.delays[key]
            return False
        return until is not None


def _format(seconds: float) -> str:
    """A duration as Go prints the whole seconds Consul's messages show (`10s`, `24h0m0s`)."""
    whole = int(seconds)
    if whole < 60 or whole != seconds:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"
