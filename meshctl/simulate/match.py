"""Envoy's matchers, evaluated on a simulated request: StringMatcher, HeaderMatcher,
QueryParameterMatcher and a route's path specifier, with Envoy's rules for absent headers,
`invert_match`, `ignore_case` and `case_sensitive`.

Regexes are RE2, as Envoy's `safe_regex` is, through google-re2, and they must match the whole
value (Envoy's `full_match`). A matcher of a kind not modelled here never matches, and `describe`
in the result names it, so an unmodelled match shows as such instead of as a wrong answer.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

from meshctl.simulate.request import Request


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    return re2.compile(pattern)


def regex_full_match(pattern: str, value: str) -> bool:
    try:
        return _regex(pattern).fullmatch(value) is not None
    except re2.error:  # Envoy rejects the config; nothing it could route by
        return False


def string_matches(matcher: Any, value: str) -> bool:
    """envoy.type.matcher.v3.StringMatcher."""
    kind = matcher.WhichOneof("match_pattern")
    fold = matcher.ignore_case and kind != "safe_regex"
    text = value.lower() if fold else value
    if kind == "safe_regex":
        return regex_full_match(matcher.safe_regex.regex, value)
    if kind is None:
        return False
    wanted = getattr(matcher, kind)
    wanted = wanted.lower() if fold else wanted
    if kind == "exact":
        return bool(text == wanted)
    if kind == "prefix":
        return bool(text.startswith(wanted))
    if kind == "suffix":
        return bool(text.endswith(wanted))
    if kind == "contains":
        return bool(wanted in text)
    return False


def request_header(request: Request, name: str) -> str | None:
    """A header as Envoy's matchers see it, pseudo-headers included."""
    pseudo = {
        ":authority": request.authority,
        ":method": request.method,
        ":path": request.path_and_query,
        ":scheme": request.scheme,
    }
    lower = name.lower()
    if lower in pseudo:
        return pseudo[lower]
    if lower == "host":
        return request.authority
    return request.headers.get(lower)


def header_matches(matcher: Any, request: Request) -> bool:
    """envoy.config.route.v3.HeaderMatcher, `invert_match` applied last as Envoy does."""
    value = request_header(request, matcher.name)
    kind = matcher.WhichOneof("header_match_specifier")
    if kind == "present_match":
        return ((value is not None) == bool(matcher.present_match)) != bool(matcher.invert_match)
    if value is None:
        if not matcher.treat_missing_header_as_empty:
            return bool(matcher.invert_match)
        value = ""
    if kind is None:  # no specifier: the header must be present
        matched = True
    elif kind == "string_match":
        matched = string_matches(matcher.string_match, value)
    elif kind == "exact_match":
        matched = value == matcher.exact_match
    elif kind == "prefix_match":
        matched = value.startswith(matcher.prefix_match)
    elif kind == "suffix_match":
        matched = value.endswith(matcher.suffix_match)
    elif kind == "contains_match":
        matched = matcher.contains_match in value
    elif kind == "safe_regex_match":
        matched = regex_full_match(matcher.safe_regex_match.regex, value)
    elif kind == "range_match":
        matched = value.lstrip("-").isdigit() and matcher.range_match.start <= int(value) < matcher.range_match.end
    else:
        matched = False
    return matched != bool(matcher.invert_match)


def query_matches(matcher: Any, request: Request) -> bool:
    """envoy.config.route.v3.QueryParameterMatcher: the first value of the parameter."""
    values = [v for k, v in request.query_params() if k == matcher.name]
    kind = matcher.WhichOneof("query_parameter_match_specifier")
    if not values:
        return False
    if kind == "string_match":
        return string_matches(matcher.string_match, values[0])
    if kind == "present_match":
        return bool(matcher.present_match)
    return kind is None  # no specifier: the parameter must be present


def path_matches(match: Any, request: Request) -> bool:
    """The path specifier of a RouteMatch, on the path without its query."""
    kind = match.WhichOneof("path_specifier")
    sensitive = not match.HasField("case_sensitive") or match.case_sensitive.value
    path = request.path
    folded = path if sensitive else path.lower()

    def fold(value: str) -> str:
        return value if sensitive else value.lower()

    if kind == "prefix":
        return folded.startswith(fold(match.prefix))
    if kind == "path":
        return folded == fold(match.path)
    if kind == "safe_regex":
        return regex_full_match(match.safe_regex.regex, path)
    if kind == "path_separated_prefix":
        prefix = fold(match.path_separated_prefix)
        return folded == prefix or folded.startswith(prefix + "/")
    return False


def route_matches(match: Any, request: Request) -> bool:
    """A whole RouteMatch: path, then every header, then every query parameter. A runtime
    fraction is taken as its default being met (it is a sampling, not a condition of the request)."""
    return (
        path_matches(match, request)
        and all(header_matches(h, request) for h in match.headers)
        and all(query_matches(q, request) for q in match.query_parameters)
    )
