"""EnvoyFilter patch values as the Envoy messages they patch.

An EnvoyFilter's `patch.value` is free-form JSON that Istio reads into the Envoy type its `applyTo`
names (a Listener, an HttpFilter, a Cluster, ...) with protobuf's JSON mapping, `@type` naming the
type of every `google.protobuf.Any` inside (a filter's `typed_config`). The validator and the
patcher both read values through `parse_value`, so what `validate` accepts is what is applied.

The xds-protos modules register their types only once imported, and an `@type` may name any of
Envoy's hundreds of extension types: before parsing, every `@type` in the value has its proto
package imported (`_import_types`), so the JSON parser can resolve it. A type no package holds is
an error naming it, as in Istio.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from functools import cache
from typing import Any, Final

from google.protobuf import descriptor_pool, json_format, struct_pb2
from google.protobuf.message import Message

#: applyTo (its enum name) -> (module, message) of the Envoy type its patch value is.
_TARGETS: Final = {
    "LISTENER": ("envoy.config.listener.v3.listener_pb2", "Listener"),
    "FILTER_CHAIN": ("envoy.config.listener.v3.listener_components_pb2", "FilterChain"),
    "NETWORK_FILTER": ("envoy.config.listener.v3.listener_components_pb2", "Filter"),
    "LISTENER_FILTER": ("envoy.config.listener.v3.listener_components_pb2", "ListenerFilter"),
    "HTTP_FILTER": (
        "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2",
        "HttpFilter",
    ),
    "ROUTE_CONFIGURATION": ("envoy.config.route.v3.route_pb2", "RouteConfiguration"),
    "VIRTUAL_HOST": ("envoy.config.route.v3.route_components_pb2", "VirtualHost"),
    "HTTP_ROUTE": ("envoy.config.route.v3.route_components_pb2", "Route"),
    "CLUSTER": ("envoy.config.cluster.v3.cluster_pb2", "Cluster"),
    "BOOTSTRAP": ("envoy.config.bootstrap.v3.bootstrap_pb2", "Bootstrap"),
}


def target_type(apply_to: str) -> type[Message] | None:
    """The Envoy message class a patch of `apply_to` holds; None for an applyTo with none here."""
    target = _TARGETS.get(apply_to)
    if target is None:
        return None
    cls: type[Message] = getattr(importlib.import_module(target[0]), target[1])
    return cls


def _type_urls(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "@type" and isinstance(value, str):
                yield value
            else:
                yield from _type_urls(value)
    elif isinstance(data, list):
        for item in data:
            yield from _type_urls(item)


@cache
def _import_package(package: str) -> bool:
    """Import every generated module of a proto package (`envoy.extensions.filters.http.lua.v3`),
    which registers its types; False when there is no such package. Only names that look like
    a protobuf package are tried, and only packages of the installed protos can load."""
    if not package or not all(part.isidentifier() for part in package.split(".")):
        return False
    try:
        module = importlib.import_module(package)
    except ImportError:
        return False
    path = getattr(module, "__path__", None)
    if path is None:
        return False
    for info in pkgutil.iter_modules(path):
        if info.name.endswith("_pb2"):
            try:
                importlib.import_module(f"{package}.{info.name}")
            except ImportError:
                continue
    return True


def _known(full_name: str) -> bool:
    try:
        descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError:
        return False
    return True


def _import_types(data: Any) -> str | None:
    """Import the packages of every `@type` in `data`; the first type no package defines, if any."""
    for url in _type_urls(data):
        full_name = url.rpartition("/")[2]
        if _known(full_name):
            continue
        _import_package(full_name.rpartition(".")[0])
        if not _known(full_name):
            return url
    return None


def parse_value(apply_to: str, value: struct_pb2.Struct | dict[str, Any]) -> Message:
    """The patch value as its Envoy type; ValueError saying what does not fit (unknown field,
    wrong type, an `@type` no Envoy type has)."""
    cls = target_type(apply_to)
    if cls is None:
        raise ValueError(f"applyTo {apply_to} has no Envoy type meshctl patches")
    data = json_format.MessageToDict(value) if isinstance(value, struct_pb2.Struct) else value
    unknown = _import_types(data)
    if unknown is not None:
        raise ValueError(f"unknown @type {unknown!r}: no Envoy type of that name")
    message = cls()
    try:
        json_format.ParseDict(data, message)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ValueError(f"does not parse as {cls.DESCRIPTOR.full_name}: {_short(str(exc))}") from None
    return message


def _short(text: str) -> str:
    text = text.split("\n", 1)[0].strip()  # protobuf adds a list of every field on a new line
    return text if len(text) <= 300 else text[:297] + "..."


def deprecated_fields(message: Message, limit: int = 10) -> list[str]:
    """The deprecated fields a patch value sets (`envoy.extensions.filters.http.lua.v3.Lua.inline_code`),
    `google.protobuf.Any` contents included: Envoy logs a warning for each and will drop them."""
    from google.protobuf import message_factory

    found: list[str] = []

    def walk(msg: Message, depth: int) -> None:
        if depth > 64 or len(found) >= limit:
            return
        if msg.DESCRIPTOR.full_name == "google.protobuf.Any":
            url: str = msg.type_url  # type: ignore[attr-defined]
            try:
                descriptor = descriptor_pool.Default().FindMessageTypeByName(url.rpartition("/")[2])
            except KeyError:
                return
            inner = message_factory.GetMessageClass(descriptor)()
            inner.ParseFromString(msg.value)  # type: ignore[attr-defined]
            walk(inner, depth + 1)
            return
        for fd, value in msg.ListFields():
            if fd.GetOptions().deprecated:
                found.append(fd.full_name)
            if fd.message_type is None or fd.message_type.GetOptions().map_entry:
                continue
            for item in value if fd.is_repeated else (value,):
                walk(item, depth + 1)

    walk(message, 0)
    return found
