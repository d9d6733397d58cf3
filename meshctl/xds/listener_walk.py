"""Walking generated listeners: the stages that rework a proxy's listeners after they are built
(access logs, tracing, wasm plugins) each visit every filter chain, the default one included, and
rewrite the connection managers they find in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


def filter_chains(listener: listener_pb2.Listener) -> list[listener_components_pb2.FilterChain]:
    """Every filter chain of `listener`, its default chain last: the listener's own messages, so
    a change to one is a change to the listener."""
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    return chains


def rewrite_filters(listeners: Iterable[Any], cls: type[M], change: Callable[[M], None]) -> None:
    """Apply `change` to every network filter of `listeners` whose typed config is a `cls`,
    unpacked and packed again (deterministically, so equal configs keep equal bytes)."""
    for listener in listeners:
        for chain in filter_chains(listener):
            for network_filter in chain.filters:
                if not network_filter.typed_config.Is(cls.DESCRIPTOR):
                    continue
                config = cls()
                network_filter.typed_config.Unpack(config)
                change(config)
                network_filter.typed_config.Pack(config, deterministic=True)
