"""`meshctl serve --config-consul-kv`: the config of a Consul KV prefix, served as the files would be.

The server runs in-process against the fake Consul, with an in-process ADS client as the proxy;
the config gets there with `meshctl kv push`, as it would in production.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import PRODUCTPAGE
from typer.testing import CliRunner

from meshctl.cli.app import app
from meshctl.config import yamlsource
from meshctl.config.loader import LoadOptions
from meshctl.config.model import ConfigKey
from meshctl.config.store import ConfigStore
from meshctl.kv.source import KvLocation, KvWatcher
from meshctl.registry.consul_http import ConsulOptions
from meshctl.server.app import Server
from meshctl.testing.ads_client import AdsClient
from meshctl.testing.fake_consul import FakeConsul
from meshctl.testing.server import run, serving
from meshctl.xds import types

pytestmark = pytest.mark.consul

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "configs"
REVIEWS = "reviews.bookinfo.mesh"
BROKEN = b"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: [oops\n"

runner = CliRunner()


def quick(address: str) -> ConsulOptions:
    """Consul options with test timings: short waits, quick retries after an outage."""
    return ConsulOptions(address=address, wait=2.0, backoff_min=0.05, backoff_max=0.2, rate_interval=0.0)


def push(mesh: Path, fake: FakeConsul, prefix: str = "meshctl/mesh") -> None:
    result = runner.invoke(app, ["kv", "push", str(mesh), "--prefix", prefix, "--consul", fake.address])
    assert result.exit_code == 0, result.output


def wait_for(condition: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def reviews_weights(client: AdsClient) -> set[int]:
    """The weights of the weighted routes to reviews the proxy holds."""
    weights: set[int] = set()
    for config in client.resources[types.ROUTE].values():
        for host in config.virtual_hosts:  # type: ignore[attr-defined]
            for route in host.routes:
                if route.route.HasField("weighted_clusters"):
                    clusters = route.route.weighted_clusters.clusters
                    weights |= {c.weight.value for c in clusters if REVIEWS in c.name}
    return weights


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.fixture
def fake() -> Iterator[FakeConsul]:
    with FakeConsul() as f:
        yield f


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    target = tmp_path / "mesh"
    shutil.copytree(EXAMPLES, target)
    return target


def test_a_proxy_gets_the_pushed_config_and_a_second_push_reaches_it(fake: FakeConsul, mesh: Path) -> None:
    push(mesh, fake)

    async def body() -> None:
        kv = KvLocation(quick(fake.address), "meshctl/mesh")
        async with serving((), config_kv=kv) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete() and reviews_weights(c) == {90, 10})
            # The ServiceEntries and WorkloadEntries in KV are services, with endpoints.
            assert any(REVIEWS in name for name in c.names(types.ENDPOINT))
            assert server.store.file_status()["bookinfo/traffic.yaml"].ok
            revision = server.store.revision
            edit(mesh / "bookinfo" / "traffic.yaml", "weight: 90", "weight: 70")
            edit(mesh / "bookinfo" / "traffic.yaml", "weight: 10", "weight: 30")
            push(mesh, fake)
            await c.wait_for(lambda c: reviews_weights(c) == {70, 30})
            assert server.store.revision == revision + 1  # one push, one revision

    run(body)


def test_a_broken_key_keeps_its_last_good_config_and_is_reported(fake: FakeConsul, mesh: Path) -> None:
    push(mesh, fake)

    async def body() -> None:
        kv = KvLocation(quick(fake.address), "meshctl/mesh")
        async with serving((), config_kv=kv) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete() and reviews_weights(c) == {90, 10})
            fake.kv_put("meshctl/mesh/bookinfo/traffic.yaml", BROKEN)
            wait_for(lambda: not server.store.file_status()["bookinfo/traffic.yaml"].ok, "the error reported")
            errors = server.store.errors()
            assert errors and all(f.file == "bookinfo/traffic.yaml" for f in errors)
            await c.wait_for(lambda c: reviews_weights(c) == {90, 10})  # still served
            assert any(c.key.name == "reviews" and c.key.kind == "VirtualService" for c in server.store.list())
            # Fixed: the error goes, and the new config is served.
            fixed = (mesh / "bookinfo" / "traffic.yaml").read_text().replace("weight: 90", "weight: 60")
            fake.kv_put("meshctl/mesh/bookinfo/traffic.yaml", fixed.replace("weight: 10", "weight: 40").encode())
            await c.wait_for(lambda c: reviews_weights(c) == {60, 40})
            assert server.store.errors() == []

    run(body)


def test_a_consul_outage_keeps_serving_and_recovers_on_its_own(fake: FakeConsul, mesh: Path) -> None:
    push(mesh, fake)

    async def body() -> None:
        kv = KvLocation(quick(fake.address), "meshctl/mesh")
        async with serving((), config_kv=kv) as server, AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
            await c.wait_for(lambda c: c.complete() and reviews_weights(c) == {90, 10})
            configs = dict(server.store.configs)
            fake.stop()
            wait_for(server.store.errors, "the outage reported")
            assert "cannot read consul KV" in str(server.store.errors()[0])
            assert dict(server.store.configs) == configs  # everything kept
            await c.wait_for(lambda c: reviews_weights(c) == {90, 10})
            fake.start()  # same port, same KV
            wait_for(lambda: not server.store.errors(), "the recovery")
            edit(mesh / "bookinfo" / "traffic.yaml", "weight: 90", "weight: 75")
            edit(mesh / "bookinfo" / "traffic.yaml", "weight: 10", "weight: 25")
            push(mesh, fake)
            await c.wait_for(lambda c: reviews_weights(c) == {75, 25})

    run(body)


def test_deleted_keys_delete_and_an_emptied_prefix_deletes_nothing(fake: FakeConsul, mesh: Path) -> None:
    push(mesh, fake)
    store = ConfigStore()
    watcher = KvWatcher(KvLocation(quick(fake.address), "meshctl/mesh"), store, LoadOptions())
    first = watcher.start()
    try:
        assert first.errors == () and any(c.kind == "Gateway" for c in store.configs.values())
        revision = store.revision
        assert fake.kv_delete("meshctl/mesh/bookinfo/gateway.yaml")
        wait_for(lambda: not any(c.kind == "Gateway" for c in store.configs.values()), "the Gateway deleted")
        assert store.revision == revision + 1
        kept = dict(store.configs)
        assert fake.kv_delete("meshctl/mesh/", recurse=True)
        wait_for(store.errors, "the emptied prefix reported")
        assert "holds no keys any more" in str(store.errors()[0])
        assert dict(store.configs) == kept
        # An empty .yaml key: an empty mesh on purpose.
        fake.kv_put("meshctl/mesh/empty.yaml", b"")
        wait_for(lambda: not store.configs, "the mesh emptied on purpose")
        assert store.errors() == []
        # Keys under a longer name that starts the same are not the prefix's.
        fake.kv_put("meshctl/mesh-old/x.yaml", (mesh / "bookinfo" / "gateway.yaml").read_bytes())
        time.sleep(0.2)
        assert not store.configs
    finally:
        assert watcher.stop()


def test_other_data_under_the_prefix_is_never_fetched_and_an_oversized_key_keeps_its_config(
    fake: FakeConsul, mesh: Path
) -> None:
    """A prefix shared with other data (a backup, blobs): their key names are read, never their
    bytes, on the first read or on any change after it."""
    push(mesh, fake)
    blob = b"\0" * (12 * 1024 * 1024)
    fake.kv_put("meshctl/mesh/backups/mesh.tar", blob)
    fake.kv_put("meshctl/mesh/notes.txt", blob)
    sent = fake.bytes_sent
    store = ConfigStore()
    load = LoadOptions(max_file_bytes=64 * 1024)
    watcher = KvWatcher(KvLocation(quick(fake.address), "meshctl/mesh"), store, load)
    try:
        assert watcher.start().errors == () and any(c.kind == "Gateway" for c in store.configs.values())
        revision = store.revision
        gateway = mesh / "bookinfo" / "gateway.yaml"
        fake.kv_put("meshctl/mesh/bookinfo/gateway.yaml", gateway.read_bytes().replace(b"8080", b"8081"))
        wait_for(lambda: store.revision > revision, "the edit applied")
        assert fake.bytes_sent - sent < 1024 * 1024  # the config is some kilobytes; each blob is 12 MB
        # A YAML key over the size limit is an error of its own; the others still apply.
        kept = dict(store.configs)
        fake.kv_put("meshctl/mesh/bookinfo/gateway.yaml", b"# " + b"x" * (128 * 1024))
        wait_for(store.errors, "the oversized key reported")
        (error,) = store.errors()
        assert error.file == "bookinfo/gateway.yaml" and "limit" in error.message
        assert dict(store.configs) == kept
    finally:
        assert watcher.stop()


def test_a_server_started_while_consul_is_down_picks_the_config_up_later(mesh: Path) -> None:
    with FakeConsul() as fake:
        push(mesh, fake)
        fake.stop()

        async def body() -> None:
            kv = KvLocation(quick(fake.address), "meshctl/mesh")
            async with serving((), config_kv=kv) as server:
                assert isinstance(server, Server) and server.store.errors()
                assert server.admission() is not None  # proxies wait rather than get an empty mesh
                fake.start()
                wait_for(lambda: server.store.configs and not server.store.errors(), "the config read")
                # Admitted once a snapshot of the config is built, on the loop: wait without blocking it.
                for _ in range(200):
                    if server.admission() is None:
                        break
                    await asyncio.sleep(0.05)
                assert server.admission() is None, "proxies admitted"
                async with AdsClient(f"127.0.0.1:{server.xds_port}", PRODUCTPAGE) as c:
                    await c.wait_for(lambda c: c.complete() and reviews_weights(c) == {90, 10})

        run(body)


def test_serve_takes_one_config_source() -> None:
    result = runner.invoke(app, ["serve", "--config-dir", str(EXAMPLES), "--config-consul-kv", "mesh"])
    assert result.exit_code == 2 and "either --config-dir or --config-consul-kv" in result.stderr
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and "either --config-dir or --config-consul-kv" in result.stderr


def test_one_changed_key_among_many_costs_one_read_and_one_parse(
    fake: FakeConsul, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change is read in one request whatever the prefix holds, and only the key whose
    ModifyIndex moved is parsed; the others keep what they gave."""
    count = 300
    entry = (
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: s{i}, namespace: shop}}\n"
        "spec: {{hosts: [s{i}.shop.mesh], ports: [{{number: 80, name: http, protocol: HTTP}}], resolution: DNS}}\n"
    )
    for i in range(count):
        fake.kv_put(f"meshctl/mesh/s{i:03d}.yaml", entry.format(i=i).encode())
    fake.kv_put("meshctl/mesh/teams/", b"")  # a folder key, as `consul kv put` makes them
    parsed: list[str] = []
    real = yamlsource.parse_documents

    def counting(text: str, **kwargs: object) -> list[yamlsource.Document]:
        parsed.append(text)
        return real(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(yamlsource, "parse_documents", counting)
    store = ConfigStore()
    watcher = KvWatcher(KvLocation(quick(fake.address), "meshctl/mesh"), store)
    try:
        watcher.start()
        wait_for(lambda: len(store.configs) == count, "the prefix loaded", timeout=120)
        assert len(parsed) == count
        parsed.clear()
        wait_for(lambda: fake.in_flight("/v1/kv/meshctl/mesh/") == 1, "the listing blocking for a change")
        reads = len(fake.requests)
        revision = store.revision
        fake.kv_put("meshctl/mesh/s007.yaml", entry.format(i=7).replace("DNS", "STATIC").encode())
        wait_for(lambda: store.revision > revision, "the edit applied", timeout=120)
        assert len(parsed) == 1 and "s7.shop.mesh" in parsed[0]
        config = store.get(ConfigKey("ServiceEntry", "shop", "s7"))
        assert config is not None and config.spec.resolution == 1  # type: ignore[attr-defined]  # STATIC
        # The listing that answers was asked before the edit; then one read of the values, and
        # the next listing (no read per key: the prefix holds nothing but config).
        after = [r for r in fake.requests[reads:] if r.path.startswith("/v1/kv/")]
        assert len(after) <= 2, after
        assert [r.query.get("recurse") for r in after if "index" not in r.query] == ["true"]
    finally:
        assert watcher.stop()


def test_changes_applied_key_by_key_leave_the_store_as_a_fresh_read_does(fake: FakeConsul) -> None:
    """Each answer is applied at the cost of the keys it changed; the store must end up as a
    server reading the prefix afresh has it: the first definition of a resource defined twice
    wins (by key name), the other is an error that goes when the winner does."""
    prefix = "meshctl/mesh"

    def vs(host: str) -> bytes:
        return (
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x, namespace: shop}\n"
            f"spec: {{hosts: [{host}], http: [{{route: [{{destination: {{host: {host}}}}}]}}]}}\n"
        ).encode()

    def seen(store: ConfigStore) -> tuple[object, ...]:
        configs = {k: (c.source, c.content_digest()) for k, c in store.configs.items()}
        return configs, {p: s.findings for p, s in store.file_status().items()}

    def fresh() -> tuple[object, ...]:
        store = ConfigStore()
        other = KvWatcher(KvLocation(quick(fake.address), prefix), store)
        try:
            other.start()
            return seen(store)
        finally:
            assert other.stop()

    fake.kv_put(f"{prefix}/b.yaml", vs("b.shop.mesh"))
    fake.kv_put(f"{prefix}/c.yaml", vs("c.shop.mesh").replace(b"name: x", b"name: c"))
    store = ConfigStore()
    watcher = KvWatcher(KvLocation(quick(fake.address), prefix), store)
    steps: list[Callable[[], object]] = [
        lambda: fake.kv_put(f"{prefix}/a.yaml", vs("a.shop.mesh")),  # a now wins, b is an error
        lambda: fake.kv_put(f"{prefix}/b.yaml", vs("b2.shop.mesh")),  # b changes, still the loser
        lambda: fake.kv_delete(f"{prefix}/a.yaml"),  # b wins again
        lambda: fake.kv_put(f"{prefix}/c.yaml", vs("c.shop.mesh")),  # c now defines x too, after b
        lambda: fake.kv_delete(f"{prefix}/b.yaml"),  # c's x wins, and c loses its own resource c
        lambda: fake.kv_put(f"{prefix}/a.yaml", vs("a.shop.mesh") + b"---\n" + vs("a2.shop.mesh")),  # twice in one
    ]
    try:
        watcher.start()
        assert seen(store) == fresh()
        for step in steps:
            step()
            wait_for(lambda: seen(store) == fresh(), "the store as a fresh read has it", timeout=20)
        # A broken key keeps its last good resources (which a fresh read never saw), and its
        # fix is applied as a fresh read has it.
        kept = dict(store.configs)
        fake.kv_put(f"{prefix}/a.yaml", BROKEN)
        wait_for(lambda: any(f.file == "a.yaml" for f in store.errors()), "the broken key reported")
        assert dict(store.configs) == kept
        fake.kv_put(f"{prefix}/a.yaml", vs("a3.shop.mesh"))
        wait_for(lambda: seen(store) == fresh(), "the fix applied as a fresh read has it", timeout=20)
    finally:
        assert watcher.stop()
