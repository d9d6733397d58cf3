"""What an Envoy holding a large mesh costs in memory, by the stats settings of its bootstrap.

    python bench/envoy_memory.py [--services 2000] [--concurrency 2] [--runs 2]

One `meshctl serve` serves a mesh from `meshgen.write_mesh` (`--services` ServiceEntries with one
WorkloadEntry each, no DestinationRule: one outbound cluster per service) to a sidecar without a
workload, which so holds every cluster. For each variant of the bootstrap (`meshctl bootstrap`'s
output, changed as the variant says) an Envoy starts, takes the whole mesh over ADS, and is
measured once `cluster_manager.active_clusters` has them all and its memory has stopped growing:

- `server.memory_allocated` and `server.memory_heap_size`, from Envoy's stats (tcmalloc's view);
- VmRSS, from /proc.

Variants: the bootstrap before Istio's stats settings (Envoy's default tag extractors, no
deferred stats); Istio's tag extractors with deferred stat creation off and on (`deferred_stat_options`, which `meshctl
bootstrap` sets), on with Istio's deferred cluster creation too (`cluster_manager.
enable_deferred_cluster_creation`, which it does not), and on with an inclusion list as Istio's
default proxyStatsMatcher (`--stats-inclusion-prefix cluster.xds-grpc`: Istio's required
patterns alone). Prints a Markdown table for docs/benchmarks.md. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# As in bench/generate.py: this directory off sys.path, so `validate` is the protos' package.
BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]

from meshctl.testing.envoy import envoy_binary, free_port  # noqa: E402
from meshctl.testing.serve_process import ServeProcess  # noqa: E402

CLIENT = "sidecar~127.0.0.9~client.ns-0~ns-0.svc.cluster.local"


def _meshgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("meshgen", BENCH / "meshgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without_deferred_stats(config: dict[str, Any]) -> dict[str, Any]:
    config.pop("deferred_stat_options")
    return config


def as_before(config: dict[str, Any]) -> dict[str, Any]:
    """The bootstrap before Istio's stats settings: Envoy's default tags, no deferred stats."""
    config.pop("deferred_stat_options")
    config.pop("stats_config")
    return config


def with_deferred_clusters(config: dict[str, Any]) -> dict[str, Any]:
    config.setdefault("cluster_manager", {})["enable_deferred_cluster_creation"] = True
    return config


#: Istio's stats matcher when its ProxyConfig names nothing: its required patterns alone.
ISTIO_DEFAULT_INCLUSION = ["--stats-inclusion-prefix", "cluster.xds-grpc"]

#: name -> (extra `meshctl bootstrap` flags, change to its output)
VARIANTS: dict[str, tuple[list[str], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "no stats_config, deferred stats off (the bootstrap before)": ([], as_before),
    "deferred stats off": ([], without_deferred_stats),
    "deferred stats on (meshctl bootstrap)": ([], lambda c: c),
    "deferred stats and deferred clusters on": ([], with_deferred_clusters),
    "deferred stats on, Istio's default inclusion list": (ISTIO_DEFAULT_INCLUSION, lambda c: c),
}


def admin(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10) as r:
        body: bytes = r.read()
        return body.decode()


def stat(port: int, name: str) -> int:
    text = admin(port, f"stats?filter=^{name}$")
    value = text.split(":", 1)[1].strip() if ":" in text else "0"
    return int(value)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def measure(config: dict[str, Any], admin_port: int, clusters: int, concurrency: int) -> dict[str, float]:
    binary = envoy_binary()
    assert binary is not None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "envoy.json"
        path.write_text(json.dumps(config))
        argv = [binary, "-c", str(path), "--concurrency", str(concurrency), "--log-level", "error"]
        argv += ["--disable-hot-restart"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"envoy exited with {proc.returncode}")
                try:
                    if stat(admin_port, "cluster_manager.active_clusters") >= clusters:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the mesh did not arrive within 300 s")
                time.sleep(0.2)
            # Settled: RSS unchanged (within 1%) over two seconds.
            last = rss_mb(proc.pid)
            while True:
                time.sleep(2)
                now = rss_mb(proc.pid)
                if abs(now - last) <= last * 0.01:
                    break
                last = now
            return {
                "allocated": stat(admin_port, "server.memory_allocated") / 2**20,
                "heap": stat(admin_port, "server.memory_heap_size") / 2**20,
                "rss": rss_mb(proc.pid),
                "stats": float(len(admin(admin_port, "stats").splitlines())),
            }
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=2, help="Envoy worker threads (the unit's example: 2)")
    parser.add_argument("--runs", type=int, default=2, help="Envoys per variant; the median is printed")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "mesh"
        _meshgen().write_mesh(root, args.services, 1, routed_share=0)
        with ServeProcess([root]) as server:
            rows = []
            for name, (flags, change) in VARIANTS.items():
                results = []
                for _ in range(args.runs):
                    admin_port = free_port()
                    extra = ["--admin-port", str(admin_port), *flags]
                    config = change(copy.deepcopy(server.bootstrap(CLIENT, extra_args=extra)))
                    results.append(measure(config, admin_port, args.services, args.concurrency))
                rows.append((name, {k: statistics.median(r[k] for r in results) for k in results[0]}))
                print(f"{name}: {rows[-1][1]}", file=sys.stderr)

    print(f"Machine: {platform.machine()}, Envoy --concurrency {args.concurrency}, {args.services} services\n")
    print("| bootstrap | stats | allocated MB | heap MB | RSS MB |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['stats']:,.0f} | {r['allocated']:.1f} | {r['heap']:.1f} | {r['rss']:.1f} |")


if __name__ == "__main__":
    main()
