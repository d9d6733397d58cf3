"""Reading plain data field by field, with a field-path issue for every value of the wrong form:
the Gateway API's own validation rules are written with it (`model`), and what it lets through
is what the translation may rely on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import Message

from meshctl.config.findings import FieldPath
from meshctl.config.validation.issue import Issue

SECTION = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
_DURATION_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNITS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def plain(spec: Message) -> dict[str, Any]:
    """A Struct spec as plain data, with whole numbers as ints (a Struct keeps every number as a
    double; Gateway API numbers are ports, weights, codes and counts)."""

    def fix(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    out = fix(json_format.MessageToDict(spec))
    return out if isinstance(out, dict) else {}


def seconds(text: str) -> float | None:
    """A Gateway API duration (`1h2m`, `500ms`, GEP-2257) in seconds; None if it is none."""
    if not _DURATION.fullmatch(text):
        return None
    return sum(int(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(text))


class Reader:
    """Reads plain data field by field, noting an issue (with its path) for each bad value."""

    def __init__(self) -> None:
        self.issues: list[Issue] = []

    def bad(self, path: FieldPath, message: str) -> None:
        self.issues.append(Issue(path, message))

    def obj(self, data: Any, path: FieldPath) -> dict[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.bad(path, "must be a mapping")
            return {}
        return data

    def items(self, data: Any, path: FieldPath, limit: int = 64) -> list[tuple[FieldPath, Any]]:
        if data is None:
            return []
        if not isinstance(data, list):
            self.bad(path, "must be a list")
            return []
        if len(data) > limit:
            self.bad(path, f"at most {limit} entries")
        return [((*path, i), v) for i, v in enumerate(data[:limit])]

    def text(self, data: dict[str, Any], key: str, path: FieldPath, *, required: bool = False) -> str | None:
        value = data.get(key)
        if value is None:
            if required:
                self.bad((*path, key), f"{key} is required")
            return None
        if not isinstance(value, str):
            self.bad((*path, key), "must be a string")
            return None
        return value

    def number(
        self, data: dict[str, Any], key: str, path: FieldPath, low: int, high: int, *, required: bool = False
    ) -> int | None:
        value = data.get(key)
        if value is None:
            if required:
                self.bad((*path, key), f"{key} is required")
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.bad((*path, key), f"must be a whole number from {low} to {high}")
            return None
        return value

    def choice(
        self, data: dict[str, Any], key: str, path: FieldPath, allowed: Sequence[str], default: str | None = None
    ) -> str | None:
        value = self.text(data, key, path)
        if value is None:
            return default
        if value not in allowed:
            self.bad((*path, key), f"must be one of {', '.join(allowed)}")
            return default
        return value

    def hostname(self, value: Any, path: FieldPath) -> str | None:
        if not isinstance(value, str) or len(value) > 253 or not _HOSTNAME.fullmatch(value):
            self.bad(path, f"invalid hostname {value!r}: a DNS name, optionally starting with '*.'")
            return None
        return value

    def duration(self, data: dict[str, Any], key: str, path: FieldPath) -> float | None:
        value = self.text(data, key, path)
        if value is None:
            return None
        parsed = seconds(value)
        if parsed is None:
            self.bad((*path, key), f"invalid duration {value!r}: a Gateway API duration such as 10s, 500ms or 1h30m")
        return parsed
