"""How big a regex may compile in Envoy: the RE2 program size limit, shared with the bootstrap.

Envoy compiles every `safe_regex` with RE2 and refuses the config holding one whose compiled
program is larger than the runtime value `re2.max_program_size.error_level` (100 when unset, which
`^/(alpha|beta){20,40}$`-style patterns exceed at once). A refused regex NACKs the whole route
configuration, so the proxy keeps serving stale routes for every host in it.

Istio's bootstrap raises the limit to 32768 (`pkg/bootstrap/config.go`, `extractRuntimeFlags`),
and `meshctl bootstrap` sets the same value from `RE2_MAX_PROGRAM_SIZE` below, so a regex that
works under Istio works here. `meshctl validate` (and the loader of `meshctl serve`) reports a
regex over that limit as an error, since every proxy started from `meshctl bootstrap` would
refuse it. A proxy started from another bootstrap has the limit that bootstrap sets.

The size is RE2's own count (`RE2::ProgramSize()`), the number Envoy compares: google-re2's
`programsize` with default options, which are Envoy's (`RE2::Quiet` changes only logging).
"""

from __future__ import annotations

import re
from typing import Final, Protocol

#: `re2.max_program_size.error_level` in the bootstrap's runtime layer, and the largest program
#: size `meshctl validate` accepts. Istio's value (`pkg/bootstrap/config.go`).
RE2_MAX_PROGRAM_SIZE: Final = 32768
_RE2_SPECIAL: Final = re.compile(r"([\\.^$|?*+()\[\]{}])")


def re2_escape(text: str) -> str:
    """`text` as an RE2 literal (only the characters RE2 gives a meaning, so names stay legible)."""
    return _RE2_SPECIAL.sub(r"\\\1", text)


class CompiledRegex(Protocol):
    """What is read of a compiled `re2` pattern (google-re2's `_Regexp`)."""

    @property
    def programsize(self) -> int: ...


def program_size_problem(compiled: CompiledRegex, limit: int = RE2_MAX_PROGRAM_SIZE) -> str | None:
    """Why Envoy would refuse this compiled regex for its size, or None when it fits."""
    size = compiled.programsize
    if size <= limit:
        return None
    return (
        f"regex compiles to an RE2 program of size {size}, over Envoy's limit of {limit} "
        "(re2.max_program_size.error_level in meshctl's bootstrap, as in Istio's): Envoy would reject "
        "the whole route configuration; use smaller repetition counts or fewer alternatives"
    )
