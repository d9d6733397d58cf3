"""EnvoyFilters and WasmPlugins applied to a proxy's config, part by part: each generated part
finished once per its resource sets and what of the patches applies to it (`envoyfilter_parts`),
so the proxies that share an outbound part share its patching. Apart from the cache, whose
module says how the parts are shared; this one, how a patched config is made of them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import MappingProxyType

from meshctl.server.cache_parts import Part
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types
from meshctl.xds.envoyfilter_parts import (
    FilterId,
    PatchPlan,
    added,
    finish_part,
    part_key,
    patch_plan,
    unmatched_filters,
)
from meshctl.xds.envoyfilter_report import UnmatchedFilters
from meshctl.xds.memo import GenerationMemo
from meshctl.xds.names import eds_cluster_names
from meshctl.xds.resources import ResourceSet, to_resource

logger = logging.getLogger("meshctl.server.cache")

_CONFIG_TYPES = (types.CLUSTER, types.LISTENER, types.ROUTE)


class Patches:
    """Finished parts, shared under the cache's lock; `set_of` and `join` are the cache's
    (interned sets, and two parts' sets joined once)."""

    def __init__(
        self,
        lock: threading.Lock,
        set_of: Callable[..., ResourceSet],
        join: Callable[[str, ResourceSet, ResourceSet], ResourceSet],
    ) -> None:
        self._lock = lock
        self._set = set_of
        self._join = join
        #: finished parts by the ids of their unpatched sets (held by the entry) and `part_key`,
        #: with the filters that change something in them
        self._memo: GenerationMemo[tuple[object, ...], tuple[tuple[ResourceSet, ...], Part, frozenset[FilterId]]] = (
            GenerationMemo()
        )
        #: EnvoyFilters said to match nothing, once per filter and kind of proxy
        self._unmatched = UnmatchedFilters()
        #: parts patched, and the resources decoded to patch them
        self.parts = 0
        self.resources = 0

    def advance(self) -> None:
        """A new config version: what the last two did not ask for goes."""
        self._memo.advance()

    def patched(self, outbound: Part, inbound: Part, joined: Part, proxy: Proxy) -> Part:
        """The joined config with the proxy's WasmPlugins and EnvoyFilters applied: each part
        finished once per its sets and the plan's key (`envoyfilter_parts`), so the proxies
        that share an outbound part share its patching, then the ADDs on the joined names. Where
        the parts cannot be finished apart (a patch renames, or the parts share a name), the
        joined config is one part."""
        plan = patch_plan(proxy)
        if plan is None:
            return joined
        split = plan.splits and all(
            len(joined.by_type[t]) == len(outbound.by_type[t]) + len(inbound.by_type[t]) for t in _CONFIG_TYPES
        )
        if split:
            (out, out_changed), (into, in_changed) = self._finished(outbound, plan), self._finished(inbound, plan)
            by_type = {t: self._join(t, out.by_type[t], into.by_type[t]) for t in _CONFIG_TYPES}
            eds = set(out.eds_names) | set(into.eds_names)
            changed = out_changed | in_changed
        else:
            whole, changed = self._finished(joined, plan)
            by_type, eds = dict(whole.by_type), set(whole.eds_names)
        for t, messages in added(plan, by_type).items():
            by_type[t] = self._set(t, [*by_type[t].ordered, *(to_resource(m, t) for m in messages)])
            if t == types.CLUSTER:
                eds.update(eds_cluster_names(messages))
        if plan.filters:
            names_before = {t: joined.by_type[t].keys() for t in _CONFIG_TYPES}
            unmatched = unmatched_filters(plan, changed, names_before, self._unmatched.said(proxy))
            for message in self._unmatched.say(unmatched, proxy):
                logger.warning("%s", message)
        return Part(MappingProxyType(by_type), tuple(sorted(eds)))

    def _finished(self, part: Part, plan: PatchPlan) -> tuple[Part, frozenset[FilterId]]:
        """`part` finished (`finish_part`), once per its sets and `part_key`; and the filters
        that change something in it."""
        sets = tuple(part.by_type[t] for t in _CONFIG_TYPES)

        def finish(_key: object) -> tuple[tuple[ResourceSet, ...], Part, frozenset[FilterId]]:
            done = finish_part({t: part.by_type[t].ordered for t in _CONFIG_TYPES}, part.eds_names, plan)
            with self._lock:
                self.parts += 1
                self.resources += done.decoded
            by_type = dict(zip(_CONFIG_TYPES, sets, strict=True))
            by_type |= {t: self._set(t, made) for t, made in done.by_type.items()}
            return sets, Part(MappingProxyType(by_type), done.eds_names), done.changed_by

        key = (tuple(id(s) for s in sets), part_key(plan, part.by_type[types.CLUSTER]))
        _, finished, changed = self._memo.get(key, finish)
        return finished, changed
