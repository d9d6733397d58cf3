"""Which proxies are canaries, and which snapshot each node is resolved in while a version is
staged (`meshctl.server.rollout` decides the plan; this is what the streams read of it).

The ADS servicer's generation thread reads the current `Plan` only: one immutable object, swapped
in one assignment on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from meshctl.errors import UsageError
from meshctl.snapshot.binding import bind_proxy
from meshctl.snapshot.model import Snapshot, build_snapshot
from meshctl.snapshot.node import ProxyNode
from meshctl.snapshot.proxy import Proxy

if TYPE_CHECKING:
    from meshctl.server.proxy_resources import Resolved

#: Versions every proxy ACKed that are kept for rollback.
DEFAULT_KEEP_GOOD: Final = 3


class PlanHolder(Protocol):
    """What holds the current plan (the rollout)."""

    plan: Plan | None


@dataclass(frozen=True, slots=True)
class CanarySelector:
    """Which proxies are canaries: workload labels all of which a proxy's labels must carry (as a
    Sidecar's `workloadSelector` writes them), or node ids (whole, or `NAME.NAMESPACE`)."""

    labels: Mapping[str, str] | None = None
    nodes: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> CanarySelector:
        """`app=reviews,version=v2` (labels) or `NODE_ID,NODE_ID` / `name.namespace` (proxies);
        raises UsageError saying what is wrong."""
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise UsageError("--canary needs labels (app=reviews,track=canary) or node ids")
        with_equals = [i for i in items if "=" in i and "~" not in i]
        if with_equals and len(with_equals) != len(items):
            raise UsageError(f"--canary {text!r} mixes labels and node ids: give one or the other")
        if with_equals:
            labels: dict[str, str] = {}
            for item in items:
                key, _, value = item.partition("=")
                if not key.strip():
                    raise UsageError(f"--canary {text!r}: label {item!r} has no key")
                labels[key.strip()] = value.strip()
            return cls(labels=labels)
        return cls(nodes=frozenset(items))

    def describe(self) -> str:
        if self.labels is not None:
            return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return ",".join(sorted(self.nodes))

    def matches_node(self, node: ProxyNode) -> bool | None:
        """Whether `node` is a canary by its id alone; None when its labels decide."""
        if self.labels is not None:
            return None
        short = node.id.split("~")[2] if node.id.count("~") == 3 else ""
        return node.id in self.nodes or short in self.nodes

    def matches(self, proxy: Proxy) -> bool:
        by_id = self.matches_node(proxy.node)
        if by_id is not None:
            return by_id
        assert self.labels is not None
        return all(proxy.labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    canary: CanarySelector | None = None
    #: Seconds the candidate must live on every canary, ACKed, before the fleet gets it.
    soak: float = 60.0
    #: Send endpoint-only changes through the stage too (by default they go to everyone at once).
    stage_endpoints: bool = False
    keep_good: int = DEFAULT_KEEP_GOOD


@dataclass(frozen=True, slots=True)
class Plan:
    """Which snapshot the fleet and the canaries are offered now."""

    fleet: Snapshot
    candidate: Snapshot | None = None
    selector: CanarySelector | None = None
    #: No canaries, nothing held or pinned: every proxy is offered the snapshot being published,
    #: the newest, as without a rollout (a stream that opens just after a snapshot is built, and
    #: before the history has recorded it, is not handed the one before).
    unstaged: bool = False


Resolver = Callable[[ProxyNode, Any], "Resolved"]


class RolloutSource:
    """The ADS servicer's config source with the rollout in between: each node is resolved in
    the snapshot its plan says (see the module docstring), whatever snapshot was published."""

    def __init__(self, resolve: Resolver, rollout: PlanHolder) -> None:
        self._resolve = resolve
        self._rollout = rollout

    def resolve(self, node: ProxyNode, state: Any) -> Resolved:
        plan = self._rollout.plan
        if plan is None or plan.unstaged:
            return self._resolve(node, state)
        if plan.candidate is not None and plan.selector is not None and is_canary(plan.selector, node, plan.candidate):
            return self._resolve(node, plan.candidate)
        return self._resolve(node, plan.fleet)


def is_canary(selector: CanarySelector, node: ProxyNode, snapshot: Snapshot) -> bool:
    by_id = selector.matches_node(node)
    if by_id is not None:
        return by_id
    try:
        return selector.matches(bind_proxy(node, snapshot))
    except Exception:  # a node that does not bind is no canary; resolving it says why
        return False


def with_endpoints(fleet: Snapshot, latest: Snapshot) -> Snapshot | None:
    """`fleet`'s config with `latest`'s endpoints, when only endpoints differ between their
    registries (the same service definitions); None when they differ in more."""
    if fleet.registry_digest != latest.registry_digest:
        return None
    if fleet.services is latest.services:
        return fleet
    return build_snapshot(fleet.configs, latest.services, fleet.mesh)
