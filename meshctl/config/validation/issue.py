"""The one type every rule returns, apart from the package so that rules kept elsewhere (the
Gateway API's, in `config/gateway_api`) can use it without importing the dispatcher that loads them."""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.config.findings import FieldPath, Severity


@dataclass(frozen=True, slots=True)
class Issue:
    """A rule broken by one resource: the field path from the document root (`spec`, ...)."""

    path: FieldPath
    message: str
    severity: Severity = Severity.ERROR
