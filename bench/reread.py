"""The CPU of one file's re-read after an edit, on the path `meshctl serve` takes for a file event.

    python bench/reread.py                       # the file of 1,000 in a mesh of 10,000, 30 edits
    python bench/reread.py --mesh-services 1000 --edits 50

The tree is `bench/envoy_edit.py`'s: one file of N ServiceEntries (namespace `catalog`) among the
fleet's other services. A `DirectoryWatcher` is started on it as `serve` starts it (inotify, the
100 ms debounce) with the store and the file registry following the store; each edit adds one
ServiceEntry at the end of the file, written as an editor does (a new file renamed over the
old). What is measured is the CPU time of the watcher's thread from the write until it has
been idle a while after the store's change (the re-read of the file, the loader, the store's
diff and the file registry's patch all run on that thread), read from the thread's own CPU
clock. The server's other threads are not running: this is the ingest part of an edit alone.

The last line is one JSON object: CPU ms per edit (median, least, mean) and the load average.
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

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.envoy_edit import entry, write_atomically, write_mesh  # noqa: E402
from meshctl.config.model import ConfigKey  # noqa: E402
from meshctl.config.store import ConfigChange, ConfigStore  # noqa: E402
from meshctl.config.watcher import DirectoryWatcher, WatchOptions  # noqa: E402
from meshctl.registry.files import FileRegistry  # noqa: E402


def _thread_clock(name: str) -> int:
    """The CPU clock of the thread called `name`."""
    thread = next(t for t in threading.enumerate() if t.name == name)
    assert thread.ident is not None
    return time.pthread_getcpuclockid(thread.ident)


def measure(entries: int, mesh_services: int, edits: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="meshctl-reread-") as tmp:
        root = Path(tmp) / "mesh"
        path, docs = write_mesh(root, entries, mesh_services)
        store = ConfigStore()
        registry = FileRegistry()
        registry.follow(store)
        changed = threading.Event()

        def note(_change: ConfigChange) -> None:
            changed.set()

        store.subscribe(note)
        watcher = DirectoryWatcher([root], store, WatchOptions(debounce=0.1, resync_period=0))
        watcher.start()
        gc.collect()
        gc.freeze()  # as `meshctl serve` does after start-up
        clock = _thread_clock("meshctl-config-watcher")
        cpu: list[float] = []
        try:
            for edit in range(edits):
                docs.append(entry(entries + edit))
                changed.clear()
                before = time.clock_gettime_ns(clock)
                write_atomically(path, "---\n".join(docs))
                if not changed.wait(30):
                    raise SystemExit(f"edit {edit}: no change reached the store")
                time.sleep(0.3)  # the reload's last steps after the store's change; no overlap
                cpu.append((time.clock_gettime_ns(clock) - before) / 1e6)
                assert store.get(ConfigKey("ServiceEntry", "catalog", f"ext-{entries + edit}")) is not None
        finally:
            watcher.stop()
            gc.unfreeze()
    return {
        "entries": entries,
        "mesh_services": max(mesh_services, entries),
        "edits": edits,
        "cpu_ms_median": round(statistics.median(cpu), 2),
        "cpu_ms_least": round(min(cpu), 2),
        "cpu_ms_mean": round(statistics.fmean(cpu), 2),
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--mesh-services", type=int, default=10000)
    parser.add_argument("--edits", type=int, default=30)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.entries, args.mesh_services, args.edits)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
