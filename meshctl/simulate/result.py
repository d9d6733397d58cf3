"""The answer of a simulation: each step Envoy took, the action, the upstreams, and the outcome.

A step Envoy never reached is None, so the answer shows where the request stopped. `routed`
says whether Envoy forwards the request or answers it as configured (a redirect, a direct
response): the CLI's exit status 0. Anything else (a refused connection, a 404, a 503, Istio's
BlackHoleCluster) is an answer the configuration did not mean to give, exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the client gets: an HTTP status (None when the connection is refused or proxied as
    TCP), Envoy's response flag (`NR`, `NC`, `UH`; empty when none), and why, in words."""

    status: int | None
    flag: str
    reason: str
    routed: bool


@dataclass(frozen=True, slots=True)
class Source:
    """The Istio resource a route or cluster was generated from, and where it was read."""

    kind: str
    namespace: str
    name: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = f" ({self.file}:{self.line})" if self.file else ""
        return f"{self.kind} {self.namespace}/{self.name}{where}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str
    locality: str
    priority: int
    weight: int
    health: str
    tls: str


@dataclass(frozen=True, slots=True)
class Upstream:
    """One cluster the request may go to, with its share of the traffic (100 for a single one)."""

    name: str
    weight: int
    found: bool
    type: str = ""
    tls: str = ""
    endpoints: tuple[Endpoint, ...] = ()
    source: Source | None = None


@dataclass(frozen=True, slots=True)
class Simulation:
    """Every step of the walk; a step not reached is None."""

    request: dict[str, Any]
    proxy: str
    outcome: Outcome
    listener: str | None = None
    filter_chain: str | None = None
    route_config: str | None = None
    virtual_host: str | None = None
    route_name: str | None = None
    route_match: str | None = None
    source: Source | None = None
    action: dict[str, Any] | None = None
    clusters: tuple[Upstream, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The `-o json` form: one object, keys in the order Envoy takes the steps."""
        route = None if self.route_match is None else {"name": self.route_name or "", "match": self.route_match}
        return {
            "request": self.request,
            "proxy": self.proxy,
            "listener": self.listener,
            "filter_chain": self.filter_chain,
            "route_config": self.route_config,
            "virtual_host": self.virtual_host,
            "route": route,
            "source": _source_dict(self.source),
            "action": self.action,
            "clusters": [_upstream_dict(u) for u in self.clusters],
            "outcome": {
                "status": self.outcome.status,
                "flag": self.outcome.flag,
                "reason": self.outcome.reason,
                "routed": self.outcome.routed,
            },
            "notes": list(self.notes),
        }


def _source_dict(source: Source | None) -> dict[str, Any] | None:
    if source is None:
        return None
    return {
        "kind": source.kind,
        "namespace": source.namespace,
        "name": source.name,
        "file": source.file,
        "line": source.line,
    }


def _upstream_dict(upstream: Upstream) -> dict[str, Any]:
    return {
        "name": upstream.name,
        "weight": upstream.weight,
        "found": upstream.found,
        "type": upstream.type,
        "tls": upstream.tls,
        "source": _source_dict(upstream.source),
        "endpoints": [
            {
                "address": e.address,
                "locality": e.locality,
                "priority": e.priority,
                "weight": e.weight,
                "health": e.health,
                "tls": e.tls,
            }
            for e in upstream.endpoints
        ],
    }
