"""Snapshot content as `Ref`s for generation views: a config or a merged DestinationRule named by
the content digests of what it is made of, so two snapshots that hold the same content give equal
views (and share what was generated from them) whichever objects hold it."""

from __future__ import annotations

from meshctl.config.model import Config
from meshctl.snapshot.scope import MergedDestinationRule, ProxyScope, rule_digest
from meshctl.xds.memo import Ref


def config_ref(config: Config) -> Ref[Config]:
    """A config named by its key and content."""
    return Ref((config.key, config.content_digest()), config)


def destination_rule_ref(scope: ProxyScope, hostname: str) -> Ref[MergedDestinationRule] | None:
    """The DestinationRule that applies to `hostname` for the scope's proxy, named by what it is
    merged from (its host, namespace and sources with their content digests)."""
    rule = scope.destination_rule(hostname)
    if rule is None:
        return None
    return Ref(rule_digest(scope.snapshot, rule), rule)
