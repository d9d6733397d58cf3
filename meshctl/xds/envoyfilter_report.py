"""EnvoyFilters that select a proxy but whose patches change nothing in its config.

Whether a patch matches depends on the proxy's generated config, so validation cannot tell (a
listener on port 9080 exists only where a service has that port). Istio has no analyzer code for
it: pilot counts such a patch in a metric. meshctl says it in words: `serve` logs it once per
EnvoyFilter (as it is now) and kind of proxy (sidecar, gateway), `meshctl dump` prints it as a
note for the proxy dumped.

An EnvoyFilter is tested alone against the proxy's unpatched config (its WasmPlugins included,
which patches may match): "matched nothing" is "applied alone, it changes nothing". An
EnvoyFilter none of whose patches applies to the proxy at all (a `proxyVersion` or `metadata`
match that rules it out) is not reported: it does not apply, rather than match nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace

from google.protobuf.message import Message

from meshctl.config.model import Config
from meshctl.snapshot.proxy import Proxy
from meshctl.xds.envoyfilter import apply_envoy_filters
from meshctl.xds.envoyfilter_match import compile_patches
from meshctl.xds.wasm import apply_wasm_plugins

Generated = Mapping[str, tuple[Message, ...]]


def _unchanged(base: Generated, patched: Generated) -> bool:
    """Whether patching changed nothing: the patcher keeps the tuples of the types it does not
    touch and the messages it leaves alone (but for listeners, always copied), so identity
    answers most, and message equality the rest."""
    for t, before in base.items():
        after = patched[t]
        if after is before:
            continue
        if len(after) != len(before) or any(a is not b and a != b for a, b in zip(after, before, strict=True)):
            return False
    return True


def unmatched_envoy_filters(
    config: Generated, proxy: Proxy, skip: frozenset[object] = frozenset(), finished: Generated | None = None
) -> list[Config]:
    """The EnvoyFilters of `proxy` that change nothing in `config`, its unpatched config (before
    its WasmPlugins too), each applied alone; `skip` names (key, digest) pairs not to test.
    `finished`, the proxy's whole patched config when the caller has it, spares patching again
    for a proxy with one EnvoyFilter (the common case): that is the filter applied alone."""
    base = apply_wasm_plugins(config, proxy)
    out = []
    for envoy_filter in proxy.envoy_filters:
        if (envoy_filter.key, envoy_filter.content_digest()) in skip:
            continue
        if not compile_patches((envoy_filter,), proxy.node.proxy_version, proxy.node.metadata):
            continue
        if finished is not None and len(proxy.envoy_filters) == 1:
            patched = finished
        else:
            patched = apply_envoy_filters(base, replace(proxy, envoy_filters=(envoy_filter,)))
        if _unchanged(base, patched):
            out.append(envoy_filter)
    return out


def unmatched_message(envoy_filter: Config, proxy: Proxy) -> str:
    return (
        f"{envoy_filter.source}: EnvoyFilter {envoy_filter.namespace}/{envoy_filter.name} selects "
        f"{proxy.type.value} proxy {proxy.id} but none of its patches matched anything in its config"
    )


class UnmatchedFilters:
    """What a server has said of unmatched EnvoyFilters: each once per filter content and kind
    of proxy, so a fleet of alike proxies gives one line, and a changed filter is said again."""

    def __init__(self) -> None:
        self._said: set[tuple[object, str, str]] = set()
        self._lock = threading.Lock()

    def new_messages(self, config: Generated, proxy: Proxy, finished: Generated | None = None) -> list[str]:
        """What is new to say of the proxy's EnvoyFilters, given its unpatched `config` (and its
        `finished` config, when made: see `unmatched_envoy_filters`)."""
        return self.say(unmatched_envoy_filters(config, proxy, self.said(proxy), finished), proxy)

    def said(self, proxy: Proxy) -> frozenset[tuple[object, str]]:
        """The filters (key, digest) already said to match nothing for the proxy's kind."""
        kind = proxy.type.value
        with self._lock:
            return frozenset((k, d) for k, d, t in self._said if t == kind)

    def say(self, unmatched: list[Config], proxy: Proxy) -> list[str]:
        """The messages for those of `unmatched` (found to match nothing in the proxy's config)
        not said yet for its kind of proxy."""
        kind = proxy.type.value
        out = []
        for envoy_filter in unmatched:
            said = (envoy_filter.key, envoy_filter.content_digest(), kind)
            with self._lock:
                if said in self._said:
                    continue
                self._said.add(said)
            out.append(unmatched_message(envoy_filter, proxy))
        return out
