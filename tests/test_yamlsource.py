"""YAML parsing: data as Kubernetes would read it, positions, and bad input stopped early."""

from __future__ import annotations

import pytest

from meshctl.config.yamlsource import locate, parse_documents
from meshctl.errors import YamlError


def test_multi_document_positions_and_empty_documents() -> None:
    text = "a: 1\n---\n---\n# comment\nkind: X\nspec:\n  x: [1, 2]\n"
    docs = parse_documents(text)
    assert [(d.index, d.line, d.data) for d in docs] == [
        (0, 1, {"a": 1}),
        (2, 5, {"kind": "X", "spec": {"x": [1, 2]}}),
    ]


def test_scalars_follow_yaml_1_2_core() -> None:
    (doc,) = parse_documents(
        "s: '5'\ni: 5\nh: 0x1f\nf: 0.5\nb: true\nn: null\nt: ~\nyes_is_text: yes\nv: 1.10\n"
    )
    assert doc.data == {
        "s": "5",
        "i": 5,
        "h": 31,
        "f": 0.5,
        "b": True,
        "n": None,
        "t": None,
        "yes_is_text": "yes",
        "v": 1.1,
    }


def test_aliases_and_merge_keys() -> None:
    (doc,) = parse_documents("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n")
    assert doc.data["use"] == {"x": 1, "y": 3}


def test_duplicate_key_names_both_lines() -> None:
    with pytest.raises(YamlError) as err:
        parse_documents("spec:\n  hosts: [a]\n  hosts: [b]\n")
    assert (err.value.line, err.value.column) == (3, 3)
    assert 'duplicate key "hosts"' in err.value.message and "line 2" in err.value.message


def test_syntax_error_has_position() -> None:
    with pytest.raises(YamlError) as err:
        parse_documents("a: 1\nb: [1, 2\nc: 3\n")
    assert err.value.line >= 2
    assert "flow sequence" in err.value.message


def test_billion_laughs_is_stopped() -> None:
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"l{i}: &l{i} [{refs}]")
    with pytest.raises(YamlError, match="alias bomb"):
        parse_documents("\n".join(lines) + "\n")


def test_recursive_alias_is_stopped() -> None:
    with pytest.raises(YamlError, match="nesting"):
        parse_documents("&a [*a]\n")


def test_control_characters_are_an_error() -> None:
    with pytest.raises(YamlError, match="unacceptable character"):
        parse_documents("a: \x00\n")


def test_locate_walks_paths_and_falls_back_to_the_nearest_ancestor() -> None:
    text = "a: 1\n---\nspec:\n  http:\n  - route:\n    - weight: 5\n"
    assert locate(text, 1, ("spec", "http", 0, "route", 0, "weight")) == (6, 7)
    assert locate(text, 1, ("spec", "http", 0, "missing")) == (5, 5)
    assert locate(text, 7, ("spec",)) == (0, 0)
