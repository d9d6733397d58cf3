"""Everything the CLI shows: the only module that imports rich.

Machine formats (json, yaml, github) go to stdout untouched; human text goes to stdout as plain
lines (grep-able, like a compiler's), and summaries and errors go to stderr.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from meshctl.config.findings import Finding, Severity

_STYLES = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def stdout_console() -> Console:
    return Console(highlight=False)


def error(message: str) -> None:
    """A one-line error for a person, on stderr; the message is text, never markup (a URL such as
    `http://[::1]/` would lose its brackets)."""
    stderr_console().print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)


def print_findings(findings: Sequence[Finding], fmt: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        json.dump([f.as_dict() for f in findings], out, indent=2)
        out.write("\n")
    elif fmt == "github":
        for f in findings:
            out.write(_github_annotation(f) + "\n")
    else:
        console = Console(file=out, highlight=False, soft_wrap=True)
        for f in findings:
            console.print(f"[{_STYLES[f.severity]}]{f.severity.value}[/] {_rest(f)}", markup=True)


def _rest(f: Finding) -> str:
    from rich.markup import escape

    text = str(f)
    return escape(text[len(f.severity.value) + 1 :])


def _github_annotation(f: Finding) -> str:
    """A GitHub Actions workflow command: shows the finding on the pull request's diff."""
    level = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}[f.severity]
    props = []
    if f.file:
        props.append(f"file={_escape_property(f.file)}")
    if f.line:
        props.append(f"line={f.line}")
    if f.column:
        props.append(f"col={f.column}")
    title = f.code or (f"{f.resource.kind} {f.resource.namespace}/{f.resource.name}" if f.resource else "meshctl")
    props.append(f"title={_escape_property(title)}")
    where = f" {f.resource}" if f.resource else ""
    field = f" {f.field}:" if f.field else ":"
    message = f"{where.strip()}{field} {f.message}".strip()
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def summary(findings: Sequence[Finding], files: int | None = None) -> None:
    errors = sum(1 for f in findings if f.severity is Severity.ERROR)
    warnings = sum(1 for f in findings if f.severity is Severity.WARNING)
    console = stderr_console()
    if not errors and not warnings:
        console.print("[green]✔[/] no problems found")
    else:
        console.print(f"{errors} error(s), {warnings} warning(s)")


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*(str(x) for x in r))
    stdout_console().print(t)


def print_listing(columns: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """Rows of cells, a cell's lines separated by newlines: a table on a terminal wide enough to
    show every cell whole, else aligned plain text."""
    out = out or sys.stdout
    console = Console(file=out, highlight=False)
    # A table only when every cell fits unbroken: a node id folded mid-word cannot be copied.
    widest = [max((len(line) for row in rows for line in row[i].split("\n")), default=0) for i in range(len(columns))]
    needed = sum(max(w, len(c)) for w, c in zip(widest, columns, strict=True)) + 3 * len(columns) + 1
    if console.is_terminal and needed <= console.width:
        table = Table(show_lines=True)
        for column in columns:
            table.add_column(column, no_wrap=True)
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
        return
    out.write(plain_listing(columns, rows))


def plain_listing(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The listing as aligned plain text (two spaces between columns, the last one unpadded)."""
    lines: list[list[str]] = [list(columns)]
    for row in rows:
        cells = [cell.split("\n") for cell in row]
        height = max((len(c) for c in cells), default=1)
        for i in range(height):
            lines.append([c[0] if len(c) == 1 else (c[i] if i < len(c) else "") for c in cells])
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    text = io.StringIO()
    for line in lines:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(line[:-1])]
        text.write("  ".join([*padded, line[-1]]).rstrip() + "\n")
    return text.getvalue()


def print_data(data: Any, fmt: str, out: TextIO | None = None, *, compact: bool = False) -> None:
    """`data` (dicts, lists, str, int, bool) as json or yaml on stdout. `compact` writes json as
    one line (a stream of documents, one per line) and yaml as one `---` document."""
    out = out or sys.stdout
    if fmt == "json":
        if compact:
            out.write(json.dumps(data, separators=(",", ":")) + "\n")
        else:
            json.dump(data, out, indent=2)
            out.write("\n")
        return
    if fmt == "yaml":
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.representer.sort_base_mapping_type_on_output = False  # keep our key order, not the alphabet's
        if compact:
            out.write("---\n")
        yaml.dump(data, out)
        return
    raise ValueError(f"unknown data format {fmt!r}")


@dataclass(frozen=True, slots=True)
class TableData:
    """One table: a title (shown on a terminal only), its column names and its rows of cells."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


def print_tables(tables: Sequence[TableData], out: TextIO | None = None) -> None:
    """Tables one after another, a blank line between them."""
    out = out or sys.stdout
    console = Console(file=out, highlight=False)
    for i, table in enumerate(tables):
        if console.is_terminal:
            console.print(_rich_table(table))
            continue
        if i:
            out.write("\n")
        out.write(plain_table(table.columns, table.rows))
    out.flush()


def _rich_table(data: TableData) -> Table:
    table = Table(title=data.title, title_justify="left")
    for column in data.columns:
        table.add_column(column, overflow="fold")
    for row in data.rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns, three spaces apart as istioctl's, trailing blanks trimmed."""
    lines = [list(columns), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "".join("   ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() + "\n" for line in lines)


_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("#", "bold yellow"), ("+", "green"), ("-", "red"))


def print_diff(lines: Iterable[str], out: TextIO | None = None) -> None:
    """Unified diff lines (no line endings), coloured by kind on a terminal."""
    out = out or sys.stdout
    console = Console(file=out, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        for line in lines:
            out.write(line + "\n")
        out.flush()
        return
    for line in lines:
        style = next((s for prefix, s in _DIFF_STYLES if line.startswith(prefix)), "")
        console.print(Text(line, style=style))
