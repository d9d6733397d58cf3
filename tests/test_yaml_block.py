"""`BlockYaml` writes the very text `offline.yaml_text` writes: `meshctl diff` prints it."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from conftest import EXAMPLES
from hypothesis import given, settings

from meshctl.cli.offline import find_proxy, load_tree, workload_entries, yaml_text
from meshctl.cli.yaml_block import BlockYaml
from meshctl.xds.config_dump import message_dict
from meshctl.xds.generate import generate

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
keys = st.text(max_size=30) | st.sampled_from(["name", "yes", "on", "0", "- a", "a: b", "#x", "x" * 200])
plain = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, plain, max_size=5) | st.lists(plain, max_size=5))
def test_any_plain_document_reads_as_ruamel_writes_it(data: Any) -> None:
    writer = BlockYaml()
    assert writer.text(data) == yaml_text(data)
    assert writer.text(data) == yaml_text(data)  # and again, from what it remembered


def test_every_generated_resource_of_the_example_reads_as_ruamel_writes_it() -> None:
    tree = load_tree(EXAMPLES / "bookinfo", namespace="bookinfo")
    writer = BlockYaml()
    count = 0
    for entry in workload_entries(tree.snapshot):
        proxy = find_proxy(tree.snapshot, f"{entry.name}.{entry.namespace}")
        assert proxy is not None
        for messages in generate(tree.snapshot, proxy).values():
            for message in messages:
                data = message_dict(message)
                assert writer.text(data) == yaml_text(data)
                count += 1
    assert count > 50
