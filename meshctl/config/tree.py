"""A whole config tree loaded: every YAML file under some paths, in a stable order, each file
loaded by the loader, in forked workers when the tree is big enough to pay for them.

Kept apart from `loader` (one file) and `parallel` (the workers), which both sit below it, so the
imports run one way: tree -> parallel -> loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from meshctl.config.files import walk_yaml
from meshctl.config.findings import Finding
from meshctl.config.loader import LoadOptions, LoadResult, _file_error
from meshctl.config.parallel import load_files


def load_paths(paths: Sequence[Path], options: LoadOptions | None = None) -> LoadResult:
    """Load every YAML file under `paths`; a missing path is a finding, not an exception.

    With `options.workers` other than 1, a big tree is loaded by forked processes
    (`meshctl.config.parallel`); the result is the same, in the same order."""
    options = options or LoadOptions()
    tree_findings: list[Finding] = []
    existing: list[Path] = []
    for path in paths:
        if path.exists():
            existing.append(path)
        else:
            tree_findings.append(_file_error(str(path), "no such file or directory"))
    walk = walk_yaml(existing)
    tree_findings.extend(walk.findings)
    found = walk.files
    files = {str(p): result for p, result in zip(found, load_files(found, options), strict=True)}
    return LoadResult(files, tuple(tree_findings))
