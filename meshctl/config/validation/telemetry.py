"""Telemetry rules (Istio's `ValidateTelemetry`), and what meshctl refuses of the kind and why.

Istio checks the selector, that `selector` and `targetRefs` are not both set, provider names,
the sampling percentage (0 to 100) and custom tags of tracing, and that a log filter's CEL
expression parses. meshctl adds what it cannot serve:

- `metrics` is an error: Istio's metrics are made by its own stats filter
  (`istio.stats`), which upstream Envoy does not have; a proxy would refuse the filter, and
  leaving the overrides out would silently count what the resource says not to.
- `tracing` is served (`snapshot/tracing.py`); only what Istio ignores is warned of (a second
  provider, a second entry).
- `targetRefs` / `targetRef` name Kubernetes Gateways and Services (waypoints); a VM workload is
  neither, so such a Telemetry applies to no proxy (a warning, as for AuthorizationPolicy).

The CEL expression is checked for what can be checked without a CEL parser (not empty, quotes and
brackets balanced); Envoy refuses the rest with a NACK that `meshctl validate --envoy` shows.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from meshctl.config.validation import Issue
from meshctl.config.validation.common import Report, check_selector

_PAIRS = {")": "(", "]": "[", "}": "{"}


def cel_problem(expression: str) -> str | None:
    """Why `expression` cannot be a CEL expression, as far as brackets and quotes show, or None."""
    if not expression.strip():
        return "filter.expression must not be empty"
    stack: list[str] = []
    quote = ""
    escaped = False
    for ch in expression:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in _PAIRS and (not stack or stack.pop() != _PAIRS[ch]):
            return f"filter.expression {expression!r} is not a CEL expression: unbalanced {ch!r}"
    if quote:
        return f"filter.expression {expression!r} is not a CEL expression: unterminated string"
    if stack:
        return f"filter.expression {expression!r} is not a CEL expression: unclosed {stack[-1]!r}"
    return None


def _providers(report: Report, path: tuple[str | int, ...], providers: Any) -> None:
    for i, provider in enumerate(providers):
        if not provider.name:
            report.error((*path, "providers", i, "name"), "provider name must not be empty")


def validate(spec: Message) -> list[Issue]:
    telemetry: Any = spec
    report = Report()
    refs = list(telemetry.target_refs) + ([telemetry.target_ref] if telemetry.HasField("target_ref") else [])
    if telemetry.HasField("selector"):
        check_selector(report, ("spec", "selector", "matchLabels"), telemetry.selector.match_labels, "the Telemetry")
        if refs:
            report.error(("spec", "targetRefs"), "only one of targetRefs or selector can be set")
    if refs:
        field = "targetRefs" if telemetry.target_refs else "targetRef"
        report.warn(
            ("spec", field),
            f"{field} selects Kubernetes Gateways and Services (waypoints), never a VM workload: "
            "this Telemetry applies to no proxy meshctl serves",
        )
    for i, logging in enumerate(telemetry.access_logging):
        path: tuple[str | int, ...] = ("spec", "accessLogging", i)
        _providers(report, path, logging.providers)
        if logging.HasField("filter"):
            report.error((*path, "filter", "expression"), cel_problem(logging.filter.expression))
    for i, tracing in enumerate(telemetry.tracing):
        path = ("spec", "tracing", i)
        _providers(report, path, tracing.providers)
        if len(tracing.providers) > 1:
            report.warn((*path, "providers"), "multiple providers are not supported: Istio uses the first")
        if tracing.HasField("random_sampling_percentage"):
            value = tracing.random_sampling_percentage.value
            if not 0 <= value <= 100:
                report.error(
                    (*path, "randomSamplingPercentage"), f"randomSamplingPercentage must be in [0, 100], not {value}"
                )
        for name, tag in sorted(tracing.custom_tags.items()):
            kind = tag.WhichOneof("type")
            tag_path = (*path, "customTags", name)
            if kind is None:
                report.error(tag_path, f"custom tag {name!r} must be a literal, an environment or a header")
            elif kind == "literal" and not tag.literal.value:
                report.error((*tag_path, "literal", "value"), "a literal custom tag must have a value")
            elif kind in ("environment", "header") and not getattr(tag, kind).name:
                report.error((*tag_path, kind, "name"), f"a {kind} custom tag must name one")
    if len(telemetry.tracing) > 1:
        report.warn(("spec", "tracing"), "multiple tracing entries are not supported: Istio uses the first")
    for i, _ in enumerate(telemetry.metrics):
        report.error(
            ("spec", "metrics", i),
            "metrics need Istio's stats filter (istio.stats), which upstream Envoy does not have: "
            "meshctl cannot serve metrics providers or overrides",
        )
    return report.issues
