"""YAML parsing: data as Kubernetes would read it, positions, and bad input stopped early."""

from __future__ import annotations

import pytest

from meshctl.config.loader import LoadOptions, load_text
from meshctl.config.positions import locate
from meshctl.config.yamlsource import AliasBudget, parse_documents
from meshctl.errors import YamlError


def test_multi_document_positions_and_empty_documents() -> None:
    text = "a: 1\n---\n---\n# comment\nkind: X\nspec:\n  x: [1, 2]\n"
    docs = parse_documents(text)
    assert [(d.index, d.line, d.data) for d in docs] == [
        (0, 1, {"a": 1}),
        (2, 5, {"kind": "X", "spec": {"x": [1, 2]}}),
    ]


def test_scalars_follow_yaml_1_2_core() -> None:
    (doc,) = parse_documents("s: '5'\ni: 5\nh: 0x1f\nf: 0.5\nb: true\nn: null\nt: ~\nyes_is_text: yes\nv: 1.10\n")
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


@pytest.mark.parametrize(
    "text",
    [
        "[" * 30_000,  # flow sequences
        "{a: " * 30_000,  # flow mappings
        "- " * 30_000 + "x\n",  # compact block sequences on one line
        "? " * 30_000 + "x\n",  # complex keys
        "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300)),  # block mappings by indentation
    ],
    ids=["flow-seq", "flow-map", "block-seq", "complex-key", "indented"],
)
def test_deep_nesting_is_refused_before_anything_recurses(text: str) -> None:
    """Composing these by recursion overflowed the C stack and killed the process (exit 139)."""
    with pytest.raises(YamlError, match="nesting deeper than 100 levels") as err:
        parse_documents(text)
    assert err.value.line >= 1 and err.value.column >= 1
    assert locate(text, 0, ("a",)) == (0, 0)  # positions are bounded the same way


def test_nesting_up_to_the_limit_is_accepted() -> None:
    (doc,) = parse_documents("[" * 100 + "]" * 100)
    depth, value = 0, doc.data
    while value:
        depth, value = depth + 1, value[0]
    assert depth == 99


def test_an_alias_cannot_carry_nesting_past_the_limit() -> None:
    deep = "[" * 60 + "x" + "]" * 60
    with pytest.raises(YamlError, match="nesting deeper"):
        parse_documents(f"a: &d {deep}\nb: {'[' * 50}*d{']' * 50}\n")


def test_documents_per_file_are_bounded_while_parsing() -> None:
    with pytest.raises(YamlError, match="more than 1000 YAML documents") as err:
        parse_documents("---\n" * 900_000, max_documents=1000)
    assert err.value.line == 1001
    assert len(parse_documents("{}\n---\n" * 999, max_documents=1000)) == 999


def test_each_alias_is_a_copy_of_its_anchor() -> None:
    (doc,) = parse_documents("a: &x {b: [1]}\nc: *x\n")
    assert doc.data["a"] == doc.data["c"]
    assert doc.data["a"] is not doc.data["c"] and doc.data["a"]["b"] is not doc.data["c"]["b"]


def test_undefined_alias_is_an_error_with_its_position() -> None:
    with pytest.raises(YamlError, match=r"undefined alias \*nope") as err:
        parse_documents("a: 1\nb: *nope\n")
    assert (err.value.line, err.value.column) == (2, 4)


def test_explicit_tags_and_merge_lists() -> None:
    (doc,) = parse_documents("a: !!str 5\nb: ! 6\nc: {<<: [{x: 1}, {x: 2, y: 3}], y: 4}\nd: '<<'\n")
    assert doc.data == {"a": "5", "b": "6", "c": {"x": 1, "y": 4}, "d": "<<"}


# --- a ":" inside a plain scalar of a flow collection, read as Go (and so Istio) reads it -------


@pytest.mark.parametrize(
    ("text", "data"),
    [
        ("addresses: [1.2.3.4, 2001:db8::]\n", {"addresses": ["1.2.3.4", "2001:db8::"]}),
        ("a: [2001:db8::1, b, fe80::1, c]", {"a": ["2001:db8::1", "b", "fe80::1", "c"]}),
        ("a: {x: 2001:db8::, y: 10.0.0.1:80}", {"a": {"x": "2001:db8::", "y": "10.0.0.1:80"}}),
        ("a: {2001:db8::1: v, k: 1}", {"a": {"2001:db8::1": "v", "k": 1}}),  # ": " ends a key
        ("a: [x:, http://h/p]", {"a": ["x:", "http://h/p"]}),
        ("a: [a b:c, d]", {"a": ["a b:c", "d"]}),  # blanks inside a plain scalar
        ("a: [x:y # note\n]", {"a": ["x:y"]}),  # a comment ends it
        ("a: [[x:y, z:w], {p: q:r}]", {"a": [["x:y", "z:w"], {"p": "q:r"}]}),
        ("a: [&x 2001:db8::1, *x, !!str fe80::1]", {"a": ["2001:db8::1", "2001:db8::1", "fe80::1"]}),
        ("a: [-1, 8080, true, x:y, -z:w]", {"a": [-1, 8080, True, "x:y", "-z:w"]}),
        ("a: ['it''s', x:y, \"q\\\"x\", p:q]", {"a": ["it's", "x:y", 'q"x', "p:q"]}),
        ("a: [\n  1.2.3.4, # one\n  # two\n  2001:db8::1, fe80::1,\n  fe80::2\n  ]\n",
         {"a": ["1.2.3.4", "2001:db8::1", "fe80::1", "fe80::2"]}),
        # Go ends a plain scalar at ":" before a line break too: this one is a key, as in Istio.
        ("a: [\n  1.2.3.4,\n  2001:db8::\n]\n", {"a": ["1.2.3.4", {"2001:db8:": None}]}),
        ("\ufeffa: [x:y, y:z]", {"a": ["x:y", "y:z"]}),  # a BOM does not shift columns
        ("a: [x:y]\r\nb: [c:d]\r\n", {"a": ["x:y"], "b": ["c:d"]}),
    ],
)  # fmt: skip
def test_plain_scalars_with_a_colon_in_flow_collections_read_as_go_reads_them(text: str, data: object) -> None:
    (doc,) = parse_documents(text)
    assert doc.data == data


def test_colons_in_strings_comments_and_block_scalars_keep_their_meaning() -> None:
    """The quoting never reaches a ":" that is not in a plain scalar of a flow collection."""
    text = (
        "a: [x:y]\n"
        "b: 'c: [d:e]'\n"
        'f: "g: [h:i]"\n'
        "j: |\n  k: [l:m]\n  [n:o]\n"
        "# p: [q:r]\n"
        "s: t:u\n"
        "v: [w:x, 'y:z', \"1:2\", 3:4]\n"
    )
    (doc,) = parse_documents(text)
    assert doc.data == {
        "a": ["x:y"],
        "b": "c: [d:e]",
        "f": "g: [h:i]",
        "j": "k: [l:m]\n[n:o]\n",
        "s": "t:u",
        "v": ["w:x", "y:z", "1:2", "3:4"],
    }


def test_quoting_keeps_columns_for_positions_and_later_errors() -> None:
    text = "a: 1\n---\nspec:\n  addresses: [1.2.3.4, 2001:db8::, fe80::1]\n  z: [a:b, c:d, 'x:y', {k: v:w}]\n"
    docs = parse_documents(text)
    assert docs[1].data["spec"]["z"] == ["a:b", "c:d", "x:y", {"k": "v:w"}]
    line4, line5 = text.splitlines()[3], text.splitlines()[4]
    assert locate(text, 1, ("spec", "addresses", 1)) == (4, line4.index("2001") + 1)
    assert locate(text, 1, ("spec", "addresses", 2)) == (4, line4.index("fe80") + 1)
    assert locate(text, 1, ("spec", "z", 2)) == (5, line5.index("'x:y'") + 1)
    assert locate(text, 1, ("spec", "z", 3, "k")) == (5, line5.index("k:") + 1)
    dup = "m: {k: x:y, k: z:w}\n"
    with pytest.raises(YamlError, match='duplicate key "k"') as err:
        parse_documents(dup)
    assert (err.value.line, err.value.column) == (1, dup.rindex("k:") + 1)
    broken = "a: [2001:db8::1, fe80::1]\nb: [1, 2\nc: 3\n"
    with pytest.raises(YamlError, match="flow sequence") as err:
        parse_documents(broken)
    assert err.value.line >= 2


@pytest.mark.parametrize(
    "text",
    [
        "a: [x:y?z]\n",  # Go would end it at "?", libyaml would not
        "a: [x:y\n  z]\n",  # a plain scalar over two lines
        "a: [x:y'z]\n",  # a quote inside
    ],
)
def test_scalars_go_and_libyaml_could_read_differently_stay_an_error_with_a_hint(text: str) -> None:
    with pytest.raises(YamlError, match="found unexpected ':'") as err:
        parse_documents(text)
    assert (err.value.line, err.value.column) == (1, 6)
    assert "quote the value" in err.value.message


def test_many_documents_and_collections_are_quoted_without_a_parse_each() -> None:
    docs = "".join(f"---\nkind: X\nspec:\n  addresses: [10.0.0.{i % 250}, 2001:db8::{i:x}]\n" for i in range(2000))
    parsed = parse_documents(docs)
    assert len(parsed) == 2000 and parsed[-1].data["spec"]["addresses"][1] == "2001:db8::7cf"
    one = "a:\n" + "".join(f"  k{i}: [x:{i}, {{p: q:{i}}}]\n  d{i}: |\n    [y:{i}]\n" for i in range(3000))
    (doc,) = parse_documents(one)
    assert doc.data["a"]["k2999"] == ["x:2999", {"p": "q:2999"}] and doc.data["a"]["d7"] == "[y:7]\n"


def _big_service_entry(endpoints: int) -> str:
    lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: ServiceEntry",
        "metadata: {name: fleet, namespace: shop}",
        "spec:",
        "  hosts: [fleet.shop.mesh]",
        "  location: MESH_INTERNAL",
        "  resolution: STATIC",
        "  ports: [{number: 9080, name: http, protocol: HTTP}]",
        "  endpoints:",
    ]
    lines += [
        f"  - {{address: 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}, ports: {{http: 9080}},"
        f" labels: {{app: fleet, version: v{i % 3}}}}}"
        for i in range(endpoints)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_a_service_entry_of_40000_endpoints_loads() -> None:
    """Written out in full, a big honest resource is no alias bomb: some 520,000 values."""
    result = load_text(_big_service_entry(40_000), "fleet.yaml", LoadOptions())
    assert result.ok, result.findings[:3]
    (config,) = result.configs
    assert len(config.spec.endpoints) == 40_000  # type: ignore[attr-defined]


def test_an_authorization_policy_of_12000_rules_parses() -> None:
    rules = [
        f"  - {{from: [{{source: {{principals: [cluster.local/ns/shop/sa/c{i}]}}}}],"
        f" to: [{{operation: {{methods: [GET], paths: [/api/{i}]}}}}]}}"
        for i in range(12_000)
    ]
    text = "kind: AuthorizationPolicy\nmetadata: {name: big}\nspec:\n  rules:\n" + "\n".join(rules) + "\n"
    (doc,) = parse_documents(text)
    assert len(doc.data["spec"]["rules"]) == 12_000


def test_aliases_are_bounded_across_the_documents_of_a_file() -> None:
    """Many small bombs in one file are stopped as one big one: the alias budget is the file's."""
    one = "a: &a [" + ", ".join(["x"] * 100) + "]\nb: [" + ", ".join(["*a"] * 20) + "]\n"
    assert len(parse_documents(one)) == 1  # 2,000 values through aliases: fine
    with pytest.raises(YamlError, match=r"aliases expand to more than 200000 values in this file \(an alias bomb\?\)"):
        parse_documents("---\n".join([one] * 200))  # 400,000 in all
    assert len(parse_documents("---\n".join([one] * 200), aliases=AliasBudget(1_000_000))) == 200


def test_values_written_in_one_document_are_bounded() -> None:
    text = "[" + ", ".join(["1"] * 1000) + "]\n"
    with pytest.raises(YamlError, match="more than 999 values in one document"):
        parse_documents(text, max_values=999)
    assert parse_documents(text, max_values=1001)[0].data == [1] * 1000
