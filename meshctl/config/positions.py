"""Where a field of a YAML text is written (line and column), found again only for findings.

Loading keeps only each document's starting position (`yamlsource`), so that 10,000 resources
load cheaply. When there is something to report, `Positions` parses the text once more, on the
first question, into a tree of marks (under the parser's nesting bound), and walks it along a
field path for each finding: a file with many findings costs one more parse, not one per finding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from meshctl.config.yamlsource import DEFAULT_MAX_DOCUMENTS, MAX_DEPTH, TOO_DEEP, Mark, error_at, with_events
from meshctl.errors import YamlError


def locate(text: str, document: int, path: Sequence[str | int]) -> tuple[int, int]:
    """1-based (line, column) of the deepest node along `path` in document `document` of `text`.

    When the path leads to a field that is not written (a missing required field), the position
    is that of its nearest written ancestor, which is where a person would add it.
    """
    return Positions(text).locate(document, path)


@dataclass(slots=True)
class _Placed:
    """Where a value is written: its mark, a scalar's text (keys are matched by it), and a
    collection's items (a mapping's as (key, value) pairs)."""

    mark: Mark
    is_map: bool = False
    text: str | None = None
    items: list[Any] = field(default_factory=list)


def _place(text: str) -> list[_Placed | None]:
    """Each document's position tree, empty documents included (they keep their index), built
    from events with the same nesting bound as the data. Aliases share the anchored tree."""
    return with_events(text, lambda next_event, _resolve: _place_events(next_event))


def _place_events(next_event: Callable[[], Any]) -> list[_Placed | None]:
    roots: list[_Placed | None] = []
    while True:
        event = next_event()
        cls = type(event)
        if cls is StreamEndEvent:
            return roots
        if cls is not DocumentStartEvent:
            continue
        if len(roots) >= DEFAULT_MAX_DOCUMENTS:
            return roots
        anchors: dict[str, _Placed] = {}
        stack: list[tuple[_Placed, list[_Placed]]] = []  # a collection, and a mapping's pending key
        root: _Placed | None = None
        while (event := next_event()) and type(event) is not DocumentEndEvent:
            cls = type(event)
            if cls is MappingStartEvent or cls is SequenceStartEvent:
                if len(stack) >= MAX_DEPTH:
                    raise error_at(TOO_DEEP, event.start_mark)
                placed = _Placed(event.start_mark, cls is MappingStartEvent)
                if event.anchor is not None:
                    anchors[event.anchor] = placed
                stack.append((placed, []))
                continue
            if cls is MappingEndEvent or cls is SequenceEndEvent:
                placed = stack.pop()[0]
            elif cls is AliasEvent:
                placed = anchors.get(event.anchor) or _Placed(event.start_mark)
            else:
                placed = _Placed(event.start_mark, text=event.value)
                if event.anchor is not None:
                    anchors[event.anchor] = placed
            if not stack:
                root = placed
                continue
            parent, key = stack[-1]
            if not parent.is_map:
                parent.items.append(placed)
            elif key:
                parent.items.append((key.pop(), placed))
            else:
                key.append(placed)
        roots.append(root)


class Positions:
    """Field positions in one text, which is parsed once, on the first question: a file with
    many findings costs one more parse, not one per finding."""

    __slots__ = ("_roots", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._roots: list[_Placed | None] | None = None

    def locate(self, document: int, path: Sequence[str | int]) -> tuple[int, int]:
        """As `locate()`; (0, 0) when the text does not parse or has no such document."""
        if self._roots is None:
            try:
                self._roots = _place(self._text)
            except (YAMLError, YamlError, ValueError, TypeError):
                self._roots = []
        # Empty documents are skipped by parse_documents but keep their index in the stream.
        node = self._roots[document] if document < len(self._roots) else None
        if node is None:
            return (0, 0)
        at = node
        for part in path:
            found = _child(node, part)
            if found is None:
                break
            # A field is shown at its key (where a person reads the name); a list item at the item.
            at, node = found
        return at.mark.line + 1, at.mark.column + 1


def _child(node: _Placed, part: str | int) -> tuple[_Placed, _Placed] | None:
    if not node.is_map:
        if isinstance(part, int) and 0 <= part < len(node.items):
            item: _Placed = node.items[part]
            return item, item
        return None
    for key, value in node.items:
        if key.text is not None and key.text == str(part):
            return key, value
    return None
