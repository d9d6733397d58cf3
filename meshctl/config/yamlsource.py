"""YAML text to plain Python data, fast, bounded, and with positions on demand.

Istio YAML is parsed by libyaml's C parser (through ruamel.yaml), whose events are turned into
dicts and lists by our own small builder instead of ruamel's composer and constructor. The
builder is what makes loading safe and quick:

- it keeps its own stack instead of recursing, and refuses nesting past `MAX_DEPTH` as it grows:
  composing a file of 30,000 `[` by recursion overflows the C stack and kills the process;
- it bounds the values a document writes (`DEFAULT_MAX_VALUES`, sized for the largest honest
  resources: a ServiceEntry of 40,000 endpoints, an AuthorizationPolicy of 12,000 rules) and,
  apart from them, the values aliases add (`DEFAULT_MAX_ALIAS_VALUES`, counted over a whole
  file, an alias as many values as it stands for), so an alias bomb ("billion laughs") stops
  after a few hundred thousand copies instead of expanding into gigabytes, while a big document
  written out in full is not taken for one;
- it builds one document at a time and stops at `DEFAULT_MAX_DOCUMENTS`, so a file of a million
  empty documents costs neither memory nor a line of log per document;
- it rejects duplicate mapping keys (Kubernetes rejects them too) with both positions;
- it keeps only each document's starting position, so loading 10,000 resources stays cheap.

ruamel's resolver, which types each scalar with Python code and regexes, is short-circuited for
the values that can only be strings (`_Loader`).

Where Go's parser (and so Istio) and libyaml disagree, Go's reading wins: a plain scalar holding
":" in a flow collection (`addresses: [10.0.0.1, 2001:db8::]`) fails in libyaml, and the text is
then parsed with such scalars quoted, positions and values unchanged (`flowquotes`).

Positions of individual fields are found again only when there is something to report
(`positions`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ruamel.yaml.cyaml import CSafeLoader
from ruamel.yaml.error import MarkedYAMLError, StreamMark, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
from ruamel.yaml.resolver import BaseResolver, Resolver

from meshctl.config.flowquotes import FlowQuotes, is_flow_colon
from meshctl.errors import YamlError

#: Files larger than this are refused before parsing (a config file is kilobytes).
DEFAULT_MAX_FILE_BYTES: Final = 8 * 1024 * 1024
#: Values (scalars, mappings, lists) one document may write. A resource has hundreds; a generated
#: ServiceEntry of 40,000 endpoints with labels some 500,000. A file's size bounds them anyway.
DEFAULT_MAX_VALUES: Final = 1_000_000
#: Values aliases may add to one file, all documents together: hand-written config reuses a few
#: blocks; a billion-laughs bomb writes a few hundred bytes that expand without end.
DEFAULT_MAX_ALIAS_VALUES: Final = 200_000
#: Nesting deeper than this is not config (an Istio resource nests some 15 levels); it is
#: refused as it grows, before anything recurses.
MAX_DEPTH: Final = 100
#: Documents one file may hold, empty ones included. A generated file of WorkloadEntries has
#: thousands; a million empty documents is an attack on memory and on the log.
DEFAULT_MAX_DOCUMENTS: Final = 50_000
#: A position in the text, as libyaml reports it (0-based line and column).
Mark = StreamMark

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


class AliasBudget:
    """The values aliases may still add: shared by every document of one file, so that a file
    of many small bombs is stopped as surely as one big one."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int = DEFAULT_MAX_ALIAS_VALUES) -> None:
        self.limit = limit
        self.left = limit


TOO_DEEP = f"nesting deeper than {MAX_DEPTH} levels"

#: Marks a mapping that waits for its next key (no key can be this object).
_NO_KEY: Final = object()
#: The key `<<` of a merge: what follows is merged, not stored.
_MERGE_KEY: Final = object()


class _Frame:
    """A collection being built: its value so far, and what the next child completes."""

    __slots__ = ("anchor", "height", "is_map", "key", "mark", "merged", "seen", "start", "value")

    def __init__(self, value: Any, is_map: bool, mark: Mark, anchor: str | None, start: int) -> None:
        self.value = value
        self.is_map = is_map
        self.mark = mark
        self.anchor = anchor
        self.start = start  # values built before this one: its size is the difference at its end
        self.height = 0
        self.key: Any = _NO_KEY
        self.seen: dict[Any, Mark] = {}
        self.merged: dict[Any, Any] | None = None


class _DocumentBuilder:
    """Builds one document's data from libyaml's events, in a loop with its own stack.

    libyaml's parser is iterative, but composing its events into a tree by recursion (as ruamel's
    C composer does) overflows the C stack on a file of 30,000 `[` and kills the process. Here the
    nesting is counted as it grows and refused past `MAX_DEPTH`, before anything recurses.

    Every value written counts against the document's budget, and every alias, as many values
    as it stands for, against the file's alias budget, so an alias bomb ("billion laughs") stops
    there instead of expanding into gigabytes; an alias takes a copy, so no two places of the
    data are one object. Duplicate keys are refused with both positions, as Kubernetes does.
    """

    __slots__ = ("aliases", "anchors", "budget", "built", "limit", "open_anchors", "resolve")

    def __init__(self, resolve: Any, budget: int, aliases: AliasBudget) -> None:
        self.resolve = resolve
        self.limit = budget
        self.budget = budget  # values the document may still write
        self.aliases = aliases
        self.built = 0  # values built so far, those aliases copied included
        #: anchor -> (value, values it counts for, height)
        self.anchors: dict[str, tuple[Any, int, int]] = {}
        self.open_anchors: set[str] = set()

    def build(self, next_event: Any) -> tuple[Any, Mark | None]:
        """The document's root value and its mark, consuming events up to the document's end."""
        stack: list[_Frame] = []
        root: Any = None
        root_mark: Mark | None = None
        while True:
            event = next_event()
            cls = type(event)
            if cls is ScalarEvent:
                mark = event.start_mark
                self.budget -= 1
                self.built += 1
                if self.budget < 0:
                    raise error_at(self._too_many(), mark)
                if len(stack) > MAX_DEPTH:
                    raise error_at(TOO_DEEP, mark)
                tag = event.tag
                if tag is None:
                    tag = self.resolve(ScalarNode, event.value, event.implicit)
                elif tag == "!":
                    tag = _STR_TAG
                value = event.value if tag is _STR_TAG else _scalar(tag, event.value)
                if event.anchor is not None:
                    self.anchors[event.anchor] = (value, 1, 0)
                height = 0
                if tag == _MERGE and stack and stack[-1].is_map and stack[-1].key is _NO_KEY:
                    value = _MERGE_KEY
            elif cls is MappingStartEvent or cls is SequenceStartEvent:
                mark = event.start_mark
                self.budget -= 1
                self.built += 1
                if self.budget < 0:
                    raise error_at(self._too_many(), mark)
                if len(stack) >= MAX_DEPTH:
                    raise error_at(TOO_DEEP, mark)
                is_map = cls is MappingStartEvent
                if event.anchor is not None:
                    self.open_anchors.add(event.anchor)
                stack.append(_Frame({} if is_map else [], is_map, mark, event.anchor, self.built - 1))
                continue
            elif cls is MappingEndEvent or cls is SequenceEndEvent:
                frame = stack.pop()
                mark, value, height = frame.mark, frame.value, frame.height
                if frame.merged:
                    value = {**frame.merged, **value}  # explicit keys win, as the merge-key spec says
                if frame.anchor is not None:
                    self.open_anchors.discard(frame.anchor)
                    self.anchors[frame.anchor] = (value, self.built - frame.start, height)
            elif cls is AliasEvent:
                mark, name = event.start_mark, event.anchor
                if name in self.open_anchors:
                    raise error_at(f"recursive alias *{name}: nesting without end", mark)
                found = self.anchors.get(name)
                if found is None:
                    raise error_at(f"found undefined alias *{name}", mark)
                value, size, height = found
                self.aliases.left -= size
                self.built += size
                if self.aliases.left < 0:
                    raise error_at(
                        f"aliases expand to more than {self.aliases.limit} values in this file (an alias bomb?)", mark
                    )
                if len(stack) + height > MAX_DEPTH:
                    raise error_at(TOO_DEEP, mark)
                value = _copy(value)
            elif cls is DocumentEndEvent:
                return root, root_mark
            else:  # pragma: no cover - libyaml sends nothing else inside a document
                raise error_at(f"unexpected YAML event {cls.__name__}", event.start_mark)

            if not stack:
                root, root_mark = value, mark
                continue
            top = stack[-1]
            if height >= top.height:
                top.height = height + 1
            if not top.is_map:
                top.value.append(value)
            elif top.key is _NO_KEY:
                if isinstance(value, (dict, list)):
                    raise error_at("a mapping key must be a scalar", mark)
                if value is not _MERGE_KEY:
                    first = top.seen.get(value)
                    if first is not None:
                        raise error_at(
                            f'duplicate key "{value}" (first defined at line {first.line + 1}, '
                            f"column {first.column + 1})",
                            mark,
                        )
                    top.seen[value] = mark
                top.key = value
            elif top.key is _MERGE_KEY:
                top.merged = {**(top.merged or {}), **_merge_sources(value, mark)}
                top.key = _NO_KEY
            else:
                top.value[top.key] = value
                top.key = _NO_KEY

    def _too_many(self) -> str:
        return f"more than {self.limit} values in one document (the limit for a document)"


def _merge_sources(value: Any, mark: Mark) -> dict[Any, Any]:
    """What a merge key (`<<`) brings: a mapping, or a list of them where the first wins."""
    sources = value if isinstance(value, list) else [value]
    out: dict[Any, Any] = {}
    for source in reversed(sources):
        if not isinstance(source, dict):
            raise error_at("a merge key (<<) takes a mapping or a list of mappings", mark)
        out.update(source)
    return out


def _copy(value: Any) -> Any:
    """A copy of an anchored value for one of its aliases (its depth is bounded already)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _scalar(tag: str, value: str) -> Any:
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


def error_at(message: str, mark: Mark) -> YamlError:
    """A YamlError at `mark` (libyaml's 0-based position), as findings give it (1-based)."""
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


#: Full parses of a quoted copy of a text (see `flowquotes`) before giving up; each one that
#: fails on another such scalar quotes at least one more.
_MAX_REPARSES: Final = 16


def _hinted(exc: YAMLError) -> YamlError:
    error = _yaml_error(exc)
    if is_flow_colon(exc):
        error.message += ' (quote the value, e.g. "2001:db8::1")'
        error.args = (error.message,)
    return error


def _scan(text: str) -> None:
    loader = _Loader(text)
    while type(loader.get_event()) is not StreamEndEvent:
        pass


def parse_documents(
    text: str,
    *,
    max_values: int = DEFAULT_MAX_VALUES,
    max_documents: int = DEFAULT_MAX_DOCUMENTS,
    aliases: AliasBudget | None = None,
) -> list[Document]:
    """Every non-empty document of `text`, as plain data. Raises YamlError on the first problem:
    a file is accepted whole or not at all, so the store never holds half of it. Documents are
    built one at a time as libyaml parses them, so a file of a million empty documents stops at
    `max_documents` instead of holding them all. `aliases` is the file's alias budget, when
    `text` is one part of a file (a fresh one otherwise)."""
    return parse_stream(text, max_values=max_values, max_documents=max_documents, aliases=aliases)[0]


def parse_stream(
    text: str,
    *,
    max_values: int = DEFAULT_MAX_VALUES,
    max_documents: int = DEFAULT_MAX_DOCUMENTS,
    aliases: AliasBudget | None = None,
) -> tuple[list[Document], int]:
    """`parse_documents`, and how many documents the text holds, empty ones included: a part
    of a file is taken for one document only when libyaml finds exactly one in it."""
    budget = aliases or AliasBudget()

    def run(next_event: Callable[[], Any], resolve: Any) -> tuple[list[Document], int]:
        start = budget.left  # a re-parse (`flowquotes`) starts from the same budget
        try:
            return _documents(next_event, resolve, max_values, max_documents, budget)
        except BaseException:
            budget.left = start
            raise

    try:
        return with_events(text, run)
    except YAMLError as exc:
        raise _yaml_error(exc) from None
    except (ValueError, TypeError) as exc:  # libyaml reader errors on bad characters
        raise YamlError(f"cannot read YAML: {exc}") from None


def _documents(
    next_event: Callable[[], Any], resolve: Any, max_values: int, max_documents: int, aliases: AliasBudget
) -> tuple[list[Document], int]:
    docs: list[Document] = []
    index = 0
    while True:
        event = next_event()
        cls = type(event)
        if cls is StreamEndEvent:
            return docs, index
        if cls is not DocumentStartEvent:
            continue
        if index >= max_documents:
            raise error_at(f"more than {max_documents} YAML documents in one file", event.start_mark)
        data, mark = _DocumentBuilder(resolve, max_values, aliases).build(next_event)
        if data is not None and mark is not None:  # None: an empty document between two '---'
            docs.append(Document(index=index, line=mark.line + 1, column=mark.column + 1, data=data))
        index += 1


_T = TypeVar("_T")


def with_events(text: str, run: Callable[[Callable[[], Any], Any], _T]) -> _T:
    """`run(next_event, resolve)` over libyaml's events for `text`. When libyaml stops at a plain
    scalar holding ":" in a flow collection (`[10.0.0.1, 2001:db8::]`), which Go's parser and so
    Istio read as a string, over the events of a copy with such scalars quoted instead, with the
    text's positions and values (see `flowquotes`); first with guessed candidates, then, if
    those do not hold, with only the scalars libyaml reports."""
    loader = _Loader(text)
    try:
        return run(loader.get_event, loader.resolve)
    except YAMLError as exc:
        if not is_flow_colon(exc):
            raise
        first = exc
    for guess in (True, False):
        quotes = FlowQuotes(text, guess=guess)
        if not quotes.add(first):
            raise _hinted(first) from None
        quotes.discover(_scan)
        for _ in range(_MAX_REPARSES):
            loader = _Loader(quotes.quoted_text())
            try:
                result = run(quotes.events(loader.get_event), loader.resolve)
            except YAMLError as exc:
                if exc is quotes.mismatch:
                    break
                quotes.unquote_marks(exc)
                if is_flow_colon(exc) and quotes.add(exc):
                    continue
                if guess:
                    break  # perhaps a wrong guess: try again without guesses
                raise
            except YamlError:
                if guess:
                    break
                raise
            if quotes.all_seen():
                return result
            break
    raise _hinted(first) from None


def check_size(size: int, limit: int = DEFAULT_MAX_FILE_BYTES) -> None:
    if size > limit:
        raise YamlError(f"file is {size} bytes, over the {limit}-byte limit for a config file")
