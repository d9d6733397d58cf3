"""A snapshot is built on the publishing side while the generation thread may still be asking
the one before it for scoped answers, and storing new ones there. Building the new index from
the old one's answers must not fail because the old one grew meanwhile: a valid change would
fail to build, and the fleet would keep the config before it.

The interleaving is made deterministic: a scope key whose hash, asked while the new index reads
the old one's answers, stores another answer in the old index, as the generation thread would
at that moment."""

from __future__ import annotations

from pathlib import Path

from meshctl.config.model import Config
from meshctl.registry.serviceentry import build_file_model
from meshctl.snapshot.index import SnapshotIndex
from meshctl.testing.builders import configs_from_yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"


class _AskedMeanwhile:
    """A scope's key; once armed, hashing it stores another scope's answer in `index`."""

    def __init__(self, index: SnapshotIndex) -> None:
        self.index = index
        self.armed = False
        self.asked = 0

    def __hash__(self) -> int:
        if self.armed:
            self.asked += 1
            self.index.scoped("services", ("another scope", self.asked), tuple)
        return 1

    def __eq__(self, other: object) -> bool:
        return other is self


def test_an_index_is_built_from_one_whose_answers_grow_meanwhile() -> None:
    configs: list[Config] = configs_from_yaml("\n---\n".join(p.read_text() for p in sorted(EXAMPLES.rglob("*.yaml"))))
    by_kind: dict[str, tuple[Config, ...]] = {}
    for config in configs:
        by_kind[config.kind] = (*by_kind.get(config.kind, ()), config)
    model = build_file_model(configs)
    previous = SnapshotIndex(by_kind, model)
    key = _AskedMeanwhile(previous)
    previous.scoped("services", key, tuple)
    previous.scoped("virtual_services", key, tuple)
    key.armed = True

    after = SnapshotIndex(by_kind, model, previous=previous)

    assert key.asked > 0  # the old index did grow while the new one read it
    assert after.scoped("services", key, lambda: ("made again",)) == ()  # its answer carried over
