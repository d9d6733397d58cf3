"""`meshctl kv push`, and Consul's KV API as the fake serves it.

The KV API tests run against the fake Consul and against a real `consul agent -dev` when the
binary is on PATH (the session's agent of `test_consul_registry`), through py-consul over HTTP as
a user's tooling would, so the fake is held to what Consul does.
"""

from __future__ import annotations

import base64
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import consul
import pytest
from typer.testing import CliRunner

from meshctl.cli import exits
from meshctl.cli.app import app, kv_app
from meshctl.config import check as check_module
from meshctl.errors import RegistryError, UsageError
from meshctl.kv.push import Current, apply_push, plan_push
from meshctl.kv.source import normalize_prefix, parse_entries
from meshctl.registry.consul_http import ConsulConnection, ConsulOptions
from meshctl.testing.fake_consul import FakeConsul

pytest_plugins = ["test_consul_registry"]  # its `kv_backend`: the fake and a real agent

pytestmark = pytest.mark.consul

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"

runner = CliRunner()


@pytest.fixture
def fake() -> Iterator[FakeConsul]:
    with FakeConsul() as f:
        yield f


def push(*args: object, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["kv", "push", *map(str, args)], env={"CONSUL_HTTP_TOKEN": "", **(env or {})})
    return result.exit_code, result.stdout, result.stderr


# --- the fake's KV API, held to Consul's -------------------------------------------------------


def test_put_get_recurse_keys_and_delete(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    prefix = f"t{uuid.uuid4().hex[:6]}/"
    assert c.kv.put(prefix + "a.yaml", b"one") is True
    assert c.kv.put(prefix + "dir/b.yaml", b"") is True
    index, entry = c.kv.get(prefix + "a.yaml")
    assert entry["Value"] == b"one" and entry["ModifyIndex"] <= int(index)
    _, entries = c.kv.get(prefix, recurse=True)
    assert [e["Key"] for e in entries] == [prefix + "a.yaml", prefix + "dir/b.yaml"]
    assert entries[1]["Value"] is None  # an empty value is null in Consul's JSON
    _, keys = c.kv.get(prefix, keys=True)
    assert keys == [prefix + "a.yaml", prefix + "dir/b.yaml"]
    _, keys = c.kv.get(prefix, keys=True, separator="/")
    assert keys == [prefix + "a.yaml", prefix + "dir/"]
    assert c.kv.get(prefix + "missing.yaml")[1] is None
    assert c.kv.delete(prefix, recurse=True) is True
    assert c.kv.get(prefix, recurse=True)[1] is None


def test_check_and_set_on_put_and_delete(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    key = f"t{uuid.uuid4().hex[:6]}/a.yaml"
    assert c.kv.put(key, b"one", cas=0) is True
    assert c.kv.put(key, b"two", cas=0) is False  # 0: only if it does not exist
    modify = c.kv.get(key)[1]["ModifyIndex"]
    assert c.kv.put(key, b"two", cas=modify + 100) is False
    assert c.kv.put(key, b"two", cas=modify) is True
    assert c.kv.delete(key, cas=modify) is False  # stale now
    assert c.kv.delete(key, cas=c.kv.get(key)[1]["ModifyIndex"]) is True
    assert c.kv.get(key)[1] is None


def test_a_blocking_query_on_a_prefix_wakes_on_a_change_under_it(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    prefix = f"t{uuid.uuid4().hex[:6]}/"
    c.kv.put(prefix + "a.yaml", b"one")
    index, _ = c.kv.get(prefix, recurse=True)
    quiet, _ = c.kv.get(prefix, recurse=True, index=index, wait="200ms")
    assert quiet == index  # nothing changed: held for the wait, same index
    c.kv.put(f"other-{prefix}x.yaml", b"elsewhere")
    c.kv.delete(prefix + "a.yaml")
    after, entries = c.kv.get(prefix, recurse=True, index=index, wait="5s")
    assert int(after) > int(index) and entries is None  # a deletion moves the prefix's index too


def test_a_transaction_is_all_or_nothing(kv_backend: tuple[str, Any]) -> None:
    _, c = kv_backend
    prefix = f"t{uuid.uuid4().hex[:6]}/"
    c.kv.put(prefix + "a.yaml", b"one")
    modify = c.kv.get(prefix + "a.yaml")[1]["ModifyIndex"]

    def op(verb: str, name: str, value: bytes = b"", index: int = 0) -> dict[str, Any]:
        return {"KV": {"Verb": verb, "Key": prefix + name, "Value": base64.b64encode(value).decode(), "Index": index}}

    with pytest.raises(consul.ConsulException):  # 409: the second cas is stale
        c.txn.put([op("set", "b.yaml", b"new"), op("cas", "a.yaml", b"two", modify + 100)])
    assert c.kv.get(prefix + "b.yaml")[1] is None and c.kv.get(prefix + "a.yaml")[1]["Value"] == b"one"
    result = c.txn.put([op("cas", "b.yaml", b"new", 0), op("cas", "a.yaml", b"two", modify), op("get", "a.yaml")])
    assert result["Errors"] is None
    assert base64.b64decode(result["Results"][-1]["KV"]["Value"]) == b"two"
    written = {r["KV"]["Key"]: r["KV"]["ModifyIndex"] for r in result["Results"]}
    assert len(set(written.values())) == 1  # one transaction, one index
    result = c.txn.put([op("delete-cas", "a.yaml", index=written[prefix + "a.yaml"]), op("delete", "b.yaml")])
    assert result["Errors"] is None and c.kv.get(prefix, recurse=True)[1] is None


def test_the_fakes_txn_refuses_more_than_64_operations_and_says_which_failed(fake: FakeConsul) -> None:
    conn = ConsulConnection(ConsulOptions(address=fake.address))
    try:
        ops = [{"KV": {"Verb": "set", "Key": f"k{i}", "Value": ""}} for i in range(65)]
        assert conn.request("PUT", "/v1/txn", {}, 5, repr(ops).replace("'", '"').encode()).status == 413
        body = b'[{"KV": {"Verb": "set", "Key": "a"}}, {"KV": {"Verb": "cas", "Key": "b", "Index": 7}}]'
        reply = conn.request("PUT", "/v1/txn", {}, 5, body)
        assert reply.status == 409 and b'"OpIndex": 1' in reply.body and b"index is stale" in reply.body
        assert fake.kv_keys() == []
    finally:
        conn.close()


# --- planning ----------------------------------------------------------------------------------


def test_a_plan_writes_only_what_changed_each_checked_against_what_was_read() -> None:
    current = {"a.yaml": Current(b"same", 5), "b.yaml": Current(b"old", 6), "gone.yaml": Current(b"x", 7)}
    plan = plan_push("mesh/", {"a.yaml": b"same", "b.yaml": b"new", "c.yaml": b"added"}, current)
    assert (plan.added, plan.changed, plan.deleted, plan.unchanged) == (("c.yaml",), ("b.yaml",), ("gone.yaml",), 1)
    verbs = [(op["KV"]["Verb"], op["KV"]["Key"], op["KV"]["Index"]) for op in plan.operations]  # type: ignore[index]
    assert verbs == [("cas", "mesh/b.yaml", 6), ("cas", "mesh/c.yaml", 0), ("delete-cas", "mesh/gone.yaml", 7)]
    assert plan.summary() == "1 added, 1 changed, 1 deleted, 1 unchanged"


def test_more_than_64_changes_are_refused_unless_split(fake: FakeConsul) -> None:
    options = ConsulOptions(address=fake.address)
    plan = plan_push("mesh/", {f"f{i:03}.yaml": b"" for i in range(100)}, {})
    conn = ConsulConnection(options)
    try:
        with pytest.raises(UsageError, match="at most 64 operations"):
            apply_push(conn, options, plan)
        assert fake.kv_keys() == []
        assert apply_push(conn, options, plan, split=True) == 2
        assert len(fake.kv_keys("mesh/")) == 100
    finally:
        conn.close()


def test_prefixes_are_folders() -> None:
    assert normalize_prefix("/meshctl/mesh/") == "meshctl/mesh/"
    assert normalize_prefix("") == ""
    with pytest.raises(UsageError):
        normalize_prefix("a//b")
    data = [
        {"Key": "mesh/a.yaml", "Value": base64.b64encode(b"x").decode(), "ModifyIndex": 3},
        {"Key": "mesh/notes.txt", "Value": None, "ModifyIndex": 4},
        {"Key": "mesh/.hidden.yaml", "Value": None, "ModifyIndex": 4},
        {"Key": "mesh/dir/", "Value": None, "ModifyIndex": 4},
    ]
    assert list(parse_entries(data, "mesh/")) == ["a.yaml"]
    with pytest.raises(RegistryError):
        parse_entries({"not": "a list"}, "mesh/")


# --- the command -------------------------------------------------------------------------------


def test_push_writes_the_tree_then_only_changes_and_deletions(fake: FakeConsul, tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    status, out, err = push(mesh, "--prefix", "meshctl/mesh", "--consul", fake.address)
    assert status == 0, err
    assert "4 added, 0 changed, 0 deleted, 0 unchanged" in out and "+ meshctl/mesh/bookinfo/traffic.yaml" in out
    assert fake.kv_get("meshctl/mesh/bookinfo/traffic.yaml") == (mesh / "bookinfo" / "traffic.yaml").read_bytes()
    writes = [r for r in fake.requests if r.method == "PUT"]
    assert [r.path for r in writes] == ["/v1/txn"]  # one transaction

    status, out, _ = push(mesh, "--prefix", "meshctl/mesh", "--consul", fake.address)
    assert status == 0 and out.startswith("nothing to push")

    (mesh / "bookinfo" / "gateway.yaml").unlink()
    traffic = mesh / "bookinfo" / "traffic.yaml"
    traffic.write_text(traffic.read_text().replace("weight: 90", "weight: 80").replace("weight: 10", "weight: 20"))
    status, out, _ = push(mesh, "--prefix", "meshctl/mesh", "--consul", fake.address, "--dry-run")
    assert status == 0 and "would push" in out and "- meshctl/mesh/bookinfo/gateway.yaml" in out
    assert fake.kv_get("meshctl/mesh/bookinfo/gateway.yaml") is not None  # a dry run writes nothing
    status, out, _ = push(mesh, "--prefix", "meshctl/mesh", "--consul", fake.address)
    assert status == 0 and "0 added, 1 changed, 1 deleted, 2 unchanged" in out
    assert fake.kv_keys("meshctl/mesh/") == [
        f"meshctl/mesh/bookinfo/{n}.yaml" for n in ("services", "traffic", "workloads")
    ]


def test_an_invalid_tree_is_not_pushed(fake: FakeConsul, tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    (mesh / "bookinfo" / "broken.yaml").write_text(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x, namespace: bookinfo}\n"
        "spec: {hosts: [x.example.com], http: [{route: [{destination: {host: x.example.com}, weight: 200}]}]}\n"
    )
    status, out, err = push(mesh, "--prefix", "mesh", "--consul", fake.address)
    assert status == 1
    assert "broken.yaml" in out and "not pushed" in err
    assert fake.kv_keys() == [] and not [r for r in fake.requests if r.method == "PUT"]


def test_push_warns_as_validate_does_about_names_two_services_claim(fake: FakeConsul, tmp_path: Path) -> None:
    from conftest import NAME_CLASH

    mesh = tmp_path / "mesh"
    mesh.mkdir()
    (mesh / "mesh.yaml").write_text(NAME_CLASH)
    status, out, _ = push(mesh, "--prefix", "mesh", "--consul", fake.address, "--dry-run")
    assert status == 0  # a warning, as validate gives it: the push goes ahead
    assert "MC0006" in out and "db.shop" in out


def test_push_writes_exactly_the_bytes_it_validated(
    fake: FakeConsul, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file saved again right after validation (an editor, a generator) is not pushed: what
    Consul gets is what was checked."""
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    traffic = mesh / "bookinfo" / "traffic.yaml"
    validated = traffic.read_bytes()
    real_check = check_module.check

    def check_then_edit(*args: Any, **kwargs: Any) -> Any:
        findings = real_check(*args, **kwargs)
        traffic.write_text("apiVersion: networking.istio.io/v1\nkind: VirtualService\nspec: [broken\n")
        return findings

    monkeypatch.setattr(check_module, "check", check_then_edit)
    status, _, err = push(mesh, "--prefix", "mesh", "--consul", fake.address)
    assert status == 0, err
    assert fake.kv_get("mesh/bookinfo/traffic.yaml") == validated


def test_a_concurrent_push_fails_cleanly_and_leaves_kv_unchanged(fake: FakeConsul, tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    assert push(mesh, "--prefix", "mesh", "--consul", fake.address)[0] == 0
    options = ConsulOptions(address=fake.address)
    conn = ConsulConnection(options)
    try:
        from meshctl.kv.push import read_current

        current = read_current(conn, options, "mesh/")
        tree = {name: entry.value for name, entry in current.items()}
        tree["bookinfo/traffic.yaml"] += b"\n# ours\n"
        plan = plan_push("mesh/", tree, current)
        fake.kv_put("mesh/bookinfo/traffic.yaml", b"# theirs\n")  # another push, between read and write
        before = {k: fake.kv_get(k) for k in fake.kv_keys()}
        with pytest.raises(RegistryError, match=r"changed since it was read .*nothing was written"):
            apply_push(conn, options, plan)
        assert {k: fake.kv_get(k) for k in fake.kv_keys()} == before
    finally:
        conn.close()


def test_consul_errors_exit_2(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, mesh)
    with FakeConsul(acl_token="secret") as fake:
        status, out, err = push(mesh, "--prefix", "mesh", "--consul", fake.address)
        assert (status, out) == (2, "") and "error:" in err and "403" in err
        status, _, err = push(mesh, "--prefix", "mesh", "--consul", fake.address, "--consul-token", "secret")
        assert status == 0, err
    status, out, err = push(tmp_path / "nowhere", "--prefix", "mesh", "--consul", "127.0.0.1:1")
    assert (status, out) == (2, "") and "not a directory" in err


@pytest.mark.parametrize("command", ["push", "pull"])
def test_kv_commands_follow_the_cli_conventions(command: str) -> None:
    result = runner.invoke(app, ["kv", command, "-h"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"Usage: meshctl kv {command}" in result.output
    rows = [line for line in result.output.splitlines() if re.match(r"^│ +(\* +)?-", line) and "--help" not in line]
    assert rows, result.output
    for row in rows:
        assert not re.search(r"<(str|int|float|path|bool)>|list\[", row), row
    edge = exits.reported(lambda: None).__code__
    callbacks = {c.name: c.callback for c in kv_app.registered_commands}
    assert callbacks[command] is not None and callbacks[command].__code__ is edge


# --- meshctl kv pull ---------------------------------------------------------------------------


def pull(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, ["kv", "pull", *map(str, args)], env={"CONSUL_HTTP_TOKEN": ""})
    return result.exit_code, result.stdout, result.stderr


def test_pull_writes_what_was_pushed_and_the_offline_commands_read_it(
    kv_backend: tuple[str, Any], tmp_path: Path
) -> None:
    """What `kv pull` writes is the tree the servers serve: `dump` of it prints what `dump` of
    the pushed directory prints, byte for byte."""
    address, c = kv_backend
    prefix = f"t{uuid.uuid4().hex[:6]}/mesh"
    status, _, err = push(EXAMPLES, "--prefix", prefix, "--consul", address)
    assert status == 0, err
    c.kv.put(f"{prefix}/notes.txt", b"not config")  # left out, as the server leaves it out
    c.kv.put(f"{prefix}/.hidden.yaml", b"kind: nope")
    pulled = tmp_path / "pulled"
    status, out, err = pull(pulled, "--prefix", prefix, "--consul", address)
    assert status == 0, err
    pushed = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml"))
    assert sorted(str(p.relative_to(pulled)) for p in pulled.rglob("*") if p.is_file()) == pushed
    assert f"pulled {len(pushed)} files" in out
    for name in pushed:
        assert (pulled / name).read_bytes() == (EXAMPLES / name).read_bytes()
    proxy = ["--proxy", "reviews-v1-vm.bookinfo", "-o", "json"]
    original = runner.invoke(app, ["dump", "--config-dir", str(EXAMPLES), *proxy])
    again = runner.invoke(app, ["dump", "--config-dir", str(pulled), *proxy])
    assert original.exit_code == again.exit_code == 0, again.output
    assert again.stdout == original.stdout
    # It overwrites nothing: a directory with anything in it is refused.
    status, out, err = pull(pulled, "--prefix", prefix, "--consul", address)
    assert (status, out) == (2, "") and "not an empty directory" in err


def test_pull_of_an_empty_prefix_writes_an_empty_tree_and_consul_errors_exit_2(
    fake: FakeConsul, tmp_path: Path
) -> None:
    status, out, err = pull(tmp_path / "empty", "--prefix", "nothing/here", "--consul", fake.address)
    assert status == 0, err
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    status, out, err = pull(tmp_path / "never", "--prefix", "mesh", "--consul", "127.0.0.1:1")
    assert (status, out) == (2, "") and "error:" in err and not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (["c.yaml", "c.yaml/d.yaml"], ["'c.yaml'", "'c.yaml/d.yaml'"]),
        (["a.yaml", "bad\0name.yaml"], ["'bad\\x00name.yaml'", "NUL"]),
    ],
)
def test_pull_of_keys_no_tree_can_hold_is_refused_and_writes_nothing(
    fake: FakeConsul, tmp_path: Path, keys: list[str], named: list[str]
) -> None:
    for key in keys:
        fake.kv_put(f"mesh/{key}", b"")
    target = tmp_path / "pulled"
    status, out, err = pull(target, "--prefix", "mesh", "--consul", fake.address)
    assert (status, out) == (2, ""), err
    (line,) = err.strip().splitlines()
    assert "internal error" not in line and all(n in line for n in named), line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no half tree, no staging folder left
    target.mkdir()  # an empty directory given: still empty afterwards
    assert pull(target, "--prefix", "mesh", "--consul", fake.address)[0] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["pulled"] and not any(target.iterdir())
