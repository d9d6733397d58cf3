"""YAML text to plain Python data, fast, bounded, and with positions on demand.

Istio YAML is parsed with libyaml's C parser (through ruamel.yaml) into nodes, then turned into
dicts and lists by our own small builder instead of ruamel's constructor. The builder is what
makes loading safe and quick:

- it counts every value it builds, so an alias bomb ("billion laughs") stops at a budget
  instead of expanding into gigabytes, and recursive aliases stop at a depth limit;
- it rejects duplicate mapping keys (Kubernetes rejects them too) with both positions;
- it keeps only each document's starting position, so loading 10,000 resources stays cheap.

Most of the time goes into ruamel's node objects (libyaml itself is quick); ruamel's resolver,
which types each scalar with Python code and regexes, is short-circuited for the values that can
only be strings (`_Loader`).

Positions of individual fields are found again only when there is something to report:
`Positions` composes a file once more, on the first question, and walks the node tree along a
field path for each finding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ruamel.yaml.cyaml import CSafeLoader
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.resolver import BaseResolver, Resolver

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
#: libyaml's parser class, from whichever of ruamel's C extensions is installed.
_CParser: Any = next(c for c in CSafeLoader.__mro__ if c.__name__ == "CParser")


#: YAML 1.2's rules for typing plain scalars, by first character, as ruamel has them; copied, so
#: that rules added to ruamel's classes elsewhere in the process cannot change what we remember.
_RULES: Final = {first: list(rules) for first, rules in Resolver.yaml_implicit_resolvers.items()}
#: First characters for which a plain scalar may be something other than a string (`true`, `8080`,
#: `null`, `<<`, ...): only these need the resolver's regexes (unless some rule takes any first
#: character, which the standard ones do not).
_MAY_BE_TYPED: Final = frozenset(_RULES)
_ANY_FIRST: Final = None in _RULES
#: The tag ruamel's resolver gives every plain or quoted string: one shared object, so a node
#: holding it is known to be a string without turning its tag into text.
_STR_TAG: Final = Resolver.DEFAULT_SCALAR_TAG


#: Tags of plain scalars the resolver has typed (`name`, `8080`, `true`), shared by every load:
#: config repeats the same keys and values, and each costs the resolver several regexes.
_PLAIN_TAGS: dict[str, Any] = {}
_PLAIN_TAGS_MAX: Final = 4096


class _Loader(CSafeLoader):
    """libyaml's parser with a quicker resolver. ruamel's resolver runs Python code and regexes
    for every scalar; here a quoted scalar, or a plain one whose first character rules out every
    type but string, is a string at once, and the other plain scalars are remembered by value.
    The tags are the very ones ruamel's resolver gives, and it still decides them (with our copy
    of the rules, and no path rules, which would make the tag depend on more than the value)."""

    yaml_implicit_resolvers = _RULES
    yaml_path_resolvers = {}  # read-only here, as in ruamel's own classes

    def __init__(self, text: str) -> None:
        # Only the parser and the resolver: ruamel's __init__ also makes the loader refer to
        # itself (as parser, composer, constructor...), a cycle that keeps libyaml's buffers
        # alive until the garbage collector finds it, and we never construct Python objects.
        _CParser.__init__(self, text)
        BaseResolver.__init__(self)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is ScalarNode:
            if not implicit[0]:
                return _STR_TAG  # quoted, so a string
            if value and value[0] not in _MAY_BE_TYPED and not _ANY_FIRST:
                return _STR_TAG
            tag = _PLAIN_TAGS.get(value)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(_PLAIN_TAGS) < _PLAIN_TAGS_MAX:
                    _PLAIN_TAGS[value] = tag
            return tag
        # Collections: their tag depends on their kind alone when there are no path rules.
        if kind is MappingNode:
            return self.DEFAULT_MAPPING_TAG
        if kind is SequenceNode:
            return self.DEFAULT_SEQUENCE_TAG
        return super().resolve(kind, value, implicit)


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document of a file: its 0-based index, 1-based line/column, and its data."""

    index: int
    line: int
    column: int
    data: Any


_TOO_MANY = "document expands to too many values (alias bomb?)"
_TOO_DEEP = f"nesting deeper than {MAX_DEPTH} levels (recursive alias?)"


class _Builder:
    """Turns composed nodes into plain data within a value budget.

    Strings, most of any config, take a short path (by their shared tag) that counts the same
    budget and depth as every other value.
    """

    __slots__ = ("budget",)

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def build(self, node: Node, depth: int = 0) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _error(_TOO_MANY, node)
        if depth > MAX_DEPTH:
            raise _error(_TOO_DEEP, node)
        if isinstance(node, ScalarNode):
            return node.value if node.ctag is _STR_TAG else _scalar(node)
        if isinstance(node, MappingNode):
            return self._mapping(node, depth)
        if isinstance(node, SequenceNode):
            return [self.build(child, depth + 1) for child in node.value]
        raise _error(f"unexpected YAML node {type(node).__name__}", node)  # pragma: no cover

    def _mapping(self, node: MappingNode, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        seen: dict[Any, Node] = {}
        merged: dict[Any, Any] = {}
        child_depth = depth + 1
        for key_node, value_node in node.value:
            if key_node.ctag is _STR_TAG and type(key_node) is ScalarNode:
                self.budget -= 1
                if self.budget < 0:
                    raise _error(_TOO_MANY, key_node)
                if child_depth > MAX_DEPTH:
                    raise _error(_TOO_DEEP, key_node)
                key = key_node.value
            else:
                if key_node.tag == _MERGE:
                    merged.update(self._merge_sources(value_node, depth))
                    continue
                key = self.build(key_node, child_depth)
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
            if value_node.ctag is _STR_TAG and type(value_node) is ScalarNode:
                self.budget -= 1
                if self.budget < 0:
                    raise _error(_TOO_MANY, value_node)
                if child_depth > MAX_DEPTH:
                    raise _error(_TOO_DEEP, value_node)
                out[key] = value_node.value
            else:
                out[key] = self.build(value_node, child_depth)
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
    loader = _Loader(text)
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
    return Positions(text).locate(document, path)


class Positions:
    """Field positions in one text, which is composed once, on the first question: a file with
    many findings costs one more parse, not one per finding."""

    __slots__ = ("_nodes", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._nodes: list[Node] | None = None

    def locate(self, document: int, path: Sequence[str | int]) -> tuple[int, int]:
        """As `locate()`; (0, 0) when the text does not parse or has no such document."""
        if self._nodes is None:
            try:
                self._nodes = _compose(self._text)
            except YamlError:
                self._nodes = []
        # Empty documents are skipped by parse_documents but keep their index in the stream.
        if document >= len(self._nodes):
            return (0, 0)
        node: Node = self._nodes[document]
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
