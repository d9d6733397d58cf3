"""The watcher's kept merge (`config/merged.py`) agrees with a merge of the whole tree after any
sequence of file edits: the same winner for every key, the same duplicate errors on each file."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.config.loader import FileResult, load_text, merge_files
from meshctl.config.merged import MergedFiles
from meshctl.config.scan import Position

FILES = [f"/mesh/{name}.yaml" for name in ("a", "b", "c", "d")]
NAMES = ["x", "y", "z"]


def vs(name: str) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: {name}
  namespace: shop
spec:
  hosts:
  - {name}.shop.mesh
  http:
  - route:
    - destination:
        host: {name}.shop.mesh
"""


def load(path: str, names: list[str]) -> FileResult:
    result = load_text("---\n".join(vs(n) for n in names), path)
    assert result.ok, result.findings
    return result


def position(path: str) -> Position:
    return (0, ((0, path.rsplit("/", 1)[1]),))


names = st.lists(st.sampled_from(NAMES), max_size=3, unique=True)
edits = st.lists(st.tuples(st.sampled_from(FILES), names), min_size=1, max_size=12)


def kept(path: str, names: list[str], previous: FileResult | None) -> FileResult:
    """`load`, keeping the very objects of `previous` for the resources that neither changed nor
    moved, as the watcher's loader does for documents whose text is the same."""
    result = load(path, names)
    same = {(c.key, c.source): c for c in previous.configs} if previous is not None else {}
    return FileResult(path, tuple(same.get((c.key, c.source), c) for c in result.configs))


def check(first: list[str], steps: list[tuple[str, list[str]]], keep: bool) -> None:
    tree = {FILES[0]: load(FILES[0], first)}
    configs, duplicates = merge_files(tree[p] for p in sorted(tree))
    merged = MergedFiles(dict(configs), duplicates)
    for path, names in steps:
        result = (kept(path, names, tree.get(path)) if keep else load(path, names)) if names else None
        before = {path: tree[path].configs} if path in tree else {}
        after = {path: result.configs} if result is not None else {}
        plan = merged.plan(before, after, lambda p: tree[p].configs if p in tree else (), position)
        merged.adopt(plan)
        if result is None:
            tree.pop(path, None)
        else:
            tree[path] = result
        whole, found = merge_files(tree[p] for p in sorted(tree))
        assert merged.configs == whole
        by_file: dict[str, list[str]] = {}
        for finding in found:
            by_file.setdefault(finding.file or "", []).append(str(finding))
        assert {p: [str(f) for f in fs] for p, fs in merged.duplicates.items()} == by_file


@settings(max_examples=150, deadline=None)
@given(names, edits)
def test_the_kept_merge_is_the_whole_merge_after_any_edits(
    first: list[str], steps: list[tuple[str, list[str]]]
) -> None:
    check(first, steps, keep=False)


@settings(max_examples=150, deadline=None)
@given(names, edits)
def test_the_kept_merge_is_the_whole_merge_when_unchanged_resources_keep_their_objects(
    first: list[str], steps: list[tuple[str, list[str]]]
) -> None:
    """Only the keys of new objects are planned: the others keep their winners and errors."""
    check(first, steps, keep=True)
