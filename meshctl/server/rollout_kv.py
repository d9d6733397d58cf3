"""The staged rollout's state shared by replicas through the Consul KV store they follow.

Replicas that serve one `--config-consul-kv PREFIX` build the same versions (content hashes) from
the same keys, within a second of each other. For a proxy to be offered the same version
whichever replica it is on, they share the rollout's decisions under one KV folder beside the
prefix (`PREFIX.rollout/`, outside it, so the config's own watch is not woken):

    PREFIX.rollout/state          {"fleet", "candidate", "held", "held_by_operator", "pinned",
                                   "pinned_inputs", "stage_started"}: what every replica offers
    PREFIX.rollout/canaries/ID    one replica's canaries of the candidate: how many, whether all
                                  hold it ACKed, and when it said so (refreshed while staged)

Every change of `state` is a check-and-set against the index last read, made as a transform of
what is there (stage V, hold V, promote V, pin V, resume): when another replica wrote first, the
transform runs again on its state, so a hold is never lost to a concurrent stage. Two blocking
queries, one on `state` and one on the reports, hand each new revision to the rollout
(`Rollout.adopt`) on the event loop: apart, so the reports (every `REPORT_EVERY` seconds from each
replica) do not use up the state's watch's rate limit, and a decision reaches every replica at
once.
A replica's report older than `REPORT_FRESH` seconds is ignored (its replica is gone), so a dead
replica cannot hold a rollout forever.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Final

from meshctl.kv.source import KvLocation, kv_path
from meshctl.registry.consul_http import ConsulConnection, ConsulOptions, ConsulReply
from meshctl.registry.consul_watch import BlockingQuery
from meshctl.server.rollout_plan import RolloutSettings

logger = logging.getLogger("meshctl.server.rollout_kv")

#: Seconds after which a replica's canary report no longer counts, and how often one is said again.
REPORT_FRESH: Final = 30.0
REPORT_EVERY: Final = 10.0
#: Check-and-set attempts of one transform before it is given up (and logged).
_CAS_ATTEMPTS: Final = 8

State = dict[str, Any]
Transform = Callable[[State], State | None]


def rollout_folder(prefix: str) -> str:
    """The KV folder of the rollout state of replicas following config `prefix`."""
    return prefix.rstrip("/") + ".rollout/"


def shared_rollout(config_kv: KvLocation | None, rollout: RolloutSettings) -> SharedRollout | None:
    """Where replicas share the rollout state: beside the Consul KV prefix their config comes
    from, when there are canaries to stage for; None otherwise."""
    if config_kv is None or rollout.canary is None:
        return None
    return SharedRollout(config_kv.consul, rollout_folder(config_kv.prefix))


class SharedRollout:
    """Reads and writes the shared rollout state (see the module docstring)."""

    def __init__(self, consul: ConsulOptions, folder: str, replica: str = "") -> None:
        self.folder = folder
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}"
        self._consul = consul
        self._conn = ConsulConnection(consul)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshctl-rollout-kv")
        self._lock = threading.Lock()
        self._index = 0  # ModifyIndex of `state` as last read
        #: changes submitted and not yet written (or found needless): while any is, the state the
        #: watch reads predates this replica's own decision, and is not handed to the rollout
        self._pending = 0
        #: the ModifyIndex this replica's last write replaced: a state read at or below it is
        #: older than that write (a watch's answer still on its way), never adopted
        self._overwritten = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_change: Callable[[State, dict[str, State]], None] | None = None
        self._queries: list[BlockingQuery] = []
        self._state: State = {}
        self._reports: dict[str, State] = {}
        self._said_error = False

    def start(self, on_change: Callable[[State, dict[str, State]], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        # A decision must reach every replica at once: the state's watch may answer often.
        quick = replace(self._consul, rate_burst=8, rate_interval=0.5)
        self._queries = [
            BlockingQuery(quick, kv_path(f"{self.folder}state"), self._on_state, self._on_error, missing_is_none=True),
            BlockingQuery(
                self._consul,
                kv_path(f"{self.folder}canaries/"),
                self._on_reports,
                self._on_error,
                params={"recurse": "true"},
                missing_is_none=True,
            ),
        ]
        for query in self._queries:
            query.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop reading and writing; a write under way is cut (the state is Consul's, nothing is lost
        but this replica's last word)."""
        for query in self._queries:
            query.stop()
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._conn.abort()
        for query in self._queries:
            query.join(timeout)
        self._writer.shutdown(wait=True)
        self._conn.close()

    # -- reading ---------------------------------------------------------------------------

    def _on_state(self, data: object, _reply: ConsulReply) -> None:
        state, _, index = self._decode(data)
        with self._lock:
            if index <= self._overwritten:
                return
            self._index = index
            self._state = state
        self._tell()

    def _on_reports(self, data: object, _reply: ConsulReply) -> None:
        _, reports, _ = self._decode(data)
        with self._lock:
            self._reports = reports
        self._tell()

    def _tell(self) -> None:
        """Hand the state and reports as last read to the rollout, on the event loop."""
        with self._lock:
            if self._pending:
                return  # told once the change is written, with the state it wrote
            state, reports = dict(self._state), dict(self._reports)
        loop, callback = self._loop, self._on_change
        if loop is not None and callback is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(callback, state, reports)
            except RuntimeError:  # the loop closed meanwhile
                return

    def _on_error(self, message: str) -> None:
        if not self._said_error:
            logger.warning("the shared rollout state in consul (%s) cannot be read: %s", self.folder, message)
        self._said_error = True

    def _decode(self, data: object) -> tuple[State, dict[str, State], int]:
        state: State = {}
        reports: dict[str, State] = {}
        index = 0
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, dict):
                continue
            key = str(entry.get("Key", ""))[len(self.folder) :]
            try:
                value = json.loads(base64.b64decode(entry.get("Value") or b""))
            except (ValueError, TypeError):
                continue
            if not isinstance(value, dict):
                continue
            if key == "state":
                state, index = value, int(entry.get("ModifyIndex", 0))
            elif key.startswith("canaries/"):
                reports[key[len("canaries/") :]] = value
        self._said_error = False
        return state, reports, index

    # -- writing ---------------------------------------------------------------------------

    def change(self, transform: Transform) -> None:
        """Apply `transform` to the shared state, check-and-set, off the loop, in order. Until it
        is written, the rollout is not handed a state read before it: this replica's decision (a
        hold) would be undone by a state that does not have it yet, and made again when the
        watch reads the write."""
        with self._lock:
            self._pending += 1
        self._writer.submit(self._change_and_tell, transform)

    def _change_and_tell(self, transform: Transform) -> None:
        try:
            self._change(transform)
        finally:
            with self._lock:
                self._pending -= 1
            self._tell()

    def report(self, report: State) -> None:
        """This replica's canaries of the candidate."""
        body = json.dumps({**report, "at": time.time()}).encode()
        self._writer.submit(self._put, f"{self.folder}canaries/{self.replica}", body, None)

    def _change(self, transform: Transform) -> None:
        for _ in range(_CAS_ATTEMPTS):
            current, index = self._read_state()
            new = transform(dict(current))
            if new is None or new == current:
                with self._lock:
                    if index >= self._index and index > self._overwritten:
                        self._index, self._state = index, current
                return
            if self._put(f"{self.folder}state", json.dumps(new, sort_keys=True).encode(), index):
                with self._lock:
                    self._overwritten = max(self._overwritten, index)
                    self._state = new
                return
        logger.error("the shared rollout state in consul (%s) kept changing: a change was not written", self.folder)

    def _read_state(self) -> tuple[State, int]:
        try:
            reply = self._conn.get(kv_path(f"{self.folder}state"), {}, self._consul.request_timeout)
        except Exception as exc:
            self._on_error(str(exc))
            return {}, 0
        if reply.status == 404:
            return {}, 0
        state, _, index = self._decode(reply.json(f"{self.folder}state"))
        return state, index

    def _put(self, key: str, body: bytes, cas: int | None) -> bool:
        params = {"cas": str(cas)} if cas is not None else {}
        try:
            reply = self._conn.request("PUT", kv_path(key), params, self._consul.request_timeout, body)
        except Exception as exc:
            self._on_error(str(exc))
            return False
        if reply.status != 200:
            self._on_error(f"PUT {key}: HTTP {reply.status}")
            return False
        return reply.body.strip() == b"true"
