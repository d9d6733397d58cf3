"""`meshctl diff`: what a change to the YAML changes in each proxy's Envoy config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, GATEWAY, REVIEWS_V1, SLEEP, SLEEP_VM, runner, subcommand_app

from meshctl.cli.diff import diff

BOOKINFO = EXAMPLES / "bookinfo"
REVIEWS_V3 = "sidecar~10.10.0.43~reviews-v3-vm.bookinfo~bookinfo.svc.cluster.local"

app = subcommand_app("diff", diff)


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    """Two copies of the bookinfo example with a client VM: `old` to keep, `new` to edit."""
    old, new = tmp_path / "old", tmp_path / "new"
    for tree in (old, new):
        shutil.copytree(BOOKINFO, tree)
        (tree / "sleep.yaml").write_text(SLEEP_VM)
    return old, new


def run(old: Path, new: Path, *args: str) -> Any:
    return runner.invoke(app, ["diff", str(old), str(new), *args])


def edit(path: Path, before: str, after: str) -> None:
    text = path.read_text()
    assert text.count(before) == 1, before
    path.write_text(text.replace(before, after))


def shift_reviews_weights(tree: Path) -> None:
    """The canary edit: 90/10 becomes 80/20 (two lines of one VirtualService)."""
    edit(tree / "traffic.yaml", "weight: 90", "weight: 80")
    edit(tree / "traffic.yaml", "weight: 10\n", "weight: 20\n")


def test_a_weight_edit_changes_exactly_the_route_config(trees: tuple[Path, Path]) -> None:
    old, new = trees
    shift_reviews_weights(new)
    result = run(old, new, "--proxy", "sleep-vm.bookinfo", "-o", "json")
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout) == [{"proxy": SLEEP, "type": "routes", "name": "9080", "change": "changed"}]


def test_a_route_config_the_proxy_never_requests_is_no_change_for_it(trees: tuple[Path, Path]) -> None:
    old, new = trees
    for tree in (old, new):  # reviews-v1's app takes 9080 itself: no outbound 9080 listener
        edit(tree / "workloads.yaml", "  address: 10.10.0.41\n", "  address: 10.10.0.41\n  ports: {http: 9080}\n")
    shift_reviews_weights(new)
    result = run(old, new, "--proxy", REVIEWS_V1, "-o", "json")
    assert (result.exit_code, json.loads(result.stdout)) == (0, [])


def test_text_is_a_unified_diff_of_the_resources_yaml(trees: tuple[Path, Path]) -> None:
    old, new = trees
    shift_reviews_weights(new)
    result = run(old, new, "--proxy", SLEEP)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"# {SLEEP}", "--- a/routes/9080", "+++ b/routes/9080"]
    removed = [line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert sorted(removed) == ["weight: 10", "weight: 90"]
    assert sorted(added) == ["weight: 20", "weight: 80"]
    assert sum(line.startswith("@@") for line in lines) >= 1


def test_moving_resources_between_files_and_comments_change_nothing(trees: tuple[Path, Path]) -> None:
    old, new = trees
    documents = []
    for path in sorted(new.glob("*.yaml")):
        documents.extend(d for d in path.read_text().split("\n---\n") if d.strip())
        path.unlink()
    documents.reverse()
    (new / "nested").mkdir()
    (new / "nested" / "all.yaml").write_text(
        "# everything in one file, backwards\n---\n" + "\n---\n# moved\n".join(documents)
    )
    result = run(old, new, "--all-proxies", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    text = run(old, new, "--all-proxies")
    assert (text.exit_code, text.stdout) == (0, "")
    assert "no changes for 8 proxies" in text.stderr


def test_all_proxies_covers_every_workload_and_sums_up(trees: tuple[Path, Path]) -> None:
    old, new = trees
    shift_reviews_weights(new)
    result = run(old, new, "--all-proxies", "-o", "json")
    assert result.exit_code == 1, result.output
    # Every sidecar calls 9080 on 127.0.0.1 (the apps listen on 8080), so each sees the route
    # change; the gateway routes productpage, not reviews.
    sidecars = [  # in workload name order
        f"sidecar~10.10.0.{ip}~{name}-vm.bookinfo~bookinfo.svc.cluster.local"
        for ip, name in ((21, "details-v1"), (11, "productpage-v1"), (51, "ratings-v1"), (41, "reviews-v1"),
                         (42, "reviews-v2"), (43, "reviews-v3"), (90, "sleep"))
    ]  # fmt: skip
    assert json.loads(result.stdout) == [
        {"proxy": proxy, "type": "routes", "name": "9080", "change": "changed"} for proxy in sidecars
    ]

    text = run(old, new, "--all-proxies")
    assert text.exit_code == 1
    summary = text.stdout[text.stdout.index("PROXY") :].splitlines()
    assert [line.split() for line in summary] == [
        ["PROXY", "TYPE", "ADDED", "REMOVED", "CHANGED"],
        *([proxy, "routes", "0", "0", "1"] for proxy in sidecars),
    ]


def test_all_proxies_counts_each_kind_of_change(trees: tuple[Path, Path]) -> None:
    old, new = trees
    edit(new / "traffic.yaml", "  - name: v3\n    labels:\n      version: v3\n", "")  # drop a subset
    changes = json.loads(run(old, new, "--all-proxies", "-o", "json").stdout)
    mine = {(c["type"], c["name"], c["change"]) for c in changes if c["proxy"] == SLEEP}
    assert ("clusters", "outbound|9080|v3|reviews.bookinfo.mesh", "removed") in mine
    assert ("endpoints", "outbound|9080|v3|reviews.bookinfo.mesh", "removed") in mine
    assert GATEWAY in {c["proxy"] for c in changes}  # the gateway has every cluster too


NEW_VM = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: reviews-v4-vm
  namespace: bookinfo
spec:
  address: 10.10.0.44
  serviceAccount: bookinfo-reviews
  labels:
    app: reviews
    version: v4
"""


def test_a_new_workload_is_an_added_proxy_and_new_endpoints_for_the_others(trees: tuple[Path, Path]) -> None:
    old, new = trees
    (new / "workloads.yaml").write_text((new / "workloads.yaml").read_text() + NEW_VM)
    changes = json.loads(run(old, new, "--all-proxies", "-o", "json").stdout)
    v4 = "sidecar~10.10.0.44~reviews-v4-vm.bookinfo~bookinfo.svc.cluster.local"
    mine = [c for c in changes if c["proxy"] == v4]
    assert mine and {c["change"] for c in mine} == {"added"}
    assert {c["type"] for c in mine} == {"clusters", "endpoints", "listeners", "routes"}
    assert ("listeners", "127.0.0.1_9080", "added") in {(c["type"], c["name"], c["change"]) for c in mine}
    for other in (REVIEWS_V1, SLEEP, GATEWAY):
        theirs = {(c["type"], c["name"], c["change"]) for c in changes if c["proxy"] == other}
        assert theirs == {("endpoints", "outbound|9080||reviews.bookinfo.mesh", "changed")}, other
    # Another service account behind reviews is another identity its clients accept: a cluster change.
    edit(
        new / "workloads.yaml",
        "serviceAccount: bookinfo-reviews\n  labels:\n    app: reviews\n    version: v4",
        "labels:\n    app: reviews\n    version: v4",
    )
    changes = json.loads(run(old, new, "--all-proxies", "-o", "json").stdout)
    theirs = {(c["type"], c["name"], c["change"]) for c in changes if c["proxy"] == SLEEP}
    assert ("clusters", "outbound|9080||reviews.bookinfo.mesh", "changed") in theirs


def test_a_removed_workload_is_a_removed_proxy(trees: tuple[Path, Path]) -> None:
    old, new = trees
    (new / "workloads.yaml").write_text(NEW_VM)
    result = run(old, new, "--proxy", "productpage-v1-vm.bookinfo")
    assert result.exit_code == 1
    assert "+++ /dev/null" in result.stdout and "--- a/clusters/" in result.stdout
    assert "\n+" not in result.stdout.replace("+++ /dev/null", "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give either --proxy NODE_ID or --all-proxies"),
        (["--proxy", REVIEWS_V1, "--all-proxies"], "give either --proxy NODE_ID or --all-proxies"),
        (["--proxy", "nobody.bookinfo"], "names no WorkloadEntry"),
        (["--proxy", "not-a-node~id"], "TYPE~IP~NAME.NAMESPACE~DOMAIN"),
    ],
)
def test_usage_errors_exit_2(trees: tuple[Path, Path], args: list[str], message: str) -> None:
    old, new = trees
    result = run(old, new, *args)
    assert (result.exit_code, result.stdout) == (2, "")
    assert message in result.stderr


def test_a_missing_tree_exits_2(trees: tuple[Path, Path]) -> None:
    old, _ = trees
    result = run(old, old.parent / "nope", "--all-proxies")
    assert (result.exit_code, result.stdout) == (2, "")
    assert "no such file or directory" in result.stderr


def test_broken_new_tree_exits_2_with_its_findings(trees: tuple[Path, Path]) -> None:
    old, new = trees
    edit(new / "traffic.yaml", "weight: 90", "weight: ninety")
    result = run(old, new, "--all-proxies")
    assert (result.exit_code, result.stdout) == (2, "")
    assert "traffic.yaml:" in result.stderr and "weight" in result.stderr


def test_an_internal_error_exits_2_not_1(trees: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 1 means "something changes": a crash must never be read as that."""
    import meshctl.server.cache_outbound

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    # Generation as the server runs it, which `diff` goes through.
    monkeypatch.setattr(meshctl.server.cache_outbound, "generate_outbound_clusters", broken)
    old, new = trees
    result = run(old, new, "--all-proxies")
    assert (result.exit_code, result.stdout) == (2, "")
    assert "internal error: RuntimeError: boom" in result.stderr
