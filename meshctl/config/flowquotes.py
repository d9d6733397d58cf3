"""Plain scalars holding ":" in a YAML flow collection, read as Go reads them.

Go's YAML parser, which Kubernetes and Istio use, reads `addresses: [1.2.3.4, 2001:db8::]` as two
strings: in a flow collection a plain scalar ends at ": " (or ":" at the end of a line), at a
blank before "#", or at ",", "]", "}". libyaml stops at the first ":" that is not followed by a
blank instead ("found unexpected ':'") and fails the whole file.

`FlowQuotes` finds such scalars and puts them in single quotes in a copy of the text, which
libyaml reads; `yamlsource` parses the copy, through `FlowQuotes.events`, only after libyaml
reported that very error on the text. Why that cannot change the meaning of valid YAML:

- the copy differs from the text by the inserted quotes alone, so every other token reads as
  before, and positions (line and column) are mapped back to the text's;
- every quoted scalar must come back from libyaml as one single-quoted scalar that ends at its
  closing quote and holds exactly the text between the quotes; otherwise (a quote that landed
  in a comment, a block scalar or a string, or that split a longer scalar) the copy is refused
  and libyaml's original error stands, with a hint to quote the value;
- a quoted scalar is then typed as the plain scalar it was (`implicit` plain), so `8080`,
  `true` or `1:20` get the type they would have had unquoted.

Which scalars to quote: the one libyaml stopped at, and candidates found by a small scan of the
flow collections around it and later in the same document (so a file of many is not parsed
once per scalar). Candidates are only guesses: if the copy with them is refused, the copy is
made again from the scalars libyaml itself reports, one parse each. Scalars this does not take
on (ones that go on to the next line, hold a quote, or end where Go and libyaml would read what
follows differently, such as at "?") keep libyaml's error.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Final

from ruamel.yaml.error import MarkedYAMLError, StreamMark, YAMLError
from ruamel.yaml.events import ScalarEvent

#: libyaml's complaint about a ":" inside a plain scalar of a flow collection.
FLOW_COLON: Final = "found unexpected ':'"
#: Scalars quoted in one text at most.
MAX_QUOTED: Final = 100_000
#: Text scanned to find them, as a multiple of the text's size (plus a megabyte).
_SCAN_BUDGET: Final = 16
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
#: A line that always ends a document, whatever it is inside of.
_DOCUMENT_MARKER = re.compile(r"(?:---|\.\.\.)(?:[ \t]|$)")
#: A flow collection opening a block value or item: `key: [`, `- {`, `[`.
_FLOW_START = re.compile(r"[ \t]*(?:-[ \t]+)*(?:[^\s#'\"\[\]{},][^#'\"\[\]{}]*?:[ \t]+)?([\[{])")
#: A line that starts a block scalar (`key: |`, `- >-`).
_BLOCK_SCALAR = re.compile(r"(?:^|[ \t]|:)[|>][-+0-9]*[ \t]*(?:#.*)?$")
#: Characters that cannot start a plain scalar in a flow collection.
_NOT_PLAIN_START: Final = frozenset("-?:,[]{}#&*!|>'\"%@` \t")
_FLOW_INDICATORS: Final = frozenset(",[]{}")


def is_flow_colon(exc: YAMLError) -> bool:
    """True for libyaml's error on a ":" inside a plain scalar of a flow collection."""
    return (
        isinstance(exc, MarkedYAMLError)
        and exc.problem == FLOW_COLON
        and exc.context_mark is not None
        and exc.problem_mark is not None
    )


class FlowQuotes:
    """The scalars to quote in one text, the quoted copy, and the way back to the text."""

    def __init__(self, text: str, *, guess: bool = True) -> None:
        self.text = text
        self.guess = guess
        self.bom = text.startswith("\ufeff")  # libyaml's columns do not count a leading BOM
        self.starts = [0, *(m.end() for m in _LINE_BREAK.finditer(text))]
        ends = [*self.starts[1:], len(text)]
        #: each line without its line break, in libyaml's columns
        self.lines = [_LINE_BREAK.sub("", text[a:b]) for a, b in zip(self.starts, ends, strict=True)]
        if self.bom:
            self.lines[0] = self.lines[0][1:]
        #: line -> {start column: end column} of the scalars to quote on that line
        self.spans: dict[int, dict[int, int]] = {}
        #: line -> quoted columns of its opening and of its closing quotes, and starts by end
        self._layout: dict[int, tuple[list[int], list[int], dict[int, int]]] = {}
        self.count = 0
        self.seen = 0
        self.mismatch: YAMLError | None = None
        self._walked_to = -1  # lines before this were scanned for guesses already

    # --- the quoted copy -------------------------------------------------------------------

    def quoted_text(self, first: int = 0, last: int | None = None) -> str:
        """Lines `first` up to `last` (all by default) with the scalars quoted."""
        self.seen = 0
        last = len(self.lines) if last is None else last
        end = self.starts[last] if last < len(self.starts) else len(self.text)
        pieces: list[str] = []
        at = self.starts[first]
        lines = range(first, last) if last - first < len(self.spans) else sorted(self.spans)
        for n in lines:
            if n not in self.spans or not first <= n < last:
                continue
            offset = self.starts[n] + (1 if n == 0 and self.bom else 0)
            for start, stop in sorted(self.spans[n].items()):
                pieces += [self.text[at : offset + start], "'", self.text[offset + start : offset + stop], "'"]
                at = offset + stop
        pieces.append(self.text[at:end])
        return "".join(pieces)

    # --- finding the scalars ---------------------------------------------------------------

    def add(self, exc: YAMLError, last: int | None = None) -> bool:
        """Quote the scalar libyaml stopped at (`exc`, in the text's positions), and, when
        guessing, the candidates up to line `last`; False when it cannot be quoted."""
        assert isinstance(exc, MarkedYAMLError) and exc.context_mark is not None and exc.problem_mark is not None
        line, start = exc.context_mark.line, exc.context_mark.column
        if self.count >= MAX_QUOTED or line >= len(self.lines) or start in self.spans.get(line, {}):
            return False
        end = self._plain_end(line, start)
        if end is None or exc.problem_mark.line != line or not start <= exc.problem_mark.column < end:
            return False
        self._quote(line, start, end)
        if self.guess:
            self._walk(line, end, depth=1)
            last = len(self.lines) if last is None else last
            block = -1  # indentation of a block scalar's header while in its lines
            for n in range(max(line + 1, self._walked_to), last):
                text = self.lines[n]
                indent = len(text) - len(text.lstrip(" "))
                if block >= 0 and (indent > block or not text.strip()):
                    continue  # a line of a block scalar (`key: |`) is text, not YAML
                block = indent if _BLOCK_SCALAR.search(text) else -1
                match = _FLOW_START.match(text) if n >= self._walked_to else None
                if match is not None:
                    self._walk(n, match.end(), depth=1)
            self._walked_to = max(self._walked_to, last)
        return True

    def _quote(self, line: int, start: int, end: int) -> None:
        spans = self.spans.setdefault(line, {})
        if start not in spans and self.count < MAX_QUOTED:
            spans[start] = end
            self._layout.pop(line, None)
            self.count += 1

    def _plain_end(self, line: int, start: int) -> int | None:
        """Where Go ends a plain scalar of a flow collection that starts at `start`; None when
        it goes on to the next line, holds a quote, or ends where Go and libyaml would read what
        follows differently."""
        text = self.lines[line]
        if start >= len(text):
            return None
        if text[start] in _NOT_PLAIN_START:
            follows = text[start + 1 : start + 2]
            if text[start] != "-" or not follows or follows in " \t" or follows in _FLOW_INDICATORS:
                return None
        i, end = start, start
        while i < len(text):
            c = text[i]
            if c in " \t":
                while i < len(text) and text[i] in " \t":
                    i += 1
                if i < len(text) and text[i] == "#":
                    return end  # a comment ends it
                continue
            if c in ",]}" or (c == ":" and (i + 1 == len(text) or text[i + 1] in " \t")):
                return end
            if c in "?[{'":
                return None
            i += 1
            end = i
        after = self._skip(line + 1, 0)
        return end if after is not None and self.lines[after[0]][after[1]] in ",]}" else None

    def _skip(self, line: int, column: int) -> tuple[int, int] | None:
        """The next token from (`line`, `column`) on, past blanks, line breaks and comments."""
        while line < len(self.lines):
            text = self.lines[line]
            while column < len(text) and text[column] in " \t":
                column += 1
            if column < len(text) and text[column] != "#":
                return line, column
            line, column = line + 1, 0
        return None

    def _walk(self, line: int, column: int, depth: int) -> None:
        """Guess: quote the plain scalars with ":" from (`line`, `column`), inside `depth` flow
        collections, to where the outermost one closes; stop at anything unexpected."""
        position = (line, column)
        while depth > 0:
            at = self._skip(*position)
            if at is None:
                return
            line, column = at
            text = self.lines[line]
            self._walked_to = max(self._walked_to, line + 1)
            c = text[column]
            if c in "[{":
                depth += 1
            elif c in "]}":
                depth -= 1
            elif c in "&*!":  # an anchor, alias or tag: up to a blank or an indicator
                while column + 1 < len(text) and text[column + 1] not in " \t,[]{}":
                    column += 1
            elif c in "'\"":
                close = _quoted_end(text, column)
                if close is None:
                    return
                column = close - 1
            elif c not in ",:?":
                end = self._plain_end(line, column)
                if end is None:
                    return
                if ":" in text[column:end]:
                    self._quote(line, column, end)
                column = end - 1
            position = (line, column + 1)

    def discover(self, scan: Callable[[str], None]) -> None:
        """Find the scalars to quote, document by document: `scan` (which raises libyaml's
        errors) runs on the quoted copy of the document where libyaml stopped, until it
        passes. A line "---" or "..." at column 0 always ends a document; with directives ("%")
        the text is one piece. This only finds candidates: the full parse checks every one."""
        bounds = [n for n, text in enumerate(self.lines) if _DOCUMENT_MARKER.match(text)]
        if any(text.startswith("%") for text in self.lines):
            bounds = []
        bounds.append(len(self.lines))
        budget = _SCAN_BUDGET * len(self.text) + 1_000_000
        first = 0
        for last in bounds:
            while last > first and budget > 0:
                chunk = self.quoted_text(first, last)
                try:
                    scan(chunk)
                except YAMLError as exc:
                    self.unquote_marks(exc, first)
                    # What libyaml read up to the error, and a share for copying the chunk.
                    mark = getattr(exc, "problem_mark", None)
                    line = min(mark.line, len(self.starts) - 1) if mark is not None else len(self.starts) - 1
                    read = self.starts[line] - self.starts[first]
                    budget -= read + len(chunk) // 8
                    if is_flow_colon(exc) and self.add(exc, last):
                        continue
                except (ValueError, TypeError):
                    pass
                break
            first = max(first, last)

    # --- reading the quoted copy -----------------------------------------------------------

    def _layout_of(self, line: int) -> tuple[list[int], list[int], dict[int, int]]:
        layout = self._layout.get(line)
        if layout is None:
            spans = sorted(self.spans[line].items())
            opens = [start + 2 * k for k, (start, _) in enumerate(spans)]
            closes = [end + 2 * k + 1 for k, (_, end) in enumerate(spans)]
            layout = self._layout[line] = (opens, closes, {end: start for start, end in spans})
        return layout

    def _column(self, line: int, column: int) -> int:
        """The text's column for a column of the quoted line: each quote before it shifts it."""
        opens, closes, _ = self._layout_of(line)
        return column - bisect_left(opens, column) - bisect_left(closes, column)

    def _mark(self, mark: Any, first_line: int = 0) -> Any:
        line = mark.line + first_line
        if line not in self.spans and not first_line:
            return mark
        column = self._column(line, mark.column) if line in self.spans else mark.column
        return StreamMark(mark.name, mark.index, line, column)

    def unquote_marks(self, exc: YAMLError, first_line: int = 0) -> None:
        """Put `exc`'s positions (in the quoted lines from `first_line` on) in the text's terms."""
        if isinstance(exc, MarkedYAMLError):
            if exc.context_mark is not None:
                exc.context_mark = self._mark(exc.context_mark, first_line)
            if exc.problem_mark is not None:
                exc.problem_mark = self._mark(exc.problem_mark, first_line)

    def events(self, get_event: Callable[[], Any]) -> Callable[[], Any]:
        """`get_event` of the quoted copy, with the text's positions, and each quoted scalar
        checked and turned back into the plain scalar it was."""

        def next_event() -> Any:
            event = get_event()
            line = event.start_mark.line
            if line not in self.spans:
                return event
            event.start_mark = self._mark(event.start_mark)
            if type(event) is not ScalarEvent or event.end_mark.line != line:
                return event
            # Known by where it ends: an anchor or a tag before it moves where it starts.
            end = self._column(line, event.end_mark.column)
            start = self._layout_of(line)[2].get(end)
            if start is not None and event.style == "'":
                if event.value != self.lines[line][start:end]:
                    self.mismatch = YAMLError("a quoted scalar reads differently")
                    raise self.mismatch
                event.style = None
                event.implicit = (True, False)  # typed as the plain scalar it was
                self.seen += 1
            return event

        return next_event

    def all_seen(self) -> bool:
        """Every quoted scalar came back as one scalar (none was in a comment or a string)."""
        return self.seen == self.count


def _quoted_end(text: str, start: int) -> int | None:
    """The column after a quoted scalar that starts at `start` and ends on the same line."""
    quote, i = text[start], start + 1
    while i < len(text):
        c = text[i]
        if quote == '"' and c == "\\":
            i += 2
            continue
        if c == quote:
            if quote == "'" and text[i + 1 : i + 2] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    return None
