"""Whatever bytes a user saves, the loader answers with resources or findings, never a crash."""

from __future__ import annotations

from typing import Any

from conftest import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.config.loader import FileResult, load_text
from meshctl.config.yamlsource import parse_documents

VALID_DOCS = [doc.data for path in sorted(EXAMPLES.rglob("*.yaml")) for doc in parse_documents(path.read_text())]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["5s", "-1s", "*", "a.b", "HTTP", "ISTIO_MUTUAL", "[", "0.0.0.0/0"]),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


def assert_answers(result: FileResult) -> None:
    assert isinstance(result, FileResult)
    assert result.ok == (not any(f.severity.value == "error" for f in result.findings))
    if not result.ok:
        assert result.configs == ()
        assert all(f.message for f in result.findings)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    assert_answers(load_text(text, "random.yaml"))


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def mutated_resources(draw: st.DrawFn) -> Any:
    import copy

    doc = copy.deepcopy(draw(st.sampled_from(VALID_DOCS)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return doc


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(mutated_resources())
def test_mutated_valid_resources(doc: Any) -> None:
    import json

    # JSON is YAML: this feeds the mutated structure through the real parser.
    text = json.dumps(doc, allow_nan=True)
    assert_answers(load_text(text, "mutated.yaml"))
