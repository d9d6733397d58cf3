"""A changed file is loaded again document by document, and gives what loading it whole gives.

`load_bytes(..., previous=)` (the watcher's load of a file it loaded before) parses and validates
only the documents whose text changed. Hypothesis builds files from documents of every sort
(valid resources, resources with errors and warnings at a field, duplicates, empty documents,
comments, text before the first marker, documents that do not parse), edits them, and checks that
the piecewise load equals the whole load: the same resources at the same places, the same
findings at the same lines, and the same objects for documents that neither changed nor moved.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.config.loader import FileResult, LoadOptions, load_bytes, load_text

ROUTE = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: r{n}, namespace: shop}}
spec:
  hosts: [r{n}.shop.mesh]
  http:
  - timeout: {n}s
    route: [{{destination: {{host: r{n}.shop.mesh}}}}]
"""
BROKEN = """apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: d{n}, namespace: shop}}
spec:
  host: d{n}.shop.mesh
  trafficPolicy:
    loadBalancer: {{simple: NOT_A_POLICY}}
"""
WARNED = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: e{n}, namespace: shop}}
spec:
  hosts: [e{n}.shop.mesh]
  ports: [{{number: 80, name: web, protocol: HTTP}}]
  resolution: DNS
"""
DOCUMENTS = st.one_of(
    st.integers(1, 30).map(lambda n: ROUTE.format(n=n)),
    st.integers(1, 30).map(lambda n: ROUTE.format(n=n)),
    st.integers(0, 3).map(lambda n: BROKEN.format(n=n)),
    st.integers(0, 3).map(lambda n: WARNED.format(n=n)),
    st.sampled_from(["", "# only a comment\n", "[1, 2]\n", "kind: Unknown\napiVersion: example.com/v1\n", "a: [\n"]),
)


def _file(head: str, docs: list[str]) -> bytes:
    return (head + "".join(f"---\n{d}" for d in docs)).encode()


def _summary(result: FileResult) -> tuple[object, ...]:
    configs = [(c.key, c.source, c.api_version, c.content_digest()) for c in result.configs]
    return tuple(configs), result.findings


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head=st.sampled_from(["", "# a catalog\n", ROUTE.format(n=99)]),
    before=st.lists(DOCUMENTS, min_size=64, max_size=80),
    edits=st.lists(st.tuples(st.integers(0, 30), DOCUMENTS, st.sampled_from(["replace", "insert", "delete"]))),
)
def test_a_file_loaded_piecewise_gives_what_a_whole_load_gives(
    head: str, before: list[str], edits: list[tuple[int, str, str]]
) -> None:
    options = LoadOptions(default_namespace="shop")
    first = load_bytes(_file(head, before), "catalog.yaml", options, previous=FileResult("catalog.yaml"))
    assert _summary(first) == _summary(load_text(_file(head, before).decode(), "catalog.yaml", options))
    after = list(before)
    for at, doc, how in edits:
        i = at % (len(after) + 1)
        if how == "insert":
            after.insert(i, doc)
        elif how == "delete" and i < len(after):
            del after[i]
        elif i < len(after):
            after[i] = doc
    again = load_bytes(_file(head, after), "catalog.yaml", options, previous=first)
    whole = load_text(_file(head, after).decode(), "catalog.yaml", options)
    assert _summary(again) == _summary(whole)
    # Documents that neither changed nor moved keep their very objects.
    unchanged = {(c.key, c.source): c for c in first.configs}
    for config in again.configs:
        old = unchanged.get((config.key, config.source))
        if old is not None and old.content_digest() == config.content_digest() and again.pieces:
            assert config is old, config.key


def test_an_edit_to_one_document_of_a_large_file_loads_that_document_alone() -> None:
    options = LoadOptions(default_namespace="shop")
    docs = [ROUTE.format(n=n) for n in range(1, 201)]
    first = load_bytes(_file("", docs), "catalog.yaml", options, previous=FileResult("catalog.yaml"))
    docs[150] = ROUTE.format(n=151).replace("151s", "7s")
    docs.append(ROUTE.format(n=999))
    again = load_bytes(_file("", docs), "catalog.yaml", options, previous=first)
    kept = sum(a is b for a, b in zip(first.configs, again.configs, strict=False))
    assert kept == 199  # every resource but the edited one (the edit moved no line): the same object
    assert len(again.configs) == 201
    assert again.configs[150].spec != first.configs[150].spec
