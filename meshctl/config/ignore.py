"""`.meshctlignore`: what a config tree holds that is not config.

A repository often keeps its mesh config beside things that look like it and are not: expected
Envoy output, test inputs that define the same resource twice on purpose, Helm templates, a CI
job's scratch files. Pointing `meshctl validate .` or `meshctl serve` at the repository root
then reports them all. A `.meshctlignore` file in any directory of the tree names entries below
it that are not read, in the subset of `.gitignore`'s syntax that needs no explanation:

- one pattern per line; blank lines and lines starting with `#` are skipped;
- a pattern without a `/` matches a file or directory name at any depth below the ignore file
  (`*.tmpl.yaml`, `golden`);
- a pattern with a `/` (a leading one is dropped) matches the path relative to the ignore file's
  directory, one name per `/` (`tests/golden`, `charts/*/templates`);
- a trailing `/` matches directories only (`tests/`);
- `*`, `?` and `[...]` match within one name; `**` and negation (`!pattern`) are not supported,
  and a line using them is reported and skipped rather than guessed at.

The file is untrusted input like the rest of the tree: read under the same rules (a regular file,
bounded in size), and one that cannot be read ignores nothing and says why. It is read when the
tree is walked, so an edit to it takes effect at the next full pass (start-up, SIGHUP, the
periodic pass), not on its own event: it is a hidden file, and hidden files raise no reload.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

from meshctl.config.findings import Finding, Severity

IGNORE_FILE: Final = ".meshctlignore"
#: An ignore file is a short list of patterns; a bigger one is a mistake, not a list.
IGNORE_LIMIT: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern of the ignore file in `base`: `parts` names, matched against the entry's path
    relative to `base` when `anchored`, else against its name alone."""

    base: str
    parts: tuple[str, ...]
    anchored: bool
    directories_only: bool
    line: int

    def matches(self, path: str, name: str, is_dir: bool) -> bool:
        if self.directories_only and not is_dir:
            return False
        if not self.anchored:
            return fnmatchcase(name, self.parts[0])
        relative = os.path.relpath(path, self.base).split(os.sep)
        return len(relative) == len(self.parts) and all(map(fnmatchcase, relative, self.parts))


def parse_rules(directory: str, text: str) -> tuple[list[Rule], list[Finding]]:
    """The rules of the ignore file in `directory` whose content is `text`, with a finding for
    each line that was skipped (the walk reads the file: `files.walk_yaml`)."""
    path = os.path.join(directory, IGNORE_FILE)
    rules: list[Rule] = []
    findings: list[Finding] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rule, problem = _parse(directory, line, number)
        if rule is not None:
            rules.append(rule)
        else:
            findings.append(Finding(Severity.WARNING, f"pattern {line!r} skipped: {problem}", path, number, 1))
    return rules, findings


def _parse(base: str, line: str, number: int) -> tuple[Rule | None, str]:
    if line.startswith("!"):
        return None, "negation is not supported; list what to ignore instead"
    if "**" in line:
        return None, "`**` is not supported; name the directory (`tests/`) or use a name pattern"
    directories_only = line.endswith("/")
    body = line.strip("/")
    if not body:
        return None, "it matches nothing"
    parts = tuple(body.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        return None, "a path must name entries below the ignore file's directory"
    anchored = len(parts) > 1 or line.startswith("/")
    return Rule(base, parts, anchored, directories_only, number), ""


def ignored_by(rules: list[Rule], path: str, is_dir: bool) -> Rule | None:
    """The first rule that keeps `path` out of the walk, if any."""
    name = os.path.basename(path)
    return next((r for r in rules if r.matches(path, name, is_dir)), None)
