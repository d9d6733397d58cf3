"""Safe delivery, wired to the running server: the push history and the staged rollout fed from
the ADS servicer's events, and what the admin pages and metrics say of them.

`Delivery` is the servicer's `PushObserver`: it passes every event on to the metrics, records it
in the history (`meshctl.server.history`) under the snapshot version the stream was offered when
it was sent (Envoy ACKs a type's set version; each stream remembers which snapshot version each
set version it was sent came from), and hands ACKs, NACKs and disconnects to the rollout
(`meshctl.server.rollout`), whose `RolloutSource` sits between the cache and the streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from meshctl.server.ads import PushObserver, Stream
from meshctl.server.history import GitState, PushHistory, git_state, proxy_counts
from meshctl.server.metrics import Counter, Gauge, Metrics
from meshctl.server.rollout import Rollout, RolloutError
from meshctl.server.rollout_kv import SharedRollout
from meshctl.server.rollout_plan import Resolver, RolloutSettings, RolloutSource
from meshctl.server.subscription import Push
from meshctl.snapshot.model import Snapshot
from meshctl.xds import types

logger = logging.getLogger("meshctl.server.delivery")

#: Set versions remembered per stream and type (what an ACK names), newest last.
_SENT_REMEMBERED = 16


class Delivery(PushObserver):
    """The history and the rollout of one server (see the module docstring)."""

    def __init__(  # noqa: PLR0917 (each is a different part of the server)
        self,
        metrics: Metrics,
        history: PushHistory,
        rollout: RolloutSettings,
        config_dirs: Sequence[Path],
        streams: Callable[[], Iterable[Stream]],
        republish: Callable[[], None],
        shared: SharedRollout | None = None,
    ) -> None:
        self.metrics = metrics
        self.history = history
        self._config_dirs = tuple(config_dirs)
        self._previous: Snapshot | None = None
        #: the git state of the config directories at the latest config version (once known)
        self._git: asyncio.Future[list[tuple[str, GitState]]] | None = None
        #: conn id -> (type url, set version) -> snapshot version it was sent at
        self._sent: dict[str, dict[tuple[str, str], str]] = {}
        self._flusher: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rollout = Rollout(
            rollout,
            streams,
            republish,
            say=history.note_rollout,
            call_later=self._call_later,
        )
        self.rollout.shared = self._shared = shared
        metrics.extra.append(self._metrics)

    def source(self, resolve: Resolver) -> RolloutSource:
        """The config source the streams are served from: `resolve` with the rollout in between."""
        return RolloutSource(resolve, self.rollout)

    def _call_later(self, seconds: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, callback)

    # -- snapshots -------------------------------------------------------------------------

    async def published(self, snapshot: Snapshot) -> None:
        """A snapshot is about to be pushed: record it, say it, and let the rollout decide who
        gets it. The config directories' git commit is looked up once per config version, off
        the loop, and not waited for: `git rev-parse` and `git status` take 5 to 20 ms (more in
        a large checkout) and the pushes need neither; the entry and the log line get it when
        it is known."""
        if self._loop is None and self._shared is not None:
            self._shared.start(self.rollout.adopt)
        loop = self._loop = asyncio.get_running_loop()
        previous = self._previous
        git = self._git
        if git is None or previous is None or previous.config_version != snapshot.config_version:
            # (Endpoints alone moved: the config directory is as it was, and so is its commit.)
            git = self._git = loop.run_in_executor(None, self._git_states)
        entry = self.history.record(snapshot, previous, git.result() if _known(git) else ())
        self._previous = snapshot
        said = (
            "endpoints only"
            if entry["endpoint_only"]
            else f"{len(entry['changes']) + entry['changes_beyond']} change(s)"
        )
        if git.done():
            self._say(snapshot.version, said, git, noted=True)
        else:
            git.add_done_callback(lambda found: self._say(snapshot.version, said, found, noted=False))
        self.rollout.published(snapshot)
        self._flush_soon()

    def _say(self, version: str, said: str, git: asyncio.Future[list[tuple[str, GitState]]], *, noted: bool) -> None:
        """Log the version being pushed with the commit it was built from, and note the commit in
        its history entry (unless `noted` at `record`)."""
        if not _known(git):
            if not git.cancelled():
                logger.warning("could not look up the git commit of version %s: %s", version, git.exception())
            return
        found = git.result()
        if not noted:
            self.history.note_git(version, found)
            self._flush_soon()
        commits = ", ".join(f"{g.describe()} in {d}" for d, g in found) if found else "no git checkout"
        logger.info("pushing version %s (commit %s): %s", version, commits, said)

    def _git_states(self) -> list[tuple[str, GitState]]:
        out = []
        for directory in self._config_dirs:
            state = git_state(directory)
            if state is not None:
                out.append((str(directory), state))
        return out

    def stop(self) -> None:
        if self._shared is not None:
            self._shared.stop()
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        self.history.flush(force=True)

    def _flush_soon(self) -> None:
        if self._flusher is None and self._loop is not None and not self._loop.is_closed():
            self._flusher = self._loop.call_later(1.0, self._flush)

    def _flush(self) -> None:
        self._flusher = None
        self.history.flush(force=True)

    # -- the servicer's events -------------------------------------------------------------

    def pushed(self, stream: Stream, push: Push, size: int) -> None:
        self.metrics.pushed(stream, push, size)
        resources = stream.connection.resources
        if resources is None:
            return
        sent = self._sent.setdefault(stream.connection.id, {})
        key = (push.type_url, push.version)
        sent.pop(key, None)
        sent[key] = resources.snapshot_version
        while len(sent) > _SENT_REMEMBERED * len(types.PUSH_ORDER):
            del sent[next(iter(sent))]
        self.history.note_proxy(resources.snapshot_version, stream.connection.node_id, _short(push.type_url), "sent")
        self._flush_soon()

    def acked(self, stream: Stream, type_url: str) -> None:
        self.metrics.acked(stream, type_url)
        sub = stream.connection.subscriptions.get(type_url)
        version = sub.acked_version if sub is not None else None
        snapshot_version = self._sent.get(stream.connection.id, {}).get((type_url, version or ""))
        if snapshot_version is not None:
            self.history.note_proxy(snapshot_version, stream.connection.node_id, _short(type_url), "acked")
            self._flush_soon()
        self.rollout.acked(stream)

    def rejected(self, stream: Stream, type_url: str, error: str) -> None:
        self.metrics.rejected(stream, type_url, error)
        sub = stream.connection.subscriptions.get(type_url)
        nack = sub.nack if sub is not None else None
        sent = self._sent.get(stream.connection.id, {})
        snapshot_version = sent.get((type_url, nack.version)) if nack is not None else None
        if snapshot_version is None and stream.connection.resources is not None:
            snapshot_version = stream.connection.resources.snapshot_version
        if snapshot_version is not None:
            self.history.note_proxy(snapshot_version, stream.connection.node_id, _short(type_url), "nacked", error)
            self._flush_soon()
        self.rollout.rejected(stream, _short(type_url), error)

    def connected(self, count: int) -> None:
        self.metrics.connected(count)

    def converged(self, stream: Stream, seconds: float) -> None:
        self.metrics.converged(stream, seconds)

    def certificate_seen(self, stream: Stream) -> None:
        self.metrics.certificate_seen(stream)

    def disconnected(self, stream: Stream) -> None:
        self.metrics.disconnected(stream)
        self._sent.pop(stream.connection.id, None)
        self.rollout.left(stream)

    # -- what the admin pages and metrics say ----------------------------------------------

    def history_page(self, version: str = "") -> Any:
        """`/debug/history`: every version kept, newest first, without per-proxy detail (a count
        of proxies sent, ACKed and NACKed instead); `?version=V`: that one entry whole."""
        if version:
            return self.history.entry(version)
        return [summary(entry) for entry in reversed(self.history.entries())]

    def act(self, action: str, version: str = "") -> str:
        """An operator's rollout action; raises RolloutError saying why it cannot be done."""
        rollout = self.rollout
        if action == "promote":
            return rollout.promote()
        if action == "hold":
            return rollout.hold()
        if action == "resume":
            return rollout.resume()
        if action == "rollback":
            return rollout.rollback(version)
        raise RolloutError(f"no rollout action {action!r}: promote, hold, resume or rollback")

    def ready_note(self) -> str:
        """What `/ready` adds to its body: a pinned or held fleet."""
        rollout = self.rollout
        if rollout.pinned:
            return f"pinned to version {rollout.pinned} by rollback (meshctl rollout resume lifts it)"
        if rollout.held:
            return f"rollout held: {rollout.held}"
        return ""

    def _metrics(self) -> list[Counter]:
        rollout = self.rollout
        held = Gauge("meshctl_rollout_held", "1 while a candidate version is held from the fleet (a NACK, a canary "
                     "gone, or the operator), else 0.")  # fmt: skip
        held.set(1 if rollout.held else 0)
        pinned = Gauge("meshctl_rollout_pinned", "1 while the fleet is pinned to an earlier version by rollback.")
        pinned.set(1 if rollout.pinned else 0)
        staged = Gauge("meshctl_rollout_canary", "1 while a candidate version is on the canaries only.")
        staged.set(1 if rollout.candidate is not None else 0)
        promotions = Counter("meshctl_rollout_promotions", "Candidate versions promoted to the fleet.")
        promotions.inc(by=rollout.promotions)
        holds = Counter("meshctl_rollout_holds", "Times a candidate version was held from the fleet.")
        holds.inc(by=rollout.holds)
        info = Gauge(
            "meshctl_rollout_info",
            "The version the fleet and the canaries are offered (value 1).",
            ["role", "version"],
            (),
        )
        if rollout.fleet is not None:
            info.set(1, "pinned" if rollout.pinned else "fleet", rollout.fleet.version)
        if rollout.candidate is not None:
            info.set(1, "canary", rollout.candidate.version)
        return [held, pinned, staged, promotions, holds, info]


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as the listing shows it: the per-proxy records counted."""
    out = {k: v for k, v in entry.items() if k not in ("proxies", "counted")}
    return out | proxy_counts(entry)


def _known(future: asyncio.Future[list[tuple[str, GitState]]]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _short(type_url: str) -> str:
    return types.SHORT_NAMES.get(type_url, type_url)
