"""A file edited is loaded again by the stretch that changed, and gives what loading it whole gives.

The watcher's load of a file it loaded before (`load_bytes(..., previous=)`) compares the new
text with the last one, keeps the documents of the text both share at the start and at the end,
and cuts, parses and validates only the stretch between (`config/documents.py`). That is only
right where cutting at `---` lines is what libyaml does, so hypothesis writes files with what
makes cutting hard: markers inside block scalars, quoted strings and comments, `...` ends,
markers with text, tabs or comments after them, a byte-order mark, CRLF, lone CR and other
line breaks libyaml knows, directives, empty documents, anchors and aliases over a small alias
budget, documents that do not parse and documents with findings at a field. Each file is then
edited a few times, by documents and by bytes, and every load must equal a whole load of the
same text: the same resources at the same file:line, the same findings at the same lines. So
must every YAML file of the examples and the test meshes, padded to a file loaded by pieces.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_documents import BROKEN

from meshctl.config import documents
from meshctl.config.files import decode_text
from meshctl.config.loader import FileResult, LoadOptions, load_bytes, load_text

REPO = Path(__file__).resolve().parent.parent
FILE = "catalog.yaml"
#: A small alias budget, so that aliases spread over documents can exceed it together.
OPTIONS = LoadOptions(default_namespace="shop", max_alias_values=500)

ENTRY = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: e{n}, namespace: shop}}
spec:
  hosts: [e{n}.shop.mesh]
  ports: [{{number: 80, name: web, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 10.0.0.{n}}}]
"""
#: A block scalar holding what looks like markers but is indented, and ending at the file's
#: next marker (a `---` at column 0 ends any scalar).
NOTED = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: n{n}
  namespace: shop
  annotations:
    before: "--- quoted, not a marker"
    single: '--- nor this'
    note: |
      a line
      --- indented: no marker
      ...
spec:
  hosts: [n{n}.shop.mesh]
  http: [{{route: [{{destination: {{host: n{n}.shop.mesh}}}}]}}]
# --- a comment
#---
"""
TRAILING = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: t{n}
  namespace: shop
  annotations:
    last: >
      folded text that the next marker ends
spec: {{hosts: [t{n}.shop.mesh], http: [{{route: [{{destination: {{host: t{n}.shop.mesh}}}}]}}]}}
  \n"""
ALIASED = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: a{n}, namespace: shop, labels: &l {{app: a{n}, tier: web}}}}
spec:
  hosts: [a{n}.shop.mesh]
  ports: [{{number: 80, name: web, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 10.1.0.{n}, labels: *l}}, {{address: 10.2.0.{n}, labels: *l}}]
  subjectAltNames: &s [x{n}, y{n}, z{n}, w{n}, v{n}, u{n}, t{n}, q{n}, r{n}, p{n}]
  exportTo: [".", "*"]
other: [*s, *s]
"""
FLOW_COLON = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: f{n}, namespace: shop}}
spec:
  hosts: [f{n}.shop.mesh]
  addresses: [10.9.0.{n}, 2001:db8::{n}]
  ports: [{{number: 80, name: web, protocol: HTTP}}]
  resolution: STATIC
"""
ODD = [
    "",
    "# only a comment\n",
    "[1, 2]\n",
    "kind: Unknown\napiVersion: example.com/v1\n",
    "a: [\n",
    'note: "starts\n---\n  inside a quoted scalar"\n',
    "a: 1\n...\n",
    "a: 1\n... # the end\n",
    "a: 1\n...\nb: 2\n",
    "a: 'lone\r carriage return'\n",
    "a: 'next\u0085 line'\n",
    "a: 'line\u2028 separator'\n",
    "a: \ufeff1\n",
    "\ufeff---\n",
    "a: 1\n%YAML 1.2\n",
    "a: 1\n\tb: 2\n",
    "x: &x [*x]\n",
]
BODIES = st.one_of(
    st.integers(1, 40).map(lambda n: ENTRY.format(n=n)),
    st.integers(1, 40).map(lambda n: ENTRY.format(n=n)),
    st.integers(1, 40).map(lambda n: ENTRY.format(n=n)),
    st.integers(1, 9).map(lambda n: NOTED.format(n=n)),
    st.integers(1, 9).map(lambda n: TRAILING.format(n=n)),
    st.integers(1, 9).map(lambda n: ALIASED.format(n=n)),
    st.integers(1, 3).map(lambda n: BROKEN.format(n=n)),
    st.integers(1, 3).map(lambda n: FLOW_COLON.format(n=n)),
    st.sampled_from(ODD[:4]),
)
#: Documents most files hold none of (each makes the whole file load whole, or fail).
RARE = st.sampled_from(ODD[4:])
#: How a document starts: `---` alone, with spaces, a tab or a comment after it, or with the
#: document's first node on the marker's line.
MARKERS = st.sampled_from(["---\n", "---\n", "---\n", "--- \n", "---\t\n", "--- # next\n", "---\n\n", "--- "])


def _document(marker: str, body: str) -> str:
    return marker + ("!!map\n" + body if marker == "--- " else body)


DOCUMENT = st.builds(_document, MARKERS, BODIES)
ANY_DOCUMENT = st.builds(_document, MARKERS, st.one_of(BODIES, BODIES, BODIES, RARE))
HEADS = st.sampled_from(["", "", "# a catalog\n", "\n", ENTRY.format(n=99), "  \n", "x: 1\n...\n", "%YAML 1.2\n"])
#: Bytes an edit may insert anywhere: line breaks, markers, quotes, indentation, directives.
SNIPPETS = st.sampled_from(
    ["\n", "---\n", "\n---\n", "\n--- ", "  ", "x", "'", '"', "%", "\r", "\n...\n", "#", ": ", "-"]
)


def _encode(text: str, crlf: bool, bom: bool) -> bytes:
    if crlf:
        text = text.replace("\r", "").replace("\n", "\r\n")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode()


def _summary(result: FileResult) -> tuple[object, ...]:
    def configs(found: tuple[object, ...]) -> list[object]:
        return [(c.key, c.source, c.api_version, c.content_digest()) for c in found]  # type: ignore[attr-defined]

    return tuple(configs(result.configs)), result.findings, tuple(configs(result.rejected))


def _whole(data: bytes) -> FileResult:
    return load_text(decode_text(data), FILE, OPTIONS)


def _edited(docs: list[str], edit: tuple[str, int, str, str, float]) -> list[str] | str:
    """The documents after a document edit, or the text after a byte edit."""
    how, at, doc, snippet, where = edit
    docs = list(docs)
    i = at % (len(docs) + 1)
    if how == "insert":
        docs.insert(i, doc)
    elif how == "delete" and i < len(docs):
        del docs[i]
    elif how == "replace" and i < len(docs):
        docs[i] = doc
    elif how == "swap" and i + 1 < len(docs):
        docs[i], docs[i + 1] = docs[i + 1], docs[i]
    elif how == "bytes":
        text = "".join(docs)
        cut = int(where * len(text))
        return text[:cut] + snippet + text[cut:]
    elif how == "marker":  # at, in or just after a marker: where cuts are decided
        text = "".join(docs)
        found = [i for i in range(len(text)) if text.startswith("\n---", i)]
        if found:
            cut = found[at % len(found)] + int(where * 6)
            return text[:cut] + snippet + text[cut + at % 2 :]  # inserted, or in place of a byte
    return docs


EDITS = st.tuples(
    st.sampled_from(["insert", "delete", "replace", "swap", "bytes", "marker"]),
    st.integers(0, 100),
    ANY_DOCUMENT,
    SNIPPETS,
    st.floats(0, 1),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    head=HEADS,
    docs=st.lists(DOCUMENT, min_size=64, max_size=72),
    rare=st.lists(st.tuples(st.integers(0, 72), RARE.map(lambda b: "---\n" + b)), max_size=1).filter(
        lambda r: not r or r[0][0] % 3 == 0  # in a third of the files
    ),
    edits=st.lists(EDITS, min_size=1, max_size=4),
    encoding=st.tuples(st.booleans(), st.booleans()),
)
def test_a_file_loaded_by_the_stretch_that_changed_gives_what_a_whole_load_gives(
    head: str,
    docs: list[str],
    rare: list[tuple[int, str]],
    edits: list[tuple[str, int, str, str, float]],
    encoding: tuple[bool, bool],
) -> None:
    crlf, bom = encoding
    for at, doc in rare:
        docs.insert(at, doc)
    pieces = [head, *docs]
    data = _encode("".join(pieces), crlf, bom)
    last = load_bytes(data, FILE, OPTIONS, previous=FileResult(FILE))
    assert _summary(last) == _summary(_whole(data))
    for edit in edits:
        after = _edited(pieces, edit)
        if isinstance(after, str):  # a byte edit: the next edits work on its text as one piece
            pieces, text = [after], after
        else:
            pieces, text = after, "".join(after)
        data = _encode(text, crlf, bom)
        again = load_bytes(data, FILE, OPTIONS, previous=last)
        assert _summary(again) == _summary(_whole(data)), edit
        last = again


def _filler(start: int) -> str:
    entries = (ENTRY.format(n=n % 250).replace(f"e{n % 250}", f"pad{n}") for n in range(start, start + 64))
    return "".join("---\n" + entry for entry in entries)


def test_every_yaml_file_of_the_repository_loads_by_pieces_as_it_loads_whole() -> None:
    """Each example and test mesh, first in a file of many documents, then with a document
    inserted before it (its lines move) and with its own text edited in the middle."""
    files = sorted(p for top in ("examples", "tests") for p in (REPO / top).rglob("*.y*ml"))
    assert len(files) > 40
    for path in files:
        text = decode_text(path.read_bytes())
        first = text + ("" if text.endswith("\n") or not text else "\n") + _filler(0)
        last = load_bytes(first.encode(), FILE, OPTIONS, previous=FileResult(FILE))
        assert _summary(last) == _summary(_whole(first.encode())), path
        middle = len(text) // 2
        for again in (_filler(500)[4:] + "---\n" + first, first[:middle] + "\n" + first[middle:]):
            result = load_bytes(again.encode(), FILE, OPTIONS, previous=last)
            assert _summary(result) == _summary(_whole(again.encode())), path
            last = result


def test_a_line_break_libyaml_counts_and_a_cut_would_not_moves_no_finding() -> None:
    """A lone CR (or NEL, LS, PS) is a line break to libyaml: every document after it starts a
    line further down than the "\\n"s say, and its findings must say so."""
    for brk in ("\r", "\u0085", "\u2028", "\u2029"):
        docs = [ENTRY.format(n=n) for n in range(1, 70)]
        docs[3] = docs[3].replace("namespace: shop}", f'namespace: shop, annotations: {{note: "a{brk} b"}}}}')
        docs[60] = BROKEN.format(n=1)
        text = "---\n" + "---\n".join(docs)
        result = load_bytes(text.encode(), FILE, OPTIONS, previous=FileResult(FILE))
        whole = _whole(text.encode())
        assert [f.line for f in result.findings] == [f.line for f in whole.findings] != [], repr(brk)
        assert _summary(result) == _summary(whole)


def test_aliases_kept_across_edits_count_against_the_file_budget() -> None:
    """Each document's aliases fit the file's budget, but not all of them together: an edit that
    parses one more such document must reject the file, as a whole load does."""
    options = LoadOptions(default_namespace="shop", max_alias_values=100)
    docs = [ENTRY.format(n=n) for n in range(1, 70)]
    first = "---\n" + "---\n".join(docs)
    last = load_bytes(first.encode(), FILE, options, previous=FileResult(FILE))
    assert last.ok
    verdicts = []
    for n in range(1, 8):
        docs.append(ALIASED.format(n=n))  # 32 alias values each
        text = "---\n" + "---\n".join(docs)
        result = load_bytes(text.encode(), FILE, options, previous=last)
        whole = load_text(text, FILE, options)
        assert _summary(result) == _summary(whole), n
        verdicts.append(any("alias" in f.message for f in result.findings))
        last = result
    assert verdicts == [False, False, False, True, True, True, True]


def test_an_edit_cuts_and_parses_the_stretch_that_changed() -> None:
    """A file of 1,000 documents, one added at its end and one edited in its middle: only the
    pieces around the edit are cut (hashed) at all, the others are kept as they were."""
    docs = [ENTRY.format(n=n % 250).replace(f"e{n % 250}", f"s{n}") for n in range(1000)]
    text = "---\n".join(docs)
    first = load_bytes(text.encode(), FILE, OPTIONS, previous=FileResult(FILE))
    assert first.pieces is not None and len(first.pieces.pieces) == 1000
    docs.append(ENTRY.format(n=7).replace("e7", "added"))
    appended = "---\n".join(docs).encode()
    recut = documents.recut(first.pieces, appended)
    assert recut is not None and len(recut.middle) <= 2 and len(recut.front) >= 998
    second = load_bytes(appended, FILE, OPTIONS, previous=first)
    assert second.configs[:999] == first.configs[:999]  # the same objects
    assert second.pieces is not None
    docs[500] = docs[500].replace("10.0.0.", "10.0.1.")
    edited = "---\n".join(docs).encode()
    recut = documents.recut(second.pieces, edited)
    assert recut is not None and len(recut.middle) <= 2 and len(recut.tail) >= 499
    third = load_bytes(edited, FILE, OPTIONS, previous=second)
    assert _summary(third) == _summary(_whole(edited))
    assert sum(a is b for a, b in zip(second.configs, third.configs, strict=True)) == 1000


def test_the_fix_of_a_typo_is_compared_with_the_text_before_the_typo() -> None:
    """A save that does not parse is loaded whole (its error says where); the save that fixes
    it keeps the documents of the last text that loaded, not a parse of every document."""
    docs = [ENTRY.format(n=n % 250).replace(f"e{n % 250}", f"s{n}") for n in range(300)]
    good = "---\n".join(docs)
    first = load_bytes(good.encode(), FILE, OPTIONS, previous=FileResult(FILE))
    typo = good.replace("name: s150,", "name: [s150,", 1)
    broken = load_bytes(typo.encode(), FILE, OPTIONS, previous=first)
    assert not broken.ok and _summary(broken) == _summary(_whole(typo.encode()))
    fixed = good + "---\n" + ENTRY.format(n=7).replace("e7", "added")
    again = load_bytes(fixed.encode(), FILE, OPTIONS, previous=broken)
    assert _summary(again) == _summary(_whole(fixed.encode()))
    assert again.configs[:300] == first.configs  # the very objects: nothing parsed again
