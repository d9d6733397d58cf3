"""Consul's blocking-query loop: one thread keeps one path's answer fresh, by Consul's rules.

Every watching client of meshctl (the catalog registry, the KV config source, replicas' shared
health and rollout state) runs this one loop, so each follows the same rules for blocking
queries (api-docs/features/blocking); it is apart from the registry because those other clients
need the loop without the catalog:

- the next `index` is the `X-Consul-Index` of the last answer; an index lower than the one sent
  resets it to 0 (one plain read, then blocking again), and an index of 0 is used as 1, so a
  buggy answer never turns the loop into a busy loop;
- `wait` (5 minutes by default) gets up to 1/16 of random jitter, so watches started together
  do not wake together;
- each loop is rate limited by a token bucket (a burst of 4, then one query per 5 s), which
  never delays the happy case but bounds a path that churns, or a Consul that answers at once;
- errors back off exponentially with jitter (1 s to 30 s by default) and never end the thread;
  the first query after an error keeps its index but waits at most a second, so an answer
  confirms the recovery (and clears the error from the caller's status) without waiting out `wait`.

Stopping is prompt: each loop owns its connection, and `stop()` cuts it (`ConsulConnection.abort`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from meshctl.registry.consul_http import (
    ConnectionAborted,
    ConsulConnection,
    ConsulOptions,
    ConsulReply,
    describe_error,
)

# Every Consul watch logs under one name, whichever client runs it.
logger = logging.getLogger("meshctl.registry.consul")

RECOVERY_WAIT: Final = 1.0


def next_index(sent: int, returned: int) -> int:
    """The index for the next query: 0 (a plain read) when Consul's index went backwards, and
    never below 1 after an answer, so a query that should block does block."""
    if returned < sent:
        return 0
    return max(returned, 1)


class _TokenBucket:
    """Consul's advice for blocking loops: proceed at once in the happy case, and degrade to one
    query per `interval` when answers keep coming fast."""

    def __init__(self, burst: int, interval: float) -> None:
        self._burst, self._interval = float(burst), interval
        self._tokens, self._last = float(burst), time.monotonic()

    def take(self) -> float:
        """Take a token; return how long to wait before using it."""
        now = time.monotonic()
        if self._interval > 0:
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        else:
            self._tokens = self._burst
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens * self._interval

    def give_back(self) -> None:
        """Return the token of a failed query: backoff paces failures, the bucket paces answers."""
        self._tokens = min(self._burst, self._tokens + 1)


class BlockingQuery:
    """A thread that keeps one Consul path's answer fresh and hands each answer to `on_data`."""

    def __init__(
        self,
        options: ConsulOptions,
        path: str,
        on_data: Callable[[object, ConsulReply], None],
        on_error: Callable[[str], None],
        *,
        params: Mapping[str, str] | None = None,
        missing_is_none: bool = False,
    ) -> None:
        self.path = path
        self._options = options
        #: Query parameters of every request (`recurse` for a KV prefix); `missing_is_none` hands
        #: a 404 that carries an index (a KV prefix with no keys) to `on_data` as None.
        self._params, self._missing_is_none = dict(params or {}), missing_is_none
        self._on_data, self._on_error = on_data, on_error
        self._conn = ConsulConnection(options)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consul {path}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._conn.abort()

    def join(self, timeout: float) -> bool:
        if self._thread.ident is not None:
            self._thread.join(max(timeout, 0.0))
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        except ConnectionAborted:
            pass
        finally:
            self._conn.close()

    def _loop(self) -> None:
        o = self._options
        bucket = _TokenBucket(o.rate_burst, o.rate_interval)
        index, failures = 0, 0
        while not self._stop.wait(bucket.take()):
            params = self._params | ({"dc": o.datacenter} if o.datacenter else {})
            timeout = o.request_timeout
            if index > 0:
                # After a failure, a short wait: an answer is what shows Consul is back.
                wait = min(o.wait, RECOVERY_WAIT) if failures else o.wait * (1 - random.random() * o.wait_jitter)
                params |= {"index": str(index), "wait": f"{int(wait * 1000)}ms"}
                timeout += wait * 17 / 16  # Consul adds up to wait/16 of its own jitter
            try:
                reply = self._conn.get(self.path, params, timeout)
                missing = self._missing_is_none and reply.status == 404
                data, returned = None if missing else reply.json(self.path), reply.index
                if returned < index:
                    logger.info(
                        "consul index of %s went back from %d to %d: reading afresh", self.path, index, returned
                    )
                self._on_data(data, reply)
            except ConnectionAborted:
                return
            except Exception as exc:  # anything at all: report it, back off, carry on from the same index
                if self._stop.is_set():
                    return
                failures += 1
                bucket.give_back()
                self._report_error(describe_error(exc))
                ceiling = min(o.backoff_max, o.backoff_min * 2 ** min(failures - 1, 30))
                if self._stop.wait(random.uniform(ceiling / 2, ceiling)):
                    return
                continue
            failures = 0
            index = next_index(index, returned)

    def _report_error(self, message: str) -> None:
        try:
            self._on_error(message)
        except Exception:
            logger.exception("consul error of %s could not be reported", self.path)
