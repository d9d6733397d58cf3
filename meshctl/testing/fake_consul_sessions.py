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

`SessionTable` holds the sessions and lock delays, `SessionsMixin` gives the fake agent its
session verbs over its KV store, and `route_session` answers their HTTP. The KV side (`?acquire=`,
`?release=`, the `lock` and `unlock` transaction verbs) lives in the fake's KV code, which asks
the table whether a session exists and whether a key is delayed. Node checks are recorded, never
followed: a session here ends by destroy or TTL only.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

_TTL_MAX: Final = 86400.0
_LOCK_DELAY_MAX: Final = 60.0
_DEFAULT_LOCK_DELAY: Final = 15.0
#: Consul waits this many TTLs after the last renewal before it invalidates a session.
TTL_MULTIPLIER: Final = 2


class ConsulAPIError(Exception):
    """A request Consul would refuse, with the status it would answer."""

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

    def create(self, body: dict[str, Any], index: int) -> Session:
        """A new session from Consul's create body (field names in any case)."""
        parse = parse_duration
        fields = {k.lower(): v for k, v in body.items()}
        node = fields.get("node") or self.node
        if node != self.node:
            raise ConsulAPIError(500, f"Missing node registration: {node}")
        behavior = fields.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise ConsulAPIError(400, f"Invalid Behavior setting '{behavior}'")
        ttl = 0.0
        if fields.get("ttl"):
            parsed = parse(str(fields["ttl"]))
            if parsed is None:
                raise ConsulAPIError(400, f"Request decode failed: invalid TTL {fields['ttl']!r}")
            ttl = parsed
            if ttl and not self.ttl_min <= ttl <= _TTL_MAX:
                raise ConsulAPIError(400, f"TTL must be between [{_format(self.ttl_min)}-{_format(_TTL_MAX)}]")
        delay = _DEFAULT_LOCK_DELAY
        if "lockdelay" in fields:
            raw = fields["lockdelay"]
            # A bare number is seconds when small, nanoseconds otherwise (Consul's FixupLockDelay).
            given = (raw if raw < 1000 else raw / 1e9) if isinstance(raw, int | float) else parse(str(raw))
            if given is None or given < 0:
                raise ConsulAPIError(400, f"Request decode failed: invalid LockDelay {raw!r}")
            delay = min(float(given), _LOCK_DELAY_MAX)
        checks = fields.get("nodechecks", fields.get("checks"))
        checks = ["serfHealth"] if checks is None else [str(c) for c in checks]
        unknown = [c for c in checks if c != "serfHealth"]
        if unknown:
            raise ConsulAPIError(500, f"Missing check '{unknown[0]}' registration")
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


_GO_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """A Go duration in seconds, or None when `text` is not one ("0" is zero, as in Go)."""
    if text.strip() == "0":
        return 0.0
    found = _GO_DURATION.findall(text)
    if not found or "".join(n + u for n, u in found) != text.strip():
        return None
    return sum(float(n) * _UNITS[u] for n, u in found)


def _format(seconds: float) -> str:
    """A duration as Go prints the whole seconds Consul's messages show (`10s`, `24h0m0s`)."""
    whole = int(seconds)
    if whole < 60 or whole != seconds:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


class AgentState:
    """What the fake agent's KV and session verbs share of its state (`FakeConsul` holds it):
    the sessions, the lock, the raft index, and the KV store with its tombstones and index."""

    sessions: SessionTable
    _cond: threading.Condition
    _index: int
    _kv: dict[str, dict[str, Any]]
    _kv_tombstones: dict[str, int]
    _kv_index: int


class SessionsMixin(AgentState):
    """The fake agent's session verbs, over its KV store and lock (`FakeConsul` is one)."""

    def txn(self, ops: list[Any], *, raise_on_failure: bool = True) -> list[dict[str, Any]] | None:
        raise NotImplementedError

    def create_session(self, body: dict[str, Any]) -> str:
        """`PUT /v1/session/create` without HTTP: the new session's ID."""
        with self._cond:
            self._reap_sessions()
            session = self.sessions.create(body, self._index + 1)
            self._index += 1
            return session.id

    def renew_session(self, session_id: str) -> dict[str, Any] | None:
        """`PUT /v1/session/renew/ID` without HTTP: the session, or None when it is gone."""
        with self._cond:
            self._reap_sessions()
            session = self.sessions.sessions.get(session_id)
            if session is None:
                return None
            session.renew(time.monotonic())
            return session.json()

    def destroy_session(self, session_id: str) -> None:
        """`PUT /v1/session/destroy/ID` without HTTP: invalidate it, as its TTL running out would."""
        with self._cond:
            self._invalidate(session_id)

    def _reap_sessions(self) -> bool:
        """Invalidate the sessions whose TTL ran out; called with the lock held (by every request
        and every blocked query as it waits, so expiry is seen as it happens)."""
        due = self.sessions.due(time.monotonic())
        for session_id in due:
            self._invalidate(session_id)
        return bool(due)

    def _invalidate(self, session_id: str) -> None:
        session = self.sessions.sessions.pop(session_id, None)
        if session is None:
            return
        index = self._index + 1
        now = time.monotonic()
        held = [k for k, e in self._kv.items() if e.get("Session") == session_id]
        kv = dict(self._kv)
        for key in held:
            if session.behavior == "delete":
                del kv[key]
                self._kv_tombstones[key] = index
            else:
                kv[key] = {k: v for k, v in kv[key].items() if k != "Session"} | {"ModifyIndex": index}
            if session.lock_delay > 0:
                self.sessions.delays[key] = now + session.lock_delay
        self._kv = kv
        self._index = index
        if held:
            self._kv_index = index
        self._cond.notify_all()

    def kv_lock(self, key: str, value: bytes, session_id: str, *, release: bool = False, flags: int = 0) -> bool:
        """`PUT /v1/kv/KEY?acquire=ID` (`?release=ID`) without HTTP: False when another session
        holds the key, it is in a lock delay, or (release) this session does not hold it."""
        with self._cond:
            self._reap_sessions()
            if session_id not in self.sessions.sessions:
                raise ConsulAPIError(500, f'invalid session "{session_id}"')
        verb = "unlock" if release else "lock"
        op = {"Verb": verb, "Key": key, "Flags": flags, "Session": session_id,
              "Value": base64.b64encode(value).decode()}  # fmt: skip
        return self.txn([{"KV": op}], raise_on_failure=False) is not None


def route_session(handler: Any, fake: SessionsMixin, method: str, rest: str, body: bytes) -> None:
    """Answer `/v1/session/REST` on `handler` (the fake's HTTP handler)."""
    verb, _, session_id = rest.partition("/")
    if method == "PUT" and verb == "create":
        try:
            payload = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            raise ConsulAPIError(400, f"Request decode failed: {exc}") from exc
        if not isinstance(payload, dict):
            raise ConsulAPIError(400, "Request decode failed: expected an object")
        handler._send(200, json.dumps({"ID": fake.create_session(payload)}).encode(), {})
    elif method == "PUT" and verb == "renew" and session_id:
        found = fake.renew_session(session_id)
        if found is None:
            handler._send(404, f"Session id '{session_id}' not found".encode(), {})
        else:
            handler._send(200, json.dumps([found]).encode(), {})
    elif method == "PUT" and verb == "destroy" and session_id:
        fake.destroy_session(session_id)
        handler._send(200, b"true", {})
    elif method == "GET" and verb in ("info", "list"):
        with fake._cond:
            sessions = [s.json() for s in fake.sessions.sessions.values() if verb == "list" or s.id == session_id]
            index = fake._index
        handler._send(200, json.dumps(sessions).encode(), {"X-Consul-Index": str(index)})
    else:
        raise ConsulAPIError(405 if verb in ("create", "renew", "destroy", "info", "list") else 404,
                             f"no such endpoint: {method} /v1/session/{rest}")  # fmt: skip
