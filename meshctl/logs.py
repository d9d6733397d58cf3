"""Where meshctl's log lines go and what they look like: one handler on stderr, text or JSON.

    text   `2025-06-01T12:00:00.123Z INFO meshctl.server: serving xDS on ...` for people
    json   `{"time": ..., "level": "info", "logger": ..., "message": ..., **extra}` for log
           shippers: one object per line, fields passed with `extra=` included, tracebacks in
           `exception`

Under journald (systemd sets `$JOURNAL_STREAM` to the device and inode of the stream it connected
to stdout/stderr) text lines carry no timestamp, because the journal stamps every line itself, and
every line, text or JSON, starts with a `<N>` syslog priority, which journald strips and turns into
the entry's priority so that `journalctl -p warning` finds meshctl's warnings. Comparing the device and inode
with stderr's, rather than only checking that the variable is set, keeps a process whose stderr was
redirected elsewhere (`meshctl serve 2>file` from a shell inside a unit) from dropping timestamps.

The CLI calls `configure_logging` with the flags and the environment; nothing here runs at import.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO, get_args

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)

#: syslog(3) priorities of Python's levels, for journald's `<N>` line prefix (sd-daemon(3)).
_PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

_HANDLER_NAME = "meshctl"

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def untrusted(text: str, limit: int = 160) -> str:
    """What a client sent (a node id, a NACK's message, a type URL), made safe for a log line or
    an error: escaped as Python's repr escapes it (without its quotes), so no control character,
    line break or terminal escape reaches the log, and cut to `limit` characters, saying how many
    were left out. A well-formed node id reads as it is."""
    shown = repr(text[:limit])[1:-1]
    if len(text) <= limit:
        return shown
    return f"{shown}... ({len(text) - limit} more characters)"


def under_journald(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether `stream` is the journal stream systemd connected, per `$JOURNAL_STREAM` (systemd.exec(5))."""
    device, sep, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        # A stream without a file descriptor (a test's capture, a closed stream) is not the journal.
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def _priority(levelno: int) -> int:
    """The syslog priority of a level, rounding custom levels down to the next named one."""
    for level in sorted(_PRIORITIES, reverse=True):
        if levelno >= level:
            return _PRIORITIES[level]
    return _PRIORITIES[logging.DEBUG]


def _timestamp(created: float) -> str:
    """RFC 3339 in UTC with milliseconds: sortable, and one zone across a fleet's hosts."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`TIME LEVEL logger: message`, or `<N>LEVEL logger: message` for the journal."""

    def __init__(self, *, journald: bool = False) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if self.journald:
            # Each physical line needs its prefix: journald reads a traceback line by line.
            prefix = f"<{_priority(record.levelno)}>"
            return "\n".join(prefix + part for part in line.split("\n"))
        return f"{_timestamp(record.created)} {line}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the fields a log shipper indexes and any `extra=` fields."""

    def __init__(self, *, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: an extra field that JSON cannot hold (a Path, an enum) still logs as text.
        line = json.dumps(entry, default=str, ensure_ascii=False)
        return f"<{_priority(record.levelno)}>{line}" if self.journald else line


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to `sys.stderr` as it is when a record comes, not as it was when
    logging was set up: a command run in-process (typer's CliRunner) swaps stderr for a buffer
    it closes afterwards, and the server's threads would then log into a closed file."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stderr


def configure_logging(
    level: str = "warning",
    fmt: str = "text",
    *,
    environ: Mapping[str, str],
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every logger's records at `level` and above to `stream` (stderr) in format `fmt`.

    Calling it again (the CLI sets a default, then `meshctl serve` applies its flags) replaces
    the handler it installed before rather than doubling every line; handlers that others put
    on the root logger (pytest's capture, say) are left alone.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    out = stream if stream is not None else sys.stderr
    journald = under_journald(out, environ)
    handler = logging.StreamHandler(out) if stream is not None else _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter(journald=journald) if fmt == "json" else TextFormatter(journald=journald))
    root = logging.getLogger()
    for old in root.handlers[:]:
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The watchdog library logs every file event at debug: noise for `--log-level debug`, and a
    # loop when the log file lies in a watched directory (each line written is another event).
    logging.getLogger("watchdog").setLevel(max(root.level, logging.INFO))
    return handler
