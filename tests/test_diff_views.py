"""`meshctl diff --all-proxies` by view: proxies that share a view share one comparison, and the
answer is the one the per-proxy generation gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, SLEEP_VM, runner, subcommand_app

from meshctl.cli.diff import all_pairs, diff
from meshctl.cli.diff_views import ViewDiff
from meshctl.cli.offline import load_tree

app = subcommand_app("diff", diff)

REPLICA = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: sleep-vm-{n}
  namespace: bookinfo
spec:
  address: 10.10.0.{ip}
  labels:
    app: sleep
"""


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    """Bookinfo with five replicas of the sleep client (one view between them); `new` has the
    reviews weights moved."""
    old, new = tmp_path / "old", tmp_path / "new"
    for tree in (old, new):
        shutil.copytree(EXAMPLES / "bookinfo", tree)
        replicas = "".join(REPLICA.format(n=n, ip=200 + n) for n in range(5))
        (tree / "sleep.yaml").write_text(SLEEP_VM + replicas)
    text = (new / "traffic.yaml").read_text()
    (new / "traffic.yaml").write_text(text.replace("weight: 90", "weight: 80").replace("weight: 10\n", "weight: 20\n"))
    return old, new


def test_replicas_share_one_comparison_per_type(trees: tuple[Path, Path]) -> None:
    before, after = (load_tree(t, namespace="bookinfo") for t in trees)
    views = ViewDiff(before.snapshot, after.snapshot)
    pairs = [p for p in all_pairs(before, after) if "~sleep-vm" in p.label]
    assert len(pairs) == 6
    answers = [views.differences(p.old, p.new) for p in pairs]
    assert [(d.type_url.rpartition(".")[2], d.name, d.change) for d in answers[0]] == [
        ("RouteConfiguration", "9080", "changed")
    ]
    assert all(a == answers[0] for a in answers)
    # One pair of sets per type that differs at all, not one per proxy: the route configs (the
    # other types are the very same sets in both trees, and cost no comparison).
    assert views.compared == 1


def test_a_generation_error_in_the_new_tree_is_not_hidden_by_the_old_view(
    trees: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server keeps a proxy's last good config when generation fails; `diff` must not show
    the old tree's config as the new one's (and so "no change", exit 0): it fails, exit 2."""
    import meshctl.server.cache_outbound

    old, new = trees
    real = meshctl.server.cache_outbound.generate_outbound_listeners_and_routes
    calls: list[str] = []

    def fails_the_second_time(snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(snapshot.version)
        if len(set(calls)) > 1:
            raise RuntimeError("boom")
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(meshctl.server.cache_outbound, "generate_outbound_listeners_and_routes", fails_the_second_time)
    result = runner.invoke(app, ["diff", str(old), str(new), "--proxy", "sleep-vm.bookinfo", "-o", "json"])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert "internal error: RuntimeError: boom" in result.stderr


def test_by_view_answers_as_each_proxy_alone(trees: tuple[Path, Path]) -> None:
    """Every proxy's changes through the shared views equal those of `--proxy` for it alone."""
    old, new = trees
    every = runner.invoke(app, ["diff", str(old), str(new), "--all-proxies", "-o", "json"])
    assert every.exit_code == 1, every.output
    changes = json.loads(every.stdout)
    for proxy in sorted({c["proxy"] for c in changes}):
        alone = runner.invoke(app, ["diff", str(old), str(new), "--proxy", proxy, "-o", "json"])
        assert json.loads(alone.stdout) == [c for c in changes if c["proxy"] == proxy]
