"""WasmPlugins as Envoy wasm filters in a proxy's listeners, placed as Istio places them.

Istio sends each plugin as an ECDS resource that the listener names; meshctl serves no ECDS, so
the filter is written inline where Istio's reference would be: an HTTP plugin as an
`envoy.filters.http.wasm` filter in each matching HTTP connection manager, a NETWORK plugin as
an `envoy.filters.network.wasm` filter in each matching filter chain. Envoy runs the same
module with the same configuration either way; the difference is that a plugin change is a
listener update (Envoy drains the listener's old connections into the new config) rather than
an ECDS update in place.

Placement in an HTTP filter chain follows Istio's `PopAppendHTTP` order: AUTHN plugins before
the authentication filters (jwt_authn), AUTHZ plugins after them and before the authorization
filters (RBAC), STATS plugins and then the phase-less ones after those, before the rest of the
chain (grpc_stats, fault, cors, the router). Within a phase, the order of `select_wasm_plugins`
(descending priority). In a network filter chain, the same phases around network RBAC, before
the terminal filter.

Which listeners: `match[].mode` CLIENT is outbound traffic and everything of a gateway, SERVER is
inbound, CLIENT_AND_SERVER (or no mode) both; `match[].ports` the destination port (a filter
chain's `destination_port`, else the listener's own port). No `match` means all traffic.

The module is `file://` only (the loader refuses downloads): its path is read by the proxy, on
its own host. `pluginConfig` reaches the plugin as a JSON string (a `google.protobuf.StringValue`,
as Istio sends it), `vmConfig.env` as the VM's environment, `failStrategy` as the failure policy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.wasm.v3 import wasm_pb2 as network_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from google.protobuf import json_format, wrappers_pb2
from google.protobuf.message import Message

from meshctl.api.extensions.v1alpha1 import wasm_pb2 as istio_wasm_pb2
from meshctl.config.model import Config, ConfigKey
from meshctl.snapshot.model import spec
from meshctl.snapshot.node import ProxyType
from meshctl.snapshot.proxy import Proxy
from meshctl.xds import types
from meshctl.xds.listener_filters import HCM, typed
from meshctl.xds.listener_walk import filter_chains

Generated = Mapping[str, tuple[Message, ...]]
W = istio_wasm_pb2

#: The runtime meshctl asks for: the one upstream Envoy builds ship (see docs/wasm.md).
V8: Final = "envoy.wasm.runtime.v8"
#: Filters of the authentication and authorization blocks, by chain kind.
_AUTHN: Final = frozenset({"envoy.filters.http.jwt_authn", "istio_authn"})
_AUTHZ: Final = frozenset({"envoy.filters.http.rbac", "envoy.filters.http.ext_authz", "envoy.filters.network.rbac"})
_PHASES: Final = (W.AUTHN, W.AUTHZ, W.STATS, W.UNSPECIFIED_PHASE)
_FAILURE: Final = {
    W.FAIL_CLOSE: wasm_pb2.FAIL_CLOSED,
    W.FAIL_OPEN: wasm_pb2.FAIL_OPEN,
    W.FAIL_RELOAD: wasm_pb2.FAIL_RELOAD,
}
_CLIENT, _SERVER = W.CLIENT, W.SERVER


def module_path(url: str) -> str:
    """The local path a `file://` url names."""
    return url.removeprefix("file://")


def _json(value: Any) -> Any:
    """A Struct's values as protojson writes them: whole numbers without a fraction."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def plugin_config(config: Config) -> wasm_pb2.PluginConfig:
    """The Envoy plugin config of one WasmPlugin (shared by its HTTP and network forms)."""
    plugin: Any = spec(config)
    env = wasm_pb2.EnvironmentVariables()
    for var in plugin.vm_config.env:
        if var.value_from == W.HOST:
            env.host_env_keys.append(var.name)
        else:
            env.key_values[var.name] = var.value
    vm = wasm_pb2.VmConfig(
        runtime=V8,
        code=base_pb2.AsyncDataSource(local=base_pb2.DataSource(filename=module_path(plugin.url))),
    )
    if env.host_env_keys or env.key_values:
        vm.environment_variables.CopyFrom(env)
    out = wasm_pb2.PluginConfig(
        name=f"{config.namespace}.{config.name}",
        root_id=plugin.plugin_name,
        vm_config=vm,
        failure_policy=_FAILURE.get(plugin.fail_strategy, wasm_pb2.FAIL_CLOSED),
    )
    if plugin.HasField("plugin_config") and plugin.plugin_config.fields:
        text = json.dumps(_json(json_format.MessageToDict(plugin.plugin_config)), separators=(",", ":"), sort_keys=True)
        out.configuration.CopyFrom(typed(wrappers_pb2.StringValue(value=text)))
    return out


def _is_network(config: Config) -> bool:
    return bool(spec(config).type == W.NETWORK)


def _matches(config: Config, mode: int, port: int) -> bool:
    """Whether a plugin runs on traffic of `mode` (CLIENT or SERVER) to `port`."""
    selectors = spec(config).match
    if not selectors:
        return True
    for selector in selectors:
        if selector.mode not in (W.UNDEFINED, W.CLIENT_AND_SERVER, mode):
            continue
        if not selector.ports or any(p.number == port for p in selector.ports):
            return True
    return False


def _placed(items: list[Any], plugins: Sequence[tuple[int, Any]]) -> list[Any]:
    """`items` (a filter list) with the plugin filters, each given with its phase, in their
    phases' places (see the module docstring); `plugins` in run order within a phase."""
    by_phase = {phase: [f for p, f in plugins if p == phase] for phase in _PHASES}
    pending = list(_PHASES)
    out: list[Any] = []

    def flush(upto: int) -> None:
        while pending and _PHASES.index(pending[0]) <= upto:
            out.extend(by_phase[pending.pop(0)])

    for item in items:
        if item.name in _AUTHN:
            flush(_PHASES.index(W.AUTHN))
        elif item.name in _AUTHZ:
            flush(_PHASES.index(W.AUTHZ))
        else:
            flush(len(_PHASES))
        out.append(item)
    flush(len(_PHASES))
    return out


def _port(listener: Any, chain: Any) -> int:
    if chain.filter_chain_match.HasField("destination_port"):
        return int(chain.filter_chain_match.destination_port.value)
    return int(listener.address.socket_address.port_value)


def _chain(chain: Any, wanted: Sequence[Config], filters: Mapping[ConfigKey, Any]) -> None:
    """Add the `wanted` plugins' `filters` (by config key) to one filter chain, in place."""
    network = [(spec(c).phase, filters[c.key]) for c in wanted if _is_network(c)]
    http = [(spec(c).phase, filters[c.key]) for c in wanted if not _is_network(c)]
    if network:
        placed = _placed(list(chain.filters), network)
        del chain.filters[:]
        chain.filters.extend(placed)
    if not http:
        return
    for f in chain.filters:
        if f.name == HCM and f.typed_config.type_url.endswith(".HttpConnectionManager"):
            hcm = hcm_pb2.HttpConnectionManager.FromString(f.typed_config.value)
            kept = _placed(list(hcm.http_filters), http)
            del hcm.http_filters[:]
            hcm.http_filters.extend(kept)
            f.typed_config.Pack(hcm, deterministic=True)


def _filter(config: Config) -> Message:
    """The plugin's Envoy filter, named `NAMESPACE.NAME` as Istio names it."""
    name = f"{config.namespace}.{config.name}"
    out: Message
    if _is_network(config):
        network = network_wasm_pb2.Wasm(config=plugin_config(config))
        out = listener_components_pb2.Filter(name=name, typed_config=typed(network))
    else:
        out = hcm_pb2.HttpFilter(name=name, typed_config=typed(http_wasm_pb2.Wasm(config=plugin_config(config))))
    return out


def apply_wasm_plugins(config: Generated, proxy: Proxy) -> Generated:
    """`config` with the proxy's WasmPlugins in its listeners (the same object when none applies;
    a listener no plugin matches is kept as it was, not copied)."""
    if not proxy.wasm_plugins:
        return config
    filters = {c.key: _filter(c) for c in proxy.wasm_plugins}
    gateway = proxy.type is ProxyType.ROUTER
    listeners = []
    for original in config[types.LISTENER]:
        source: Any = original
        inbound = not gateway and source.traffic_direction == base_pb2.TrafficDirection.INBOUND
        mode = _SERVER if inbound else _CLIENT
        chains = filter_chains(source)
        wanted = [[c for c in proxy.wasm_plugins if _matches(c, mode, _port(source, ch))] for ch in chains]
        if not any(wanted):
            listeners.append(original)
            continue
        listener: Any = type(original)()
        listener.CopyFrom(original)
        copies = filter_chains(listener)
        for chain, plugins in zip(copies, wanted, strict=True):
            if plugins:
                _chain(chain, plugins, filters)
        listeners.append(listener)
    out = dict(config)
    out[types.LISTENER] = tuple(listeners)
    return MappingProxyType(out)
