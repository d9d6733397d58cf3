"""Staged rollout: which snapshot each proxy is offered, between the cache and the streams.

Without a canary selector every proxy is offered the newest snapshot, as ever. With one
(`serve --canary`), a new version is a *candidate*: the proxies the selector matches (canaries)
are offered it, every other proxy stays on the *fleet* version it has. The candidate becomes the
fleet version (is promoted) once every connected canary holds it ACKed, type by type, and
`soak` seconds have passed since it was published without a canary NACKing it or leaving. A
NACK, or a canary leaving during the soak, holds the candidate: the fleet stays where it is, the
log says who refused what, and `meshctl_rollout_held` is 1, until a new version is published
(it becomes the candidate, the hold is lifted), or the operator promotes or resumes.

Endpoint-only changes (EDS; the same `config_version`) skip the stage: a dead endpoint must leave
every proxy at once. The fleet version is then rebuilt with the new endpoints (its configs, the
new services: `with_endpoints`) when the service definitions are unchanged, so it keeps its config
and loses the endpoint.

Rollback pins the fleet, canaries included, to a version every proxy once ACKed (the newest
`keep_good` of them are kept, bounded: the snapshot of each is held, nothing else of older
versions), until the config inputs change again (a new candidate then starts from the pinned
version) or the operator resumes.

What is kept: the newest snapshot (`latest`), the fleet's, the candidate's and the last few good
ones. Resources are generated from them on demand by the cache as for any snapshot, and the cache
interns equal sets, so a proxy kept on the fleet version is handed the very sets it holds and its
stream is not woken.

The decisions (`Rollout`) run on the event loop; the ADS servicer's generation thread reads the
current `Plan` only, one immutable object swapped in one assignment (`rollout_plan`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from meshctl.server.rollout_kv import REPORT_EVERY, REPORT_FRESH
from meshctl.server.rollout_plan import Plan, RolloutSettings, with_endpoints
from meshctl.snapshot.model import Snapshot

if TYPE_CHECKING:
    from meshctl.server.ads import Stream
    from meshctl.server.rollout_kv import SharedRollout

logger = logging.getLogger("meshctl.server.rollout")

#: How long after an ACK the server looks whether every proxy now holds the fleet version.
_GOOD_CHECK_DELAY: Final = 0.2


class Rollout:
    """The rollout's state and decisions, on the event loop (see the module docstring).

    `streams` gives the live ADS streams; `republish` has every stream resolved again (after the
    plan changed); `say` records steps in the push history (version, step)."""

    def __init__(
        self,
        settings: RolloutSettings,
        streams: Callable[[], Iterable[Stream]],
        republish: Callable[[], None],
        *,
        say: Callable[[str, str], None] = lambda _v, _s: None,
        clock: Callable[[], float] = time.monotonic,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        self.settings = settings
        self._streams = streams
        self._republish = republish
        self._say = say
        self._clock = clock
        self._call_later = call_later
        self.plan: Plan | None = None
        self.latest: Snapshot | None = None
        #: Why the candidate is held ("" when it is not), and whether the operator said so.
        self.held = ""
        self.held_by_operator = False
        #: The version pinned by rollback, and the config version of the inputs then.
        self.pinned = ""
        self._pinned_inputs = ""
        self._stage_started = 0.0
        self._timer: Any = None
        self._good_timer: Any = None
        #: The stream `check_good` last found short of the fleet version: looked at first.
        self._short: Stream | None = None
        self._waiting_said = ""
        #: Versions every proxy ACKed, newest last, with their snapshots (bounded by keep_good).
        self.good: OrderedDict[str, Snapshot] = OrderedDict()
        self.promotions = 0
        self.holds = 0
        #: Replicas' shared state (`meshctl.server.rollout_kv`), when they share a KV store; the
        #: last state read from it, and the other replicas' canary reports.
        self.shared: SharedRollout | None = None
        self._base: dict[str, Any] = {}
        self._base_read = False
        self._reports: dict[str, dict[str, Any]] = {}
        self._reported: dict[str, Any] = {}
        self._report_timer: Any = None
        self._stage_unix = 0.0
        #: Snapshots published lately, by version: what a version another replica chose is found in.
        self._recent: OrderedDict[str, Snapshot] = OrderedDict()

    # -- reading ---------------------------------------------------------------------------

    @property
    def fleet(self) -> Snapshot | None:
        return self.plan.fleet if self.plan is not None else None

    @property
    def candidate(self) -> Snapshot | None:
        return self.plan.candidate if self.plan is not None else None

    def role_of(self, stream: Stream) -> str:
        """`canary`, `fleet` or `` (not bound yet), by the snapshot the stream is offered."""
        resources = stream.connection.resources
        if resources is None or self.plan is None:
            return ""
        candidate = self.plan.candidate
        return "canary" if candidate is not None and resources.snapshot_version == candidate.version else "fleet"

    def status(self) -> dict[str, Any]:
        plan = self.plan
        canaries = [s for s in self._streams() if self.role_of(s) == "canary"]
        soak_left = 0.0
        if plan is not None and plan.candidate is not None:
            soak_left = max(0.0, self.settings.soak - (self._clock() - self._stage_started))
        selector = self.settings.canary
        return {
            "canary": selector.describe() if selector is not None else "",
            "soak_seconds": self.settings.soak,
            "latest": self.latest.version if self.latest is not None else "",
            "fleet": plan.fleet.version if plan is not None else "",
            "candidate": plan.candidate.version if plan is not None and plan.candidate is not None else "",
            "state": self.state(),
            "held": self.held,
            "pinned": self.pinned,
            "soak_left_seconds": round(soak_left, 1),
            "canaries": [
                {"proxy": s.connection.node_id, "acked": settled(s)}
                for s in sorted(canaries, key=lambda s: s.connection.node_id)
            ],
            "rollback_versions": list(reversed(self.good)),
        }

    def state(self) -> str:
        """`pinned`, `held`, `canary` (a candidate on the canaries), or `complete`."""
        if self.pinned:
            return "pinned"
        if self.held:
            return "held"
        return "canary" if self.candidate is not None else "complete"

    # -- the snapshots -----------------------------------------------------------------------

    def published(self, snapshot: Snapshot) -> None:
        """A new snapshot is about to be published: decide who is offered it."""
        self._remember(snapshot)
        first = self.plan is None
        self._decide(snapshot)
        if self.shared is None:
            return
        base = self._base
        if first:
            ours = self.shared_state()
            self.shared.change(lambda theirs: theirs if theirs.get("fleet") else ours)  # the replicas' first
        elif snapshot.version in (base.get("fleet"), base.get("candidate"), base.get("pinned")):
            self.adopt(base, self._reports, republish=False)  # another replica decided already
        else:
            self._share()

    def _remember(self, snapshot: Snapshot) -> None:
        self._recent[snapshot.version] = snapshot
        while len(self._recent) > 4:
            self._recent.popitem(last=False)

    def _decide(self, snapshot: Snapshot) -> None:
        self.latest = snapshot
        plan = self.plan
        if plan is None:
            self._set_plan(Plan(snapshot, None, self.settings.canary))
            self._say(snapshot.version, "fleet")
            return
        fleet = plan.fleet
        if self.pinned:
            if snapshot.config_version == self._pinned_inputs:
                # Endpoints moved: the pinned config keeps up with them (a dead endpoint leaves).
                moved = with_endpoints(fleet, snapshot)
                if moved is not None and moved is not fleet:
                    self._set_plan(Plan(moved, None, self.settings.canary))
                return
            logger.info("the inputs changed: the fleet is no longer pinned to %s", self.pinned)
            self.pinned = self._pinned_inputs = ""
        endpoint_only = snapshot.config_version == (plan.candidate or fleet).config_version
        if endpoint_only and not self.settings.stage_endpoints:
            self._endpoints_moved(plan, snapshot)
            return
        self._stage(snapshot)

    def _endpoints_moved(self, plan: Plan, snapshot: Snapshot) -> None:
        """An endpoint-only change: to everyone at once, whatever the stage."""
        if plan.candidate is None:
            self._set_plan(Plan(snapshot, None, self.settings.canary))
            self._say(snapshot.version, "fleet")
            return
        fleet = with_endpoints(plan.fleet, snapshot) or plan.fleet
        self._remember(fleet)
        self._set_plan(Plan(fleet, snapshot, self.settings.canary))
        self._say(snapshot.version, "canary")

    def _stage(self, snapshot: Snapshot) -> None:
        plan = self.plan
        assert plan is not None
        if snapshot.version == plan.fleet.version:
            self._set_plan(Plan(plan.fleet, None, self.settings.canary))
            if not self.held_by_operator:
                self.held = ""
            return
        if not self.held_by_operator:
            self.held = ""
        if self.settings.canary is None and not self.held:
            self._set_plan(Plan(snapshot, None, None))  # no stage: everyone gets it now
            self._say(snapshot.version, "fleet")
            return
        self._stage_started = self._clock()
        self._stage_unix = time.time()
        self._waiting_said = ""
        self._set_plan(Plan(plan.fleet, snapshot, self.settings.canary))
        if self.settings.canary is not None:
            logger.info(
                "version %s goes to the canaries (%s) first; the fleet stays on %s for now",
                snapshot.version, self.settings.canary.describe(), plan.fleet.version,
            )  # fmt: skip
            self._say(snapshot.version, "canary")
        # Looked at again on every ACK, and at the end of the soak at the latest.
        self._arm(self.settings.soak)

    def _set_plan(self, plan: Plan) -> None:
        unstaged = plan.candidate is None and plan.selector is None and not self.pinned and not self.held
        self.plan = dataclasses.replace(plan, unstaged=unstaged) if unstaged != plan.unstaged else plan

    # -- events ------------------------------------------------------------------------------

    def acked(self, stream: Stream) -> None:
        if self.candidate is not None:
            self.check()
        self._check_good_soon()

    def rejected(self, stream: Stream, type_short: str, error: str) -> None:
        candidate = self.candidate
        if candidate is None or self.role_of(stream) != "canary" or self.held:
            return
        self._hold(
            f"canary {stream.connection.node_id} rejected {type_short} of version {candidate.version}: {error[:500]}"
        )

    def left(self, stream: Stream) -> None:
        if stream is self._short:
            self._short = None
        candidate = self.candidate
        if candidate is None or self.held or self.role_of(stream) != "canary":
            return
        self._hold(f"canary {stream.connection.node_id} disconnected during the soak of version {candidate.version}")

    def _hold(self, why: str) -> None:
        self.held = why
        self.holds += 1
        fleet = self.fleet
        logger.error("rollout held, the fleet stays on %s: %s", fleet.version if fleet else "(none)", why)
        if self.candidate is not None:
            self._say(self.candidate.version, "held")
        self._share()

    def check(self) -> None:
        """Promote the candidate if every canary holds it ACKed and the soak is over."""
        candidate = self.candidate
        if candidate is None or self.held:
            return
        selector = self.settings.canary
        if selector is None:
            self.promote(by="")
            return
        canaries = [s for s in self._streams() if self.role_of(s) == "canary"]
        others = self._report(candidate.version, canaries)
        if others is None:
            return  # another replica has not staged it yet, or its canaries have not ACKed it
        if not canaries and not others:
            if (left := self.settings.soak - (self._clock() - self._stage_started)) > 0:
                self._arm(left)  # a canary may connect, or another replica report one, meanwhile
                return
            if self._waiting_said != candidate.version:
                self._waiting_said = candidate.version
                where = "to this replica, nor reported by another" if self.shared is not None else ""
                logger.warning(
                    "version %s waits: no canary (%s) is connected%s; `meshctl rollout promote` sends it to the fleet",
                    candidate.version, selector.describe(), where,
                )  # fmt: skip
            return
        if not all(settled(s) for s in canaries):
            return
        left = self.settings.soak - (self._clock() - self._stage_started)
        if left > 0:
            self._arm(left)
            return
        self.promote(by="")

    def _arm(self, seconds: float) -> None:
        if self._call_later is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._call_later(seconds + 0.01, self.check)

    def _check_good_soon(self) -> None:
        if self._call_later is None:
            self.check_good()
        elif self._good_timer is None:
            self._good_timer = self._call_later(_GOOD_CHECK_DELAY, self.check_good)

    def check_good(self) -> None:
        """Note the fleet version as good (a rollback target) once every proxy holds it ACKed.

        Asked after ACKs while a fleet converges: the stream found short of it last time is
        looked at first, so each look costs one stream until that one is there, and the next
        look goes on from it (the streams before it held the version then)."""
        self._good_timer = None
        plan = self.plan
        if plan is None or plan.candidate is not None or plan.fleet.version in self.good:
            return
        version = plan.fleet.version
        short, self._short = self._short, None
        if short is not None and short.counted and not _holds(short, version):  # counted: still open
            self._short = short
            return
        streams = list(self._streams())
        if not streams:
            return
        if short is not None and short.counted:
            with contextlib.suppress(ValueError):
                at = streams.index(short)
                streams = streams[at:] + streams[:at]
        for stream in streams:
            if not _holds(stream, version):
                self._short = stream
                return
        self.good[version] = plan.fleet
        while len(self.good) > self.settings.keep_good:
            self.good.popitem(last=False)

    # -- the operator ----------------------------------------------------------------------

    def promote(self, by: str = "the operator") -> str:
        plan = self.plan
        if plan is None or plan.candidate is None:
            raise RolloutError("nothing to promote: every proxy is offered the same version")
        candidate = plan.candidate
        self.held = ""
        self.held_by_operator = False
        self.promotions += 1
        self._set_plan(Plan(candidate, None, self.settings.canary))
        if self.settings.canary is not None or by:
            how = f" by {by}" if by else " (canaries ACKed, soak over)"
            logger.info("version %s promoted to the fleet%s", candidate.version, how)
        self._say(candidate.version, "fleet")
        self._share()
        self._republish()
        return f"version {candidate.version} goes to the fleet"

    def hold(self) -> str:
        self.held_by_operator = True
        self.held = "held by the operator (meshctl rollout resume lifts it)"
        self.holds += 1
        fleet = self.fleet
        logger.warning("rollout held by the operator: the fleet stays on %s", fleet.version if fleet else "(none)")
        self._share()
        return f"the fleet stays on {fleet.version if fleet else '(none)'}"

    def resume(self) -> str:
        was_pinned = self.pinned
        self.held = ""
        self.held_by_operator = False
        self.pinned = self._pinned_inputs = ""
        latest = self.latest
        if latest is None:
            return "nothing to resume"
        if was_pinned:
            logger.info("the fleet is no longer pinned to %s (resumed by the operator)", was_pinned)
        plan = self.plan
        if plan is not None and latest.version != plan.fleet.version:
            self._stage(latest)
        self._share()
        self._republish()
        return f"resumed: {self.state()}"

    def rollback(self, version: str = "") -> str:
        """Pin every proxy to `version` (default: the newest good version the fleet is not on)."""
        plan = self.plan
        if plan is None or self.latest is None:
            raise RolloutError("no version is served yet")
        target = self._rollback_target(version, plan)
        self.pinned = target.version
        self._pinned_inputs = self.latest.config_version
        self.held = ""
        self.held_by_operator = False
        self._set_plan(Plan(target, None, self.settings.canary))
        logger.warning(
            "rolled back: every proxy is pinned to version %s until the inputs change or `meshctl rollout resume`",
            target.version,
        )
        self._say(target.version, "pinned")
        self._share()
        self._republish()
        return f"every proxy is pinned to {target.version}"

    def _rollback_target(self, version: str, plan: Plan) -> Snapshot:
        if version:
            matches = [v for v in self.good if v.startswith(version)]
            if len(matches) != 1:
                kept = ", ".join(reversed(self.good)) or "none yet"
                raise RolloutError(
                    f"version {version} cannot be rolled back to: only versions every proxy ACKed are kept "
                    f"(the newest {self.settings.keep_good}): {kept}"
                )
            return self.good[matches[0]]
        for found in reversed(self.good):
            if found != plan.fleet.version:
                return self.good[found]
        raise RolloutError("no earlier version every proxy ACKed is kept to roll back to")

    # -- replicas --------------------------------------------------------------------------

    def shared_state(self) -> dict[str, Any]:
        """This replica's decisions as the replicas share them (`meshctl.server.rollout_kv`)."""
        plan = self.plan
        return {
            "fleet": plan.fleet.version if plan is not None else "",
            "candidate": plan.candidate.version if plan is not None and plan.candidate is not None else "",
            "held": self.held,
            "held_by_operator": self.held_by_operator,
            "pinned": self.pinned,
            "pinned_inputs": self._pinned_inputs,
            "stage_started": self._stage_unix if plan is not None and plan.candidate is not None else 0.0,
        }

    def _share(self) -> None:
        """Write what this replica decided since the state it last read: a three-way merge, each
        field this replica changed taken from it, the others from what is there now."""
        if self.shared is None or not self._base_read:
            return  # nothing is written before the shared state was read once: it would be clobbered
        base, ours = dict(self._base), self.shared_state()

        def merge(theirs: dict[str, Any]) -> dict[str, Any]:
            return {k: ours[k] if ours[k] != base.get(k, _UNSET) else theirs.get(k, ours[k]) for k in ours}

        self.shared.change(merge)

    def adopt(self, state: dict[str, Any], reports: dict[str, dict[str, Any]], *, republish: bool = True) -> None:
        """The replicas' shared state changed (or this replica built a version it names)."""
        self._base = dict(state)
        self._base_read = True
        if self.shared is not None:
            reports = {k: v for k, v in reports.items() if k != self.shared.replica}
        self._reports = reports
        if not state:
            return
        fleet = self._recent.get(state.get("fleet", "")) or self.good.get(state.get("fleet", ""))
        if fleet is None:
            plan = self.plan
            if plan is None or plan.fleet.version != state.get("fleet"):
                if self._waiting_said != f"fleet {state.get('fleet')}":
                    self._waiting_said = f"fleet {state.get('fleet')}"
                    logger.warning(
                        "the replicas' fleet version %s was not built here (yet): this replica offers %s meanwhile",
                        state.get("fleet"), plan.fleet.version if plan else "nothing",
                    )  # fmt: skip
                return
            fleet = plan.fleet
        candidate = self._recent.get(state.get("candidate") or "")
        self.held = str(state.get("held", ""))
        self.held_by_operator = bool(state.get("held_by_operator", False))
        self.pinned = str(state.get("pinned", ""))
        self._pinned_inputs = str(state.get("pinned_inputs", ""))
        if candidate is not None:
            started = float(state.get("stage_started") or time.time())
            self._stage_unix = started
            self._stage_started = self._clock() - max(0.0, time.time() - started)
        old = self.plan
        self._set_plan(Plan(fleet, candidate, self.settings.canary))
        moved = old is None or old.fleet is not fleet or old.candidate is not candidate
        if candidate is not None:
            self._arm(max(0.0, self.settings.soak - (self._clock() - self._stage_started)))
        if moved and republish:
            self._republish()
        self.check()

    def _report(self, version: str, canaries: list[Stream]) -> list[dict[str, Any]] | None:
        """Report this replica's canaries of `version`; the other replicas' fresh reports of it,
        or None while one of them has not staged it or has a canary that has not ACKed it."""
        if self.shared is None:
            return []
        mine = {"candidate": version, "count": len(canaries), "settled": all(settled(s) for s in canaries)}
        if mine != self._reported:
            self._reported = mine
            self.shared.report(mine)
        self._refresh_report()
        now = time.time()
        fresh = [r for r in self._reports.values() if now - float(r.get("at", 0)) < REPORT_FRESH]
        if any(r.get("candidate") != version or not r.get("settled") for r in fresh):
            return None
        return [r for r in fresh if int(r.get("count", 0)) > 0]

    def _refresh_report(self) -> None:
        """Say this replica's report again every few seconds while a version is staged, so a
        report that stops coming is a replica gone."""
        if self._report_timer is not None or self._call_later is None:
            return

        def again() -> None:
            self._report_timer = None
            if self.candidate is not None and self.shared is not None:
                self.shared.report(self._reported)
                self.check()
                self._refresh_report()

        self._report_timer = self._call_later(REPORT_EVERY, again)


_UNSET: Final = object()


class RolloutError(Exception):
    """An operator's rollout action that cannot be done now; the message says why."""


def _holds(stream: Stream, version: str) -> bool:
    """Whether the stream is offered snapshot `version` and holds it ACKed (`settled`)."""
    resources = stream.connection.resources
    return resources is not None and resources.snapshot_version == version and settled(stream)


def settled(stream: Stream) -> bool:
    """Whether the stream has nothing left to send and every type sent is ACKed, none NACKed."""
    if stream.wake.is_set():
        return False  # resources changed and its pushes are not decided yet
    return stream.connection.settled()
