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
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from meshctl.config.findings import FieldPath

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
_MAX_DURATION_SECONDS = 315_576_000_000  # protobuf Duration's range


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
    total = Fraction(0)
    pos = 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            return None
        total += Fraction(m.group(1)) * _UNIT_NANOS[m.group(2)]
        pos = m.end()
    return sign * int(total)


@dataclass(frozen=True, slots=True)
class SchemaIssue:
    """A value that does not fit the schema: where it is and what is wrong."""

    path: FieldPath
    message: str


@cache
def _fields(descriptor: Descriptor) -> Mapping[str, FieldDescriptor]:
    """Fields by JSON name and by proto name: both spellings are valid protobuf JSON."""
    out: dict[str, FieldDescriptor] = {}
    for f in descriptor.fields:
        out[f.name] = f
        out[f.json_name] = f
    return out


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


class _Parser:
    __slots__ = ("issues",)

    def __init__(self) -> None:
        self.issues: list[SchemaIssue] = []

    def fail(self, path: FieldPath, message: str) -> None:
        self.issues.append(SchemaIssue(path, message))

    def message(self, data: Any, msg: Message, path: FieldPath) -> None:
        full_name = msg.DESCRIPTOR.full_name
        if (
            full_name in _WRAPPERS
            or full_name in _JSON_VALUE_TYPES
            or full_name
            in (
                "google.protobuf.Duration",
                "google.protobuf.Timestamp",
            )
        ):
            self.well_known(data, msg, path)
            return
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping, got {_type_name(data)}")
            return
        # `trafficPolicy: {}` is written, so it is set (HasField), as in Istio: rules such as
        # "a selector needs labels" see it.
        msg.SetInParent()
        fields = _fields(msg.DESCRIPTOR)
        oneofs_seen: dict[str, str] = {}
        for key, value in data.items():
            field_path = (*path, str(key))
            fd = fields.get(key) if isinstance(key, str) else None
            if fd is None:
                self.fail(field_path, f'unknown field "{key}" in {msg.DESCRIPTOR.name}')
                continue
            if value is None:
                continue  # null means unset in protobuf JSON
            oneof = fd.containing_oneof
            if oneof is not None and not (len(oneof.fields) == 1 and oneof.name.startswith("_")):
                if oneof.name in oneofs_seen:
                    self.fail(field_path, f'"{key}" cannot be set together with "{oneofs_seen[oneof.name]}"')
                    continue
                oneofs_seen[oneof.name] = str(key)
            self.field(value, msg, fd, field_path)

    def field(self, value: Any, msg: Message, fd: FieldDescriptor, path: FieldPath) -> None:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            self.map_field(value, msg, fd, path)
        elif fd.is_repeated:
            if not isinstance(value, list):
                self.fail(path, f"expected a list, got {_type_name(value)}")
                return
            container = getattr(msg, fd.name)
            for i, item in enumerate(value):
                item_path = (*path, i)
                if fd.message_type is not None:
                    if item is None:
                        self.fail(item_path, "list item is null")
                        continue
                    self.message(item, container.add(), item_path)
                else:
                    ok, converted = self.scalar(item, fd, item_path)
                    if ok:
                        container.append(converted)
        elif fd.message_type is not None:
            self.message(value, getattr(msg, fd.name), path)
        else:
            ok, converted = self.scalar(value, fd, path)
            if ok:
                setattr(msg, fd.name, converted)

    def map_field(self, value: Any, msg: Message, fd: FieldDescriptor, path: FieldPath) -> None:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_type_name(value)}")
            return
        entry = fd.message_type
        assert entry is not None  # map fields are always message-typed
        key_fd = entry.fields_by_name["key"]
        value_fd = entry.fields_by_name["value"]
        container = getattr(msg, fd.name)
        for raw_key, item in value.items():
            item_path = (*path, str(raw_key))
            ok, key = self.scalar(raw_key if isinstance(raw_key, str) else str(raw_key), key_fd, item_path)
            if not ok:
                continue
            if value_fd.message_type is not None:
                if item is None:
                    continue
                self.message(item, container[key], item_path)
            else:
                if item is None:
                    self.fail(item_path, "map value is null")
                    continue
                ok, converted = self.scalar(item, value_fd, item_path)
                if ok:
                    container[key] = converted

    def scalar(self, value: Any, fd: FieldDescriptor, path: FieldPath) -> tuple[bool, Any]:
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:
            if isinstance(value, str):
                return True, value
            self.fail(path, f"expected a string, got {_type_name(value)}")
        elif t == FieldDescriptor.TYPE_BOOL:
            if isinstance(value, bool):
                return True, value
            self.fail(path, f"expected true or false, got {_type_name(value)}")
        elif t == FieldDescriptor.TYPE_ENUM and fd.enum_type is not None:
            return self.enum(value, fd.enum_type, path)
        elif t in _INT_RANGES:
            return self.integer(value, t, path)
        elif t in _FLOATS:
            return self.floating(value, path)
        elif t == FieldDescriptor.TYPE_BYTES:
            if isinstance(value, str):
                try:
                    return True, base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    self.fail(path, "expected base64 text")
            else:
                self.fail(path, f"expected base64 text, got {_type_name(value)}")
        else:  # pragma: no cover - every scalar type is handled above
            self.fail(path, f"unsupported field type {t}")
        return False, None

    def enum(self, value: Any, enum: EnumDescriptor, path: FieldPath) -> tuple[bool, Any]:
        if isinstance(value, str):
            ev = enum.values_by_name.get(value)
            if ev is not None:
                return True, ev.number
        elif isinstance(value, int) and not isinstance(value, bool) and value in enum.values_by_number:
            return True, value
        names = ", ".join(v.name for v in enum.values)
        self.fail(path, f'invalid value "{value}": must be one of {names}')
        return False, None

    def integer(self, value: Any, t: int, path: FieldPath) -> tuple[bool, Any]:
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
            self.fail(path, f"expected an integer, got {_type_name(value)} {value!r}")
            return False, None
        low, high = _INT_RANGES[t]
        if not low <= number <= high:
            self.fail(path, f"{number} is out of range [{low}, {high}]")
            return False, None
        return True, number

    def floating(self, value: Any, path: FieldPath) -> tuple[bool, Any]:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
                self.fail(path, "expected a finite number")
                return False, None
            return True, float(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
            else:
                if math.isfinite(number):
                    return True, number
        self.fail(path, f"expected a number, got {_type_name(value)}")
        return False, None

    def well_known(self, data: Any, msg: Message, path: FieldPath) -> None:
        name = msg.DESCRIPTOR.full_name
        if name in _WRAPPERS:
            value_fd: FieldDescriptor = msg.DESCRIPTOR.fields_by_name["value"]  # type: ignore[assignment]
            ok, converted = self.scalar(data, value_fd, path)
            if ok:
                msg.value = converted  # type: ignore[attr-defined]
            return
        if name == "google.protobuf.Duration":
            if not isinstance(data, str):
                self.fail(path, f'expected a duration such as "5s" or "0.250s", got {_type_name(data)}')
                return
            nanos = parse_duration(data)
            if nanos is None:
                self.fail(path, f'invalid duration "{data}": use a number and a unit, e.g. "5s", "250ms", "1m", "1h"')
                return
            seconds, rest = divmod(abs(nanos), 1_000_000_000)
            sign = -1 if nanos < 0 else 1
            if seconds > _MAX_DURATION_SECONDS:
                self.fail(path, f'duration "{data}" is too long')
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
