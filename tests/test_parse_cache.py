"""The parse of each config file kept across restarts in the state directory (`config/parse_cache`).

What a user sees must not depend on whether a file's parse came from the cache: the loader's
resources, findings and their positions are compared with and without it over every YAML file
of the repository's examples and test meshes. A restart parses only what changed, counted at the
parser itself. A cache file that cannot be trusted (corrupt, cut short, another version, huge,
nested without end, a FIFO, a link) costs one warning and a parse of every file, never a wrong
or stuck load, and is then written again whole.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.config import yamlsource
from meshctl.config.files import decode_text
from meshctl.config.loader import FileResult, LoadOptions, load_bytes
from meshctl.config.parse_cache import STATE_FILE, ParseCache
from meshctl.config.store import ConfigStore
from meshctl.config.watcher import DirectoryWatcher, WatchOptions
from meshctl.errors import YamlError
from meshctl.testing.server import run, serving

PARSE = yamlsource.parse_documents

REPO = Path(__file__).resolve().parent.parent
OPTIONS = LoadOptions()
#: No background reloads: each test drives its reloads itself.
QUIET = WatchOptions(resync_period=0)


def corpus() -> dict[str, bytes]:
    """Every YAML file of the examples and the test meshes, plus texts that reach the parser's
    corners: aliases and merge keys, a flow colon Go reads as text, keys that are not strings
    (JSON cannot keep them), floats JSON writes as words, a file of many documents (loaded
    document by document), a byte-order mark, and files that do not parse."""
    found = {
        str(p.relative_to(REPO)): p.read_bytes()
        for top in ("examples", "tests")
        for p in sorted((REPO / top).rglob("*.y*ml"))
    }
    se = (
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: s{i}\n  namespace: shop\n"
        "spec:\n  hosts: [s{i}.shop.mesh]\n  addresses: [10.0.0.{i}, 2001:db8::{i}]\n"
        "  ports:\n  - {{number: 80, name: http, protocol: HTTP}}\n  resolution: STATIC\n"
    )
    found |= {
        "crafted/anchors.yaml": b"base: &b {x: 1, y: [a, b]}\nuse:\n  <<: *b\n  y: 3\nother: *b\n",
        "crafted/flow-colon.yaml": se.format(i=1).encode(),
        "crafted/int-keys.yaml": (
            b"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: m\n  labels: {80: http}\n"
            b"spec: {hosts: [m.shop.mesh], ports: [{number: 80, name: http}], resolution: DNS}\n"
        ),
        "crafted/floats.yaml": b"a: .inf\nb: -.inf\nc: .nan\nd: -0.0\ne: 1e400\nf: 123456789012345678901234567890\n",
        "crafted/many.yaml": "---\n".join(se.format(i=i) for i in range(80)).encode(),
        "crafted/many-broken.yaml": ("---\n".join(se.format(i=i) for i in range(70)) + "---\nx: [\n").encode(),
        "crafted/bom.yaml": "\ufeff".encode() + se.format(i=7).encode() + "  exportTo: ['.']  # é\n".encode(),
        "crafted/broken.yaml": b"kind: VirtualService\nspec: {a: 1\n",
        "crafted/empty.yaml": b"",
        "crafted/empty-docs.yaml": b"---\n---\n# nothing\n---\nkind: X\n",
        "crafted/invalid.yaml": (
            b"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: Bad_Name\n"
            b"spec:\n  hosts: []\n  http:\n  - route:\n    - destination: {host: ''}\n      weight: -1\n"
        ),
    }
    return found


def seen(result: FileResult) -> tuple[Any, ...]:
    """What a user sees of a file's load: each resource (content and place), each finding."""

    def configs(items: tuple[Any, ...]) -> list[Any]:
        return [(c.key, c.api_version, c.source, dict(c.labels), c.created, c.content_digest()) for c in items]

    return (configs(result.configs), configs(result.rejected), result.findings)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the YAML parser is asked to build documents from."""
    texts: list[str] = []
    real = PARSE

    def counting(text: str, **kwargs: Any) -> list[yamlsource.Document]:
        texts.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(yamlsource, "parse_documents", counting)
    return texts


def new_cache(path: Path, **kwargs: Any) -> ParseCache:
    return ParseCache(path, max_values=OPTIONS.max_values, max_alias_values=OPTIONS.max_alias_values, **kwargs)


def load_all(files: dict[str, bytes], cache: ParseCache | None, *, pieces: bool) -> dict[str, tuple[Any, ...]]:
    """Each file loaded as the watcher loads it the first time (`pieces`) or as `load_text` does."""
    out = {}
    for name, raw in files.items():
        previous = FileResult(name) if pieces else None
        out[name] = seen(load_bytes(raw, name, OPTIONS, previous=previous, parse_cache=cache))
    if cache is not None:
        cache.settle(files)
        cache.join()
    return out


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "by-document"])
def test_a_load_from_the_cache_is_the_load_of_a_parse(tmp_path: Path, pieces: bool, parses: list[str]) -> None:
    files = corpus()
    assert len(files) > 60
    plain = load_all(files, None, pieces=pieces)
    cold = new_cache(tmp_path / STATE_FILE)
    assert load_all(files, cold, pieces=pieces) == plain
    parses.clear()

    warm = new_cache(tmp_path / STATE_FILE)
    assert load_all(files, warm, pieces=pieces) == plain
    # Parsed again: the files that do not parse, and the one whose keys JSON cannot keep.
    texts = {name: decode_text(raw) for name, raw in files.items()}
    again = {name for name, text in texts.items() if not _parses(text)} | {"crafted/int-keys.yaml"}
    assert {"crafted/broken.yaml", "crafted/many-broken.yaml"} <= again
    assert (warm.hits, warm.parses) == (len(files) - len(again), 1)
    assert parses and all(any(t in texts[name] for name in again) for t in parses)


def _parses(text: str) -> bool:
    try:
        PARSE(text)
    except YamlError:
        return False
    return True


def tree(root: Path, count: int) -> dict[str, str]:
    texts = {}
    for i in range(count):
        texts[f"s{i:03d}.yaml"] = (
            f"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: s{i}\n  namespace: shop\n"
            f"spec:\n  hosts: [s{i}.shop.mesh]\n  ports:\n  - {{number: 80, name: http, protocol: HTTP}}\n"
            f"  resolution: DNS\n"
        )
    for name, text in texts.items():
        (root / name).write_text(text)
    return texts


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    root, state = tmp_path / "mesh", tmp_path / "state"
    root.mkdir()
    tree(root, 30)
    yield root, state / STATE_FILE


def start(root: Path, cache_file: Path) -> tuple[ConfigStore, ParseCache]:
    """One start of a watcher over `root` with the cache, stopped once its first pass is written."""
    store = ConfigStore()
    cache = new_cache(cache_file)
    watcher = DirectoryWatcher([root], store, QUIET, cache)
    watcher.reload_now()
    cache.join()
    return store, cache


def test_a_restart_parses_only_the_files_that_changed(mesh: tuple[Path, Path], parses: list[str]) -> None:
    root, cache_file = mesh
    start(root, cache_file)
    assert len(parses) == 30
    (root / "s005.yaml").write_text((root / "s005.yaml").read_text().replace("DNS", "STATIC"))
    (root / "s006.yaml").unlink()
    (root / "new.yaml").write_text((root / "s007.yaml").read_text().replace("s7", "n7"))
    parses.clear()

    store, cache = start(root, cache_file)
    assert sorted(parses) == sorted([(root / "s005.yaml").read_text(), (root / "new.yaml").read_text()])
    assert (cache.hits, cache.parses) == (28, 2)
    fresh = ConfigStore()
    DirectoryWatcher([root], fresh, QUIET).reload_now()
    assert {k: c.content_digest() for k, c in store.configs.items()} == {
        k: c.content_digest() for k, c in fresh.configs.items()
    }
    assert {c.source for c in store.configs.values()} == {c.source for c in fresh.configs.values()}
    # Rewritten with the tree's texts only: the deleted file's and the old s005's are gone.
    lines = cache_file.read_text().splitlines()
    assert len(lines) == 1 + 30

    parses.clear()
    _, cache = start(root, cache_file)
    assert (parses, cache.hits) == ([], 30)


def test_the_cache_file_keeps_within_its_size_limit(mesh: tuple[Path, Path]) -> None:
    root, cache_file = mesh
    store = ConfigStore()
    cache = new_cache(cache_file, max_bytes=4000)
    DirectoryWatcher([root], store, QUIET, cache).reload_now()
    cache.join()
    assert 0 < cache_file.stat().st_size <= 4000
    assert 1 < len(cache_file.read_text().splitlines()) < 31


def _valid(cache_file: Path) -> str:
    return cache_file.read_text()


def _only_entry(cache_file: Path, body: str) -> None:
    """The cache file with its first entry's key given `body`, and nothing else."""
    head, first = cache_file.read_text().splitlines()[:2]
    header = json.loads(head) | {"entries": 1}
    cache_file.write_text(f"{json.dumps(header)}\n{first[:32]} {body}\n")


HOSTILE: dict[str, Callable[[Path], None]] = {
    "garbage": lambda f: f.write_bytes(os.urandom(5000)),
    "cut short": lambda f: f.write_text(_valid(f)[: len(_valid(f)) // 2]),
    "another version": lambda f: f.write_text(_valid(f).replace('"identity":"', '"identity":"0.0.0 ', 1)),
    "another format": lambda f: f.write_text('{"format":"something/9"}\n' + "\n".join(_valid(f).splitlines()[1:])),
    "cut at a line": lambda f: f.write_text("".join(_valid(f).splitlines(keepends=True)[:10])),
    "nested beyond JSON": lambda f: _only_entry(f, "[" * 200_000 + "]" * 200_000),
    "nested beyond a parse": lambda f: _only_entry(f, "[[0,1,1," + "[" * 150 + "]" * 150 + "]]"),
    "not documents": lambda f: _only_entry(f, json.dumps([[0, 0, 1, {"kind": "x"}]])),
    "too many values": lambda f: _only_entry(f, json.dumps([[0, 1, 1, list(range(1_000_001))]])),
    "huge": lambda f: os.truncate(f, 65 * 1024 * 1024),
    "a FIFO": lambda f: (f.unlink(), os.mkfifo(f)),
    "a directory": lambda f: (f.unlink(), f.mkdir()),
    "a link": lambda f: (f.rename(f.with_name("elsewhere")), f.symlink_to(f.with_name("elsewhere"))),
}


@pytest.mark.parametrize("spoil", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_cache_file_that_cannot_be_used_costs_a_warning_and_a_parse(
    mesh: tuple[Path, Path], spoil: Callable[[Path], None], parses: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    root, cache_file = mesh
    start(root, cache_file)
    fresh = ConfigStore()
    DirectoryWatcher([root], fresh, QUIET).reload_now()
    spoil(cache_file)
    parses.clear()

    with caplog.at_level(logging.WARNING, logger="meshctl.config.parse_cache"):
        store, cache = start(root, cache_file)
    assert {k: c.content_digest() for k, c in store.configs.items()} == {
        k: c.content_digest() for k, c in fresh.configs.items()
    }
    assert len(parses) == 30 and cache.hits == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ignoring the parse cache" in warnings[0], warnings
    if cache_file.is_dir():
        return  # nothing can be written in its place; the server parses at every start
    # Written again whole, as a regular file, and used by the next start.
    assert not cache_file.is_symlink() and cache_file.is_file()
    parses.clear()
    _, cache = start(root, cache_file)
    assert (parses, cache.hits) == ([], 30)


def test_serve_keeps_the_parse_in_its_state_directory(tmp_path: Path) -> None:
    root, state = tmp_path / "mesh", tmp_path / "state"
    root.mkdir()
    tree(root, 5)

    async def body() -> None:
        for hits in (0, 5):
            async with serving(root, state_dir=state) as server:
                cache = server.watcher._parse_cache
                assert cache is not None and cache.hits == hits
                assert len(server.store.configs) == 5
        assert len((state / STATE_FILE).read_text().splitlines()) == 6

    run(body)


def test_no_state_directory_no_cache(tmp_path: Path) -> None:
    root = tmp_path / "mesh"
    root.mkdir()
    tree(root, 2)
    before = set(os.listdir(tmp_path))

    async def body() -> None:
        async with serving(root) as server:
            assert server.watcher._parse_cache is None

    run(body)
    assert set(os.listdir(tmp_path)) == before
    shutil.rmtree(root)


def test_a_fifo_where_the_cache_is_written_blocks_nothing(
    mesh: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    root, cache_file = mesh
    cache_file.parent.mkdir()
    os.mkfifo(cache_file.with_name(f".{cache_file.name}.tmp"))
    cache = new_cache(cache_file)
    with caplog.at_level(logging.WARNING, logger="meshctl.config.parse_cache"):
        DirectoryWatcher([root], ConfigStore(), QUIET, cache).reload_now()
        cache.join(timeout=30)
    assert cache._writer is not None and not cache._writer.is_alive()
    assert not cache_file.exists()
    assert [r.getMessage() for r in caplog.records if "cannot write the parse cache" in r.getMessage()]
