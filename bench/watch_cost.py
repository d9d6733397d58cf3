"""What one file edit costs the directory watcher, as the config tree grows.

    python bench/watch_cost.py                          # 1,000 / 5,000 / 10,000 / 20,000 files
    python bench/watch_cost.py --files 1000,20000 --changes 9

A tree of N files (one ServiceEntry each, 100 files to a directory) is written to a temporary
directory and followed by the watcher `meshctl serve` runs (real inotify events, the default
debounce), into a config store. Then one file at a time is rewritten with new content, and the
CPU time the whole process spends from the write until the store has the change is taken
(`time.process_time`: the watchdog thread, the watcher thread, the store). The main thread
waits on an event meanwhile, so it adds nothing. As `meshctl serve` does once started, the
loaded tree is moved out of the garbage collector's sight (`gc.freeze`). CPU time moves little with the machine's load;
the load average is printed anyway.

The start-up load (a full pass, every file parsed) is reported too, as wall and CPU seconds.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from meshctl.config.store import ConfigChange, ConfigStore  # noqa: E402
from meshctl.config.watcher import DirectoryWatcher, WatchOptions  # noqa: E402

#: Files written at most this long ago are compared by content, not by stat (the watcher's
#: racy window); the tree is left alone this long before the watcher starts.
RACY_WINDOW = 2.1


def service_entry(i: int, port: int) -> str:
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: svc-{i}
  namespace: ns-{i // 100}
spec:
  hosts:
  - svc-{i}.ns-{i // 100}.mesh
  ports:
  - number: {port}
    name: http
    protocol: HTTP
  resolution: STATIC
  endpoints:
  - address: 10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}
"""


def file_of(root: Path, i: int) -> Path:
    return root / f"ns-{i // 100}" / f"svc-{i}.yaml"


def write_tree(root: Path, count: int) -> None:
    for i in range(count):
        path = file_of(root, i)
        if i % 100 == 0:
            path.parent.mkdir()
        path.write_text(service_entry(i, 8080))


def measure(count: int, changes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="watch-cost-") as tmp:
        root = Path(tmp) / "mesh"
        root.mkdir()
        write_tree(root, count)
        time.sleep(RACY_WINDOW)
        store = ConfigStore()
        applied = threading.Event()

        def on_change(change: ConfigChange) -> None:
            applied.set()

        store.subscribe(on_change)
        wall, cpu = time.monotonic(), time.process_time()
        watcher = DirectoryWatcher([root], store, WatchOptions())
        watcher.start()
        start_wall, start_cpu = time.monotonic() - wall, time.process_time() - cpu
        assert len(store.configs) == count, len(store.configs)
        gc.collect()
        gc.freeze()  # as `meshctl serve` does once started: the loaded tree is not scanned again
        try:
            time.sleep(0.5)  # anything the start-up left pending is done
            costs: list[float] = []
            for n in range(changes):
                i = (n * 7919) % count
                gc.collect()
                applied.clear()
                before = time.process_time()
                file_of(root, i).write_text(service_entry(i, 9000 + n))
                if not applied.wait(30.0):
                    raise RuntimeError(f"the edit of file {i} was not applied within 30 s")
                costs.append(time.process_time() - before)
                time.sleep(0.3)  # let the watcher go quiet before the next edit
        finally:
            watcher.stop()
            gc.unfreeze()
    return {
        "files": count,
        "start_wall_s": round(start_wall, 3),
        "start_cpu_s": round(start_cpu, 3),
        "change_cpu_ms_median": round(statistics.median(costs) * 1000, 2),
        "change_cpu_ms_min": round(min(costs) * 1000, 2),
        "change_cpu_ms_max": round(max(costs) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="1000,5000,10000,20000", help="tree sizes, comma-separated")
    parser.add_argument("--changes", type=int, default=7, help="edits measured per tree size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.files.split(",") if s]
    load_before = os.getloadavg()
    rows = [measure(count, args.changes) for count in sizes]
    load_after = os.getloadavg()
    print("| files | start wall s | start CPU s | one-file change CPU ms (median, min-max) |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        spread = f"{row['change_cpu_ms_min']:.1f}-{row['change_cpu_ms_max']:.1f}"
        print(
            f"| {row['files']:,} | {row['start_wall_s']:.1f} | {row['start_cpu_s']:.1f} |"
            f" {row['change_cpu_ms_median']:.1f} ({spread}) |"
        )
    medians = [r["change_cpu_ms_median"] for r in rows]
    spread = max(medians) / min(medians) if min(medians) > 0 else float("inf")
    loads = f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    print(f"largest / smallest median: {spread:.2f}; {loads}")
    print(json.dumps({"rows": rows, "ratio": round(spread, 3), "load_before": load_before, "load_after": load_after}))


if __name__ == "__main__":
    main()
