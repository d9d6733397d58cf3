"""Block YAML of plain data, the very text `offline.yaml_text` writes, made fast for large configs.

`meshctl diff` shows a changed resource as a unified diff of its YAML, so a route config of a
thousand virtual hosts is written out twice. ruamel's pure-Python emitter spends seconds on each;
all of that goes into the structure (block mappings, indentless sequences, `{}` and `[]`), which
is simple and written here, while every scalar is still written by ruamel: the distinct scalars
of a document (strings, numbers, booleans; keys apart, as keys are written by their own rules)
are written in one ruamel document, a list, one per line, and reused for every document after.
Whatever this cannot write line for line the same way (a scalar that takes more than one line,
a key too long to be a simple key) falls back to ruamel for the whole document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_Scalar = tuple[type, object]


class BlockYaml:
    """Writes documents as `offline.yaml_text` does, remembering each scalar's text."""

    def __init__(self) -> None:
        self._values: dict[_Scalar, str] = {}
        self._keys: dict[str, str] = {}

    def text(self, data: Any) -> str:
        from meshctl.cli.offline import _plain, yaml_text

        plain = _plain(data)
        if not isinstance(plain, dict | list) or not self._learn(plain):
            return yaml_text(data)
        if not plain:
            return "{}\n" if isinstance(plain, dict) else "[]\n"
        lines: list[str] = []
        if isinstance(plain, dict):
            self._mapping(plain, 0, "", lines)
        else:
            self._sequence(plain, 0, "", lines)
        lines.append("")
        return "\n".join(lines)

    # -- scalars, written by ruamel ---------------------------------------------------------

    def _learn(self, data: dict[str, Any] | list[Any]) -> bool:
        """Write the scalars not seen yet; False when one of them takes more than a line."""
        values: dict[_Scalar, object] = {}
        keys: set[str] = set()
        stack: list[Any] = [data]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                keys.update(k for k in node if k not in self._keys)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
            else:
                scalar = (type(node), node)
                if scalar not in self._values:
                    values[scalar] = node
        return self._write_values(values) and self._write_keys(sorted(keys))

    def _write_values(self, values: dict[_Scalar, object]) -> bool:
        from meshctl.cli.offline import yaml_text

        if not values:
            return True
        lines = yaml_text(list(values.values())).splitlines()
        if len(lines) != len(values) or not all(line.startswith("- ") for line in lines):
            return False
        self._values.update(zip(values, (line[2:] for line in lines), strict=True))
        return True

    def _write_keys(self, keys: list[str]) -> bool:
        from meshctl.cli.offline import yaml_text

        if not keys:
            return True
        lines = yaml_text([{k: 0} for k in keys]).splitlines()
        if len(lines) != len(keys) or not all(line.startswith("- ") and line.endswith(": 0") for line in lines):
            return False
        self._keys.update(zip(keys, (line[2:-3] for line in lines), strict=True))
        return True

    def _scalar(self, value: Any) -> str:
        if isinstance(value, dict):
            return "{}"
        if isinstance(value, list):
            return "[]"
        return self._values[(type(value), value)]

    # -- structure --------------------------------------------------------------------------

    def _mapping(self, data: Mapping[str, Any], indent: int, lead: str, lines: list[str]) -> None:
        """A block mapping at `indent`; its first line starts with `lead` (a sequence's dash)."""
        pad = " " * indent
        for n, (key, value) in enumerate(data.items()):
            head = (lead if n == 0 and lead else pad) + self._keys[key] + ":"
            if isinstance(value, dict) and value:
                lines.append(head)
                self._mapping(value, indent + 2, "", lines)
            elif isinstance(value, list) and value:
                lines.append(head)
                self._sequence(value, indent, "", lines)  # indentless, as ruamel writes it
            else:
                lines.append(f"{head} {self._scalar(value)}")

    def _sequence(self, data: list[Any], indent: int, lead: str, lines: list[str]) -> None:
        pad = " " * indent
        for n, item in enumerate(data):
            dash = (lead if n == 0 and lead else pad) + "- "
            if isinstance(item, dict) and item:
                self._mapping(item, indent + 2, dash, lines)
            elif isinstance(item, list) and item:
                self._sequence(item, indent + 2, dash, lines)
            else:
                lines.append(dash + self._scalar(item))
