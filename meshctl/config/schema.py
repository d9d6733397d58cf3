"""Istio YAML `spec` (plain data) to a typed protobuf message, with a field path for every error.

This follows protobuf's JSON mapping, which is how Istio itself reads YAML (camelCase or proto
field names, "5s" durations, enum names, wrapper types as bare values), but unlike
`json_format.ParseDict` it keeps going after the first problem and reports each one with the
exact path (`spec.http[0].route[0].weight`), so `meshctl validate` can point at the line.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any, Final, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation.envoy_limits import duration_limit_problem

M = TypeVar("M", bound=Message)

_WRAPPERS = frozenset(
    f"google.protobuf.{n}Value"
    for n in ("Bool", "Int32", "Int64", "UInt32", "UInt64", "Float", "Double", "String", "Bytes")
)
_JSON_VALUE_TYPES = frozenset(("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"))

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NANOS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}


def parse_duration(text: str) -> int | None:
    """A duration as Istio reads it, in nanoseconds: Go's `time.ParseDuration` syntax
    (`"5s"`, `"1.5s"`, `"250ms"`, `"1m30s"`, `"1h"`), which also covers protobuf JSON's `"5.000s"`.
    None when it is not a duration."""
    text = text.strip()
    sign = 1
    if text[:1] in "+-" and text:
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        return None
    total: int | Fraction = 0
    pos = 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            return None
        number = m.group(1)
        # Whole numbers ("5s", "30s": nearly every duration) need no Fraction; the sum is exact either way.
        total += (int(number) if number.isdecimal() else Fraction(number)) * _UNIT_NANOS[m.group(2)]
        pos = m.end()
    return sign * int(total)


@dataclass(frozen=True, slots=True)
class SchemaIssue:
    """A value that does not fit the schema: where it is and what is wrong."""

    path: FieldPath
    message: str


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


# --- scalars: one conversion function per field, chosen once --------------------------------

#: A scalar conversion: (True, the value to store) or (False, what is wrong with it).
_Convert = Callable[[Any], tuple[bool, Any]]


def _to_string(value: Any) -> tuple[bool, Any]:
    if isinstance(value, str):
        return True, value
    return False, f"expected a string, got {_type_name(value)}"


def _to_bool(value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool):
        return True, value
    return False, f"expected true or false, got {_type_name(value)}"


def _to_enum(enum: EnumDescriptor) -> _Convert:
    by_name = {v.name: v.number for v in enum.values}
    numbers = frozenset(enum.values_by_number)
    names = ", ".join(v.name for v in enum.values)

    def convert(value: Any) -> tuple[bool, Any]:
        if isinstance(value, str):
            number = by_name.get(value)
            if number is not None:
                return True, number
        elif isinstance(value, int) and not isinstance(value, bool) and value in numbers:
            return True, value
        return False, f'invalid value "{value}": must be one of {names}'

    return convert


def _to_integer(low: int, high: int) -> _Convert:
    def convert(value: Any) -> tuple[bool, Any]:
        number: int | None = None
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            try:
                number = int(value.strip(), 10)
            except ValueError:
                number = None
        if number is None:
            return False, f"expected an integer, got {_type_name(value)} {value!r}"
        if not low <= number <= high:
            return False, f"{number} is out of range [{low}, {high}]"
        return True, number

    return convert


def _to_float(value: Any) -> tuple[bool, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return False, "expected a finite number"
        return True, float(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return True, number
    return False, f"expected a number, got {_type_name(value)}"


def _to_bytes(value: Any) -> tuple[bool, Any]:
    if isinstance(value, str):
        try:
            return True, base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False, "expected base64 text"
    return False, f"expected base64 text, got {_type_name(value)}"


def _converter(fd: FieldDescriptor) -> _Convert:
    """How a value becomes what scalar field `fd` holds."""
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return _to_string
    if t == FieldDescriptor.TYPE_BOOL:
        return _to_bool
    if t == FieldDescriptor.TYPE_ENUM and fd.enum_type is not None:
        return _to_enum(fd.enum_type)
    if t in _INT_RANGES:
        return _to_integer(*_INT_RANGES[t])
    if t in _FLOATS:
        return _to_float
    if t == FieldDescriptor.TYPE_BYTES:
        return _to_bytes

    def unsupported(value: Any) -> tuple[bool, Any]:  # pragma: no cover - every scalar type is above
        return False, f"unsupported field type {t}"

    return unsupported


# --- messages: each message type's fields, worked out once ----------------------------------

# What a field holds decides how a value is read into it.
_SCALAR, _MESSAGE, _REPEATED_SCALAR, _REPEATED_MESSAGE, _MAP = range(5)
# Messages that protobuf JSON spells as something other than a mapping of their fields.
_PLAIN, _WRAPPER, _DURATION, _JSON_FORMAT = range(4)


@dataclass(frozen=True, slots=True)
class _Field:
    """One field as the parser needs it: descriptors are slow to ask (each attribute is a
    lookup in the C runtime), and a config of 10,000 resources asks about the same few hundred
    fields again and again."""

    name: str  # the attribute on the generated class
    kind: int
    oneof: str | None  # a real oneof, not the synthetic one of a proto3 `optional`
    convert: _Convert | None = None  # scalars and repeated scalars; a map's values (None: messages)
    convert_key: _Convert | None = None  # maps


@dataclass(frozen=True, slots=True)
class _Shape:
    """A message type as the parser needs it: its fields by JSON name and by proto name (both
    spellings are valid protobuf JSON), or how it is spelled when it is a well-known type."""

    name: str
    spelling: int
    fields: Mapping[str, _Field]


def _field(fd: FieldDescriptor) -> _Field:
    oneof = fd.containing_oneof
    synthetic = oneof is not None and len(oneof.fields) == 1 and oneof.name.startswith("_")
    oneof_name = oneof.name if oneof is not None and not synthetic else None
    message_type = fd.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        value_fd = message_type.fields_by_name["value"]
        convert = None if value_fd.message_type is not None else _converter(value_fd)
        return _Field(fd.name, _MAP, oneof_name, convert, _converter(message_type.fields_by_name["key"]))
    if fd.is_repeated:
        if message_type is not None:
            return _Field(fd.name, _REPEATED_MESSAGE, oneof_name)
        return _Field(fd.name, _REPEATED_SCALAR, oneof_name, _converter(fd))
    if message_type is not None:
        return _Field(fd.name, _MESSAGE, oneof_name)
    return _Field(fd.name, _SCALAR, oneof_name, _converter(fd))


@cache
def _shape(descriptor: Descriptor) -> _Shape:
    full_name = descriptor.full_name
    if full_name in _WRAPPERS:
        spelling = _WRAPPER
    elif full_name == "google.protobuf.Duration":
        spelling = _DURATION
    elif full_name in _JSON_VALUE_TYPES or full_name == "google.protobuf.Timestamp":
        spelling = _JSON_FORMAT
    else:
        spelling = _PLAIN
    fields: dict[str, _Field] = {}
    for fd in descriptor.fields:
        f = _field(fd)
        fields[fd.name] = f
        fields[fd.json_name] = f
    return _Shape(descriptor.name, spelling, fields)


#: Lists and maps that protobuf cannot tell apart from absent ones once parsed, but that Istio
#: refuses when written empty (Go keeps `from: []` as an empty, non-nil slice): checked here,
#: where the YAML is still at hand, with Istio's words.
_WRITTEN_EMPTY: Final[Mapping[tuple[str, str], str]] = {
    ("istio.security.v1beta1.Rule", "from"): "`from` must not be empty",
    ("istio.security.v1beta1.Rule", "to"): "`to` must not be empty",
    ("istio.security.v1beta1.PeerAuthentication", "port_level_mtls"): (
        "port level mTLS, if defined, must have at least one element"
    ),
}
#: Maps of messages whose null values Istio refuses (elsewhere null means unset).
_NULL_MAP_VALUE: Final[Mapping[tuple[str, str], str]] = {
    ("istio.networking.v1alpha3.HTTPMatchRequest", "headers"): "header match {key} cannot be null",
}


class _Parser:
    __slots__ = ("issues",)

    def __init__(self) -> None:
        self.issues: list[SchemaIssue] = []

    def fail(self, path: FieldPath, message: str) -> None:
        self.issues.append(SchemaIssue(path, message))

    def message(self, data: Any, msg: Message, path: FieldPath) -> None:
        shape = _shape(msg.DESCRIPTOR)
        if shape.spelling != _PLAIN:
            self.well_known(data, msg, path, shape.spelling)
            return
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping, got {_type_name(data)}")
            return
        # `trafficPolicy: {}` is written, so it is set (HasField), as in Istio: rules such as
        # "a selector needs labels" see it.
        msg.SetInParent()
        fields = shape.fields
        oneofs_seen: dict[str, str] = {}
        for key, value in data.items():
            # Only a text key can name a field: any other key is looked up in vain.
            f = fields.get(key)
            if f is None:
                self.fail((*path, str(key)), f'unknown field "{key}" in {shape.name}')
                continue
            if value is None:
                continue  # null means unset in protobuf JSON
            if not value and isinstance(value, (list, dict)):
                written_empty = _WRITTEN_EMPTY.get((msg.DESCRIPTOR.full_name, f.name))
                if written_empty is not None:
                    self.fail((*path, key), written_empty)
                    continue
            if f.oneof is not None:
                if f.oneof in oneofs_seen:
                    self.fail((*path, key), f'"{key}" cannot be set together with "{oneofs_seen[f.oneof]}"')
                    continue
                oneofs_seen[f.oneof] = key
            kind = f.kind
            if kind == _SCALAR:
                ok, converted = f.convert(value)  # type: ignore[misc]  # set for every scalar field
                if ok:
                    setattr(msg, f.name, converted)
                else:
                    self.fail((*path, key), converted)
            elif kind == _MESSAGE:
                self.message(value, getattr(msg, f.name), (*path, key))
            elif kind == _MAP:
                null_value = _NULL_MAP_VALUE.get((msg.DESCRIPTOR.full_name, f.name))
                self.map_field(value, getattr(msg, f.name), f, (*path, key), null_value)
            elif not isinstance(value, list):
                self.fail((*path, key), f"expected a list, got {_type_name(value)}")
            elif kind == _REPEATED_MESSAGE:
                container = getattr(msg, f.name)
                for i, item in enumerate(value):
                    if item is None:
                        self.fail((*path, key, i), "list item is null")
                        continue
                    self.message(item, container.add(), (*path, key, i))
            else:
                container = getattr(msg, f.name)
                for i, item in enumerate(value):
                    ok, converted = f.convert(item)  # type: ignore[misc]  # set for every repeated scalar
                    if ok:
                        container.append(converted)
                    else:
                        self.fail((*path, key, i), converted)

    def map_field(self, value: Any, container: Any, f: _Field, path: FieldPath, null_value: str | None = None) -> None:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_type_name(value)}")
            return
        convert_key, convert = f.convert_key, f.convert
        assert convert_key is not None  # set for every map field
        for raw_key, item in value.items():
            item_path = (*path, str(raw_key))
            ok, key = convert_key(raw_key if isinstance(raw_key, str) else str(raw_key))
            if not ok:
                self.fail(item_path, key)
                continue
            if convert is None:
                if item is None:
                    if null_value is not None:
                        self.fail(item_path, null_value.format(key=raw_key))
                    continue
                self.message(item, container[key], item_path)
            else:
                if item is None:
                    self.fail(item_path, "map value is null")
                    continue
                ok, converted = convert(item)
                if ok:
                    container[key] = converted
                else:
                    self.fail(item_path, converted)

    def well_known(self, data: Any, msg: Message, path: FieldPath, spelling: int) -> None:
        if spelling == _WRAPPER:
            f = _shape(msg.DESCRIPTOR).fields["value"]
            ok, converted = f.convert(data)  # type: ignore[misc]  # a wrapper's value is a scalar
            if ok:
                msg.value = converted  # type: ignore[attr-defined]
            else:
                self.fail(path, converted)
            return
        if spelling == _DURATION:
            if not isinstance(data, str):
                self.fail(path, f'expected a duration such as "5s" or "0.250s", got {_type_name(data)}')
                return
            nanos = parse_duration(data)
            if nanos is None:
                self.fail(path, f'invalid duration "{data}": use a number and a unit, e.g. "5s", "250ms", "1m", "1h"')
                return
            seconds, rest = divmod(abs(nanos), 1_000_000_000)
            sign = -1 if nanos < 0 else 1
            # Every duration of a resource ends up in Envoy, which holds less than protobuf can.
            too_long = duration_limit_problem(nanos, data)
            if too_long is not None:
                self.fail(path, too_long)
                return
            msg.seconds = sign * seconds  # type: ignore[attr-defined]
            msg.nanos = sign * rest  # type: ignore[attr-defined]
            return
        try:
            json_format.ParseDict(data, msg)
        except json_format.ParseError as exc:
            self.fail(path, str(exc))


def parse_spec(data: Any, cls: type[M], path: FieldPath = ("spec",)) -> tuple[M, list[SchemaIssue]]:
    """Build a `cls` from plain data; returns the message (partly filled on errors) and the issues."""
    msg = cls()
    parser = _Parser()
    if data is None:
        return msg, []
    parser.message(data, msg, path)
    return msg, parser.issues
