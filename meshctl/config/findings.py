"""Findings: what validation and analysis report about input, and where.

A finding always says where (file:line:col when known), which resource (kind namespace/name),
which field (a path such as `spec.http[0].route[0].destination.host`) and, for cross-resource
analysis, Istio's message code (IST0101, ...) so `istioctl analyze` users recognise it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshctl.config.model import ConfigKey

#: A path into a resource: mapping keys and list indexes, from the document root.
FieldPath = tuple[str | int, ...]


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


def format_path(path: Sequence[str | int]) -> str:
    """`("spec", "http", 0, "route")` -> `spec.http[0].route`."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            out.append(f".{part}" if out else part)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong (or worth a warning) with the input."""

    severity: Severity
    message: str
    file: str | None = None
    line: int = 0
    column: int = 0
    resource: ConfigKey | None = None
    field: str = ""
    code: str = ""

    @property
    def location(self) -> str:
        if self.file is None:
            return "-"
        if self.line:
            return f"{self.file}:{self.line}:{self.column}"
        return self.file

    def __str__(self) -> str:
        parts = [self.severity.value, self.location]
        if self.resource is not None:
            parts.append(str(self.resource))
        if self.field:
            parts.append(self.field)
        text = " ".join(parts) + f": {self.message}"
        return f"{text} [{self.code}]" if self.code else text

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of `meshctl validate -o json`, stable for tools."""
        return {
            "severity": self.severity.value,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "kind": self.resource.kind if self.resource else None,
            "namespace": self.resource.namespace if self.resource else None,
            "name": self.resource.name if self.resource else None,
            "field": self.field,
            "message": self.message,
            "code": self.code or None,
        }


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity is Severity.ERROR for f in findings)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Stable order for output: by file, then position, then message."""
    return sorted(findings, key=lambda f: (f.file or "", f.line, f.column, f.message))
