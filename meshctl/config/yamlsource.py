"""YAML text to plain Python data, fast, bounded, and with positions on demand.

Istio YAML is parsed with libyaml's C parser (through ruamel.yaml) into nodes, then turned into
dicts and lists by our own small builder instead of ruamel's constructor. The builder is what
makes loading safe and quick:

- it counts every value it builds, so an alias bomb ("billion laughs") stops at a budget
  instead of expanding into gigabytes, and recursive aliases stop at a depth limit;
- it rejects duplicate mapping keys (Kubernetes rejects them too) with both positions;
- it keeps only each document's starting position, so loading 10,000 resources stays cheap.

Positions of individual fields are found again only when there is something to report:
`locate()` composes the file once more and walks the node tree along a field path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ruamel.yaml.cyaml import CSafeLoader
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from meshctl.errors import YamlError

#: Files larger than this are refused before parsing (a config file is kilobytes).
DEFAULT_MAX_FILE_BYTES: Final = 8 * 1024 * 1024
#: Values one document may expand to, aliases included. A legitimate resource has hundreds.
DEFAULT_MAX_VALUES: Final = 200_000
#: Nesting deeper than this is not config; it also stops recursive aliases.
MAX_DEPTH: Final = 100

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_MERGE = _TAG + "merge"


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document of a file: its 0-based index, 1-based line/column, and its data."""

    index: int
    line: int
    column: int
    data: Any


class _Builder:
    """Turns composed nodes into plain data within a value budget."""

    __slots__ = ("budget",)

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def build(self, node: Node, depth: int = 0) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _error("document expands to too many values (alias bomb?)", node)
        if depth > MAX_DEPTH:
            raise _error(f"nesting deeper than {MAX_DEPTH} levels (recursive alias?)", node)
        if isinstance(node, ScalarNode):
            return _scalar(node)
        if isinstance(node, SequenceNode):
            return [self.build(child, depth + 1) for child in node.value]
        if isinstance(node, MappingNode):
            return self._mapping(node, depth)
        raise _error(f"unexpected YAML node {type(node).__name__}", node)  # pragma: no cover

    def _mapping(self, node: MappingNode, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        seen: dict[Any, Node] = {}
        merged: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                merged.update(self._merge_sources(value_node, depth))
                continue
            key = self.build(key_node, depth + 1)
            if isinstance(key, (dict, list)):
                raise _error("a mapping key must be a scalar", key_node)
            if key in seen:
                first = seen[key].start_mark
                raise _error(
                    f'duplicate key "{key}" (first defined at line {first.line + 1}, '
                    f"column {first.column + 1})",
                    key_node,
                )
            seen[key] = key_node
            out[key] = self.build(value_node, depth + 1)
        if merged:
            # Explicit keys win over merged ones, as the YAML merge-key spec says.
            return {**merged, **out}
        return out

    def _merge_sources(self, node: Node, depth: int) -> dict[Any, Any]:
        sources = node.value if isinstance(node, SequenceNode) else [node]
        out: dict[Any, Any] = {}
        for source in reversed(sources):
            value = self.build(source, depth + 1)
            if not isinstance(value, dict):
                raise _error("a merge key (<<) takes a mapping or a list of mappings", source)
            out.update(value)
        return out


def _scalar(node: ScalarNode) -> Any:
    tag, value = node.tag, node.value
    if tag == _STR:
        return value
    try:
        if tag == _NULL:
            return None
        if tag == _BOOL:
            return value.lower() in ("true", "yes", "on", "y")
        if tag == _INT:
            text = value.replace("_", "")
            try:
                return int(text, 0)
            except ValueError:
                return int(text, 10)
        if tag == _FLOAT:
            text = value.replace("_", "").lower()
            if text in (".inf", "+.inf"):
                return math.inf
            if text == "-.inf":
                return -math.inf
            if text == ".nan":
                return math.nan
            return float(text)
    except ValueError:
        return value
    # Timestamps, binary and custom tags stay text, as they would after Kubernetes' JSON step.
    return value


def _error(message: str, node: Node) -> YamlError:
    mark = node.start_mark
    return YamlError(message, mark.line + 1, mark.column + 1)


def _yaml_error(exc: YAMLError) -> YamlError:
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            message += f" {exc.context}"
            ctx = exc.context_mark
            if ctx is not None and mark is not None and (ctx.line, ctx.column) != (mark.line, mark.column):
                message += f" started at line {ctx.line + 1}, column {ctx.column + 1}"
        if mark is not None:
            return YamlError(message, mark.line + 1, mark.column + 1)
        return YamlError(message)
    # Reader errors (bad characters) carry their position in the text only.
    return YamlError(str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML")


def _compose(text: str) -> list[Node]:
    loader = CSafeLoader(text)
    nodes: list[Node] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                nodes.append(node)
    except YAMLError as exc:
        raise _yaml_error(exc) from None
    except (ValueError, TypeError) as exc:  # libyaml reader errors on bad characters
        raise YamlError(f"cannot read YAML: {exc}") from None
    return nodes


def parse_documents(text: str, *, max_values: int = DEFAULT_MAX_VALUES) -> list[Document]:
    """Every non-empty document of `text`, as plain data. Raises YamlError on the first problem:
    a file is accepted whole or not at all, so the store never holds half of it."""
    docs: list[Document] = []
    for index, node in enumerate(_compose(text)):
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            continue  # an empty document between two '---'
        data = _Builder(max_values).build(node)
        mark = node.start_mark
        docs.append(Document(index=index, line=mark.line + 1, column=mark.column + 1, data=data))
    return docs


def check_size(size: int, limit: int = DEFAULT_MAX_FILE_BYTES) -> None:
    if size > limit:
        raise YamlError(f"file is {size} bytes, over the {limit}-byte limit for a config file")


def locate(text: str, document: int, path: Sequence[str | int]) -> tuple[int, int]:
    """1-based (line, column) of the deepest node along `path` in document `document` of `text`.

    When the path leads to a field that is not written (a missing required field), the position
    is that of its nearest written ancestor, which is where a person would add it.
    """
    try:
        nodes = _compose(text)
    except YamlError:
        return (0, 0)
    # Empty documents are skipped by parse_documents but keep their index in the stream.
    if document >= len(nodes):
        return (0, 0)
    node: Node = nodes[document]
    at: Node = node
    for part in path:
        found = _child(node, part)
        if found is None:
            break
        # A field is shown at its key (where a person reads the name); a list item at the item.
        at, node = found
    return at.start_mark.line + 1, at.start_mark.column + 1


def _child(node: Node, part: str | int) -> tuple[Node, Node] | None:
    if isinstance(part, int) and isinstance(node, SequenceNode):
        if 0 <= part < len(node.value):
            item: Node = node.value[part]
            return item, item
        return None
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == str(part):
                return key_node, value_node
    return None
