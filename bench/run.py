"""The fleet benchmark: `meshctl serve` and a thousand simulated Envoys, against the floor.

    python bench/run.py                  # 1,000 services x 10 endpoints, 1,000 proxies, scoped
    python bench/run.py --quick          # 100 services, 100 proxies: under a minute
    python bench/run.py --proxies-sweep 100,500,1000,2000   # and docs/convergence.svg
    python bench/run.py --services-sweep 1000,5000,10000 --no-floor   # and docs/convergence-services.svg
    python bench/run.py --sotw --no-scoping --consul ...    # other shapes (see --help)
    python bench/run.py --grpc           # the proxies are proxyless gRPC clients (bench/grpc_fleet.py)

What is measured, each as p50/p99/max over the proxies concerned (see docs/benchmarks.md):

- cold start: `meshctl serve` started -> every proxy complete (clusters, endpoints, listeners,
  routes, and the SDS secrets they name, if any). Proxies are released once the server answers
  /ready, which is when its port opens: cold start = start-up + the slowest proxy's time from
  release to complete.
- config change: a VirtualService (route timeout of a shared service: every proxy imports it)
  and a DestinationRule (connection limit of a service in one namespace: only that namespace's
  proxies import it) written as an editor writes -> every affected proxy holds the new route or
  cluster. Affected = the proxies whose scope (Sidecar egress) imports the host; the others
  should receive nothing, and the table says how many did.
- endpoint churn: a WorkloadEntry (or Consul instance) added, then removed -> every proxy that
  watches its cluster holds the new assignment.
- steady state: the server's RSS with every proxy connected, per proxy over the RSS before any
  connected, and its CPU while idle.

Server RSS and CPU come from /proc/PID/status and /proc/PID/stat of the `meshctl serve` process.
The floor (bench/floor.py) then serves the same bytes to the same clients with nothing else to
do, and makes the same changes at the moment meshctl's files were written; `floor_ratio` is the
larger of meshctl's cold-start ratio and config-change p99 ratio to it.

The load runs in worker processes (bench/loadclient.py); the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The repository root goes first on sys.path, so the benchmark's modules are `bench.*` here and in
# the spawned worker processes alike; the script's own directory is taken off, so no module in
# bench/ can shadow a package of the same name (bench/validate.py once hid the protos' `validate`).
BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench import floor, loadclient  # noqa: E402
from bench.fleet import Change, Fleet, FleetSpec, parse_int_list  # noqa: E402
from bench.grpc_fleet import GrpcFleet  # noqa: E402
from bench.plot import Goal, Series, write_svg  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
DEFAULT_SVG = BENCH.parent / "docs" / "convergence.svg"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- numbers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    count: int
    p50: float
    p99: float
    max: float
    missing: int = 0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Stats:
        done = sorted(v for v in values if v is not None)
        missing = len(values) - len(done)
        if not done:
            return cls(len(values), math.nan, math.nan, math.nan, missing)
        return cls(len(values), _rank(done, 0.50), _rank(done, 0.99), done[-1], missing)


def _rank(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q of the values at or below it."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Phase:
    name: str
    stats: Stats
    #: proxies not affected that were sent something anyway
    others_pushed: int = 0
    others: int = 0
    server_cpu_s: float = 0.0
    #: from the change until the server went idle (all proxies done, affected or not)
    busy_s: float = 0.0
    #: the server's peak RSS (VmHWM) when the phase ended: a phase that grew it made the peak
    peak_rss_mb: float = 0.0
    #: CPU seconds of the load clients meanwhile: they share the machine with the server
    clients_cpu_s: float = 0.0


@dataclass
class Run:
    """One server's measurements (meshctl's, or the floor's)."""

    target: str
    startup_s: float = 0.0
    connect: Stats | None = None
    phases: list[Phase] = field(default_factory=list)
    rss_before_mb: float = 0.0
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    #: the peak (VmHWM) once every proxy was complete: what the connect storm reached
    connect_peak_rss_mb: float = 0.0
    idle_cpu_s: float = 0.0
    idle_s: float = 0.0
    cold_cpu_s: float = 0.0
    nacks: int = 0
    errors: int = 0
    #: one of the errors that ended a stream, if any did
    stream_error: str = ""

    @property
    def cold_start_s(self) -> float:
        return self.startup_s + (self.connect.max if self.connect else math.nan)

    def worst(self, kind: str, changes: Sequence[Change]) -> float:
        kinds = {c.name: c.kind for c in changes}
        return max((p.stats.p99 for p in self.phases if kinds.get(p.name) == kind), default=math.nan)


# -- processes ---------------------------------------------------------------------------------


def _pids(pids: int | Sequence[int]) -> Sequence[int]:
    return (pids,) if isinstance(pids, int) else pids


def proc_cpu_seconds(pids: int | Sequence[int]) -> float:
    """utime + stime of a process or processes, from /proc/PID/stat (fields 14 and 15)."""
    total = 0
    for pid in _pids(pids):
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def proc_memory_mb(pids: int | Sequence[int]) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the processes in MB, from /proc/PID/status: summed, so a server of
    several processes counts them all (shared pages counted in each, as RSS does)."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    for pid in _pids(pids):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in values:
                values[key] += int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def wait_idle(pid: int | Sequence[int], timeout: float, *, window: float = 0.5, share: float = 0.1) -> float:
    """Wait until the process uses less than `share` of a CPU over `window` seconds; returns when
    that quiet window began, which is when its work ended (to within `window`)."""
    deadline = time.monotonic() + timeout
    while True:
        start, cpu = time.monotonic(), proc_cpu_seconds(pid)
        time.sleep(window)
        if proc_cpu_seconds(pid) - cpu < share * window or time.monotonic() > deadline:
            return start


class Workers:
    """The load-client processes, driven together."""

    def __init__(
        self, node_ids: Sequence[str], count: int, delta: bool, dialed: dict[str, tuple[str, ...]] | None = None
    ) -> None:
        count = max(1, min(count, len(node_ids)))
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list[Any] = []
        for i in range(count):
            parent, child = SPAWN.Pipe()
            share = list(node_ids[i::count])
            mine = {n: dialed[n] for n in share} if dialed is not None else None
            proc = SPAWN.Process(target=loadclient.worker_main, args=(child, share, delta, mine), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.gather("ready", timeout=120)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(proc.pid for proc in self.procs)

    def send(self, *command: Any) -> None:
        for conn in self.conns:
            conn.send(command)

    def gather(self, expected: str, timeout: float) -> list[Any]:
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(self.conns):
            left = deadline - time.monotonic()
            pending = [c for i, c in enumerate(self.conns) if i not in replies]
            ready = multiprocessing.connection.wait(pending, timeout=max(0.0, left))
            if not ready:
                raise TimeoutError(f"load clients did not answer {expected!r} in {timeout:.0f}s")
            for conn in ready:
                try:
                    reply = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    raise RuntimeError("a load-client process died; see its traceback above") from None
                if reply[0] != expected:
                    raise RuntimeError(f"load client answered {reply!r}, expected {expected!r}")
                replies[self.conns.index(conn)] = reply  # type: ignore[arg-type]
        return [replies[i] for i in range(len(self.conns))]

    def collect(self, timeout: float) -> dict[str, Any]:
        self.send("collect", timeout)
        merged: dict[str, Any] = {"hits": {}, "others": {}, "errors": {}, "nacks": 0, "received": {}}
        for _, result in self.gather("result", timeout + 60):
            for key in ("hits", "others", "errors"):
                merged[key].update(result[key])
            merged["nacks"] += result["nacks"]
            # Short type name -> [responses, bytes], summed over every proxy.
            for short, (count, size) in result["received"].items():
                total = merged["received"].setdefault(short, [0, 0])
                total[0] += count
                total[1] += size
        return merged

    def close(self) -> None:
        try:
            self.send("close")
            self.gather("closed", timeout=60)
        except (OSError, RuntimeError, TimeoutError):
            pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


class Target:
    """A server under test: started, told about each change, stopped."""

    name = ""
    #: The server's processes (their CPU and memory are summed).
    pids: tuple[int, ...] = ()
    address = ""

    def start(self) -> None: ...

    def change(self, index: int, step: Any) -> None: ...

    def stop(self) -> None: ...

    def errors(self) -> int:
        return 0


#: The simulated fleet connects from one address, which `meshctl serve` takes for one client:
#: its per-client bounds are for real clients, so the benchmark lifts them.
FLEET_FROM_ONE_ADDRESS = ("--max-streams-per-client", "0", "--max-names-per-client", "0")


class Meshctl(Target):
    name = "meshctl"

    def __init__(self, fleet: Fleet, consul: Any, options: Options) -> None:
        from meshctl.testing.serve_process import ServeProcess

        self.fleet, self.consul, self.keep_log, self.profile = fleet, consul, options.server_log, options.profile
        self.profiler: subprocess.Popen[bytes] | None = None
        self.serve = ServeProcess(
            [fleet.root],
            consul=consul.address if consul is not None else None,
            debounce=options.debounce,
            extra_args=FLEET_FROM_ONE_ADDRESS + options.serve_args,
        )

    def start(self) -> None:
        self.serve.start(timeout=1800)
        assert self.serve.pid is not None
        self.pids = (self.serve.pid,)
        self.address = self.serve.xds_address
        if self.profile is not None:
            # py-spy is not a dependency: install it into the venv to profile (`pip install py-spy`).
            # Only the thread holding the GIL is sampled: the profile is the server's own CPU.
            command = [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(self.serve.pid)]
            command += ["-r", "200", "--gil"]
            command += ["-f", "raw", "-o", str(self.profile)]
            self.profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def change(self, index: int, step: Any) -> None:
        self.fleet.apply(step, self.consul)

    def stop(self) -> None:
        if self.profiler is not None:
            self.profiler.send_signal(signal.SIGINT)
            self.profiler.wait(60)
        self.serve.stop(timeout=120)
        if self.keep_log is not None:
            self.keep_log.write_text(self.serve.log())

    def errors(self) -> int:
        log = self.serve.log()
        return log.count(" ERROR ") + log.count("Traceback")


class FloorTarget(Target):
    """The floor (`bench/floor.py`), in one process, or in `processes` sharing its port
    (SO_REUSEPORT: the kernel spreads the connections), each holding the whole dump: what
    spreading the streams over processes buys on this machine, with nothing else to do."""

    name = "floor"

    def __init__(self, dump: Path, processes: int = 1) -> None:
        self.dump = dump
        self.processes = processes
        self.conns: list[multiprocessing.connection.Connection] = []
        self.procs: list[Any] = []

    def start(self) -> None:
        port = 0
        pids = []
        for _ in range(self.processes):
            parent, child = SPAWN.Pipe()
            proc = SPAWN.Process(
                target=floor.floor_main, args=(child, str(self.dump), port, self.processes > 1), daemon=True
            )
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
            if not parent.poll(600):
                raise TimeoutError("the floor did not start")
            _, port, pid = parent.recv()
            pids.append(pid)
        self.pids = tuple(pids)
        self.address = f"127.0.0.1:{port}"

    def change(self, index: int, step: Any) -> None:
        for conn in self.conns:
            conn.send(("switch", index + 1))
        for conn in self.conns:
            conn.recv()

    def stop(self) -> None:
        for conn in self.conns:
            conn.send(("stop",))
        for conn in self.conns:
            if conn.poll(30):
                conn.recv()
        for proc in self.procs:
            proc.join(30)


# -- one run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    spec: FleetSpec
    delta: bool = False
    workers: int = 2
    floor: bool = True
    #: Processes serving the floor, sharing its port (SO_REUSEPORT).
    floor_processes: int = 1
    idle_s: float = 10.0
    debounce: float = 0.1
    timeout_s: float = 1800.0
    server_log: Path | None = None
    profile: Path | None = None
    #: The proxies are proxyless gRPC clients (`bench/grpc_fleet.py`), measured without the floor.
    grpc: bool = False
    #: More `meshctl serve` options, as given (e.g. `--max-write-buffer-mb 256`).
    serve_args: tuple[str, ...] = ()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(target: Target, fleet: Fleet, options: Options) -> Run:
    run = Run(target.name)
    node_ids = [p.node_id for p in fleet.proxies]
    dialed = fleet.dialed if isinstance(fleet, GrpcFleet) else None
    workers = Workers(node_ids, options.workers, options.delta, dialed)
    try:
        started = time.monotonic()
        target.start()
        run.startup_s = time.monotonic() - started
        run.rss_before_mb, _ = proc_memory_mb(target.pids)
        cpu = proc_cpu_seconds(target.pids)
        log(f"{target.name}: up in {run.startup_s:.1f}s, {len(node_ids):,} proxies connecting")
        released = time.monotonic()
        workers.send("connect", target.address, ("complete",))
        workers.gather("connected", options.timeout_s)
        result = workers.collect(options.timeout_s)
        run.connect = Stats.of([_since(t, released) for t in result["hits"].values()])
        log(f"{target.name}: every proxy complete after {run.cold_start_s:.1f}s")
        wait_idle(target.pids, options.timeout_s)
        run.cold_cpu_s = proc_cpu_seconds(target.pids) - cpu
        run.rss_mb, run.connect_peak_rss_mb = proc_memory_mb(target.pids)
        log(f"{target.name}: RSS {run.rss_mb:.0f} MB with every proxy, peak {run.connect_peak_rss_mb:.0f} MB")

        cpu = proc_cpu_seconds(target.pids)
        time.sleep(options.idle_s)
        run.idle_cpu_s, run.idle_s = proc_cpu_seconds(target.pids) - cpu, options.idle_s

        for index, step in enumerate(fleet.steps()):
            change: Change = step.change
            workers.send("arm", change.check, sorted(change.affected))
            workers.gather("armed", 60)
            cpu = proc_cpu_seconds(target.pids)
            clients_cpu = proc_cpu_seconds(workers.pids)
            t0, wall = time.monotonic(), time.time()
            target.change(index, step)
            result = workers.collect(options.timeout_s)
            stats = Stats.of([_since(t, t0) for t in result["hits"].values()])
            # The change is over when the server is: it may still be working through proxies
            # the change does not affect, and the next change must not be timed on top of that.
            busy_until = wait_idle(target.pids, options.timeout_s)
            others = workers.collect(0)["others"]
            phase = Phase(change.name, stats, sum(1 for n in others.values() if n), len(others))
            phase.server_cpu_s = proc_cpu_seconds(target.pids) - cpu
            phase.busy_s = max(0.0, busy_until - t0)
            _, phase.peak_rss_mb = proc_memory_mb(target.pids)
            phase.clients_cpu_s = proc_cpu_seconds(workers.pids) - clients_cpu
            run.phases.append(phase)
            log(
                f"{target.name}: {change.name} at {_clock(wall)}: {len(change.affected):,} affected, "
                f"p99 {stats.p99:.3f}s, server busy {phase.busy_s:.1f}s (CPU {phase.server_cpu_s:.1f}s, "
                f"load clients' {phase.clients_cpu_s:.1f}s), peak RSS {phase.peak_rss_mb:.0f} MB"
            )
            run.nacks = result["nacks"]
        _, run.peak_rss_mb = proc_memory_mb(target.pids)
        run.errors = target.errors() + len(result["errors"])
        run.stream_error = next(iter(result["errors"].values()), "")
    finally:
        workers.close()
        target.stop()
    return run


def _clock(wall: float) -> str:
    """UTC time of day with milliseconds, as meshctl's log writes it, to line the two up."""
    return time.strftime("%H:%M:%S", time.gmtime(wall)) + f".{int(wall * 1000) % 1000:03d}"


def _since(at: float | None, start: float) -> float | None:
    return None if at is None else at - start


@contextmanager
def fake_consul(fleet: Fleet) -> Iterator[Any]:
    from meshctl.testing.fake_consul import FakeConsul

    with FakeConsul() as consul:
        for body in fleet.consul_instances():
            consul.register(body)
        yield consul


def run_scenario(options: Options) -> dict[str, Any]:
    spec = options.spec
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="meshctl-fleet-") as tmp:
        fleet = (GrpcFleet if options.grpc else Fleet)(spec, Path(tmp) / "mesh")
        resources = fleet.write()
        log(f"mesh: {fleet.describe()}, {resources:,} resources")
        changes = [s.change for s in fleet.steps()]
        dump_s = 0.0
        if options.floor:
            started = time.monotonic()
            dump = Path(tmp) / "floor.pickle"
            proc = SPAWN.Process(target=floor.dump_main, args=(spec, str(Path(tmp) / "floor-mesh"), str(dump)))
            proc.start()
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"building the floor's dump failed ({proc.exitcode})")
            dump_s = time.monotonic() - started
            log(f"floor: dump of {len(changes) + 1} states built in {dump_s:.0f}s")
        with ExitStack() as stack:
            consul = stack.enter_context(fake_consul(fleet)) if spec.consul else None
            mesh = measure(Meshctl(fleet, consul, options), fleet, options)
        base = None
        if options.floor:
            floor_target = FloorTarget(dump, options.floor_processes)
            base = measure(floor_target, Fleet(spec, Path(tmp) / "floor-mesh"), options)
    return summarize(Outcome(options, fleet, changes, mesh, base, resources, dump_s, load_before))


@dataclass(frozen=True)
class Outcome:
    options: Options
    fleet: Fleet
    changes: Sequence[Change]
    mesh: Run
    base: Run | None
    resources: int
    dump_s: float
    load_before: tuple[float, float, float]


def summarize(outcome: Outcome) -> dict[str, Any]:
    options, fleet, changes, mesh, base = outcome.options, outcome.fleet, outcome.changes, outcome.mesh, outcome.base
    resources, dump_s, load_before = outcome.resources, outcome.dump_s, outcome.load_before
    spec = options.spec
    proxies = spec.proxies
    out: dict[str, Any] = {
        "proxies": proxies,
        "services": spec.services,
        "endpoints": spec.endpoints,
        "resources": resources,
        "scoped": spec.scoped,
        "consul": spec.consul,
        "delta": options.delta,
        "grpc": options.grpc,
        "debounce_s": options.debounce,
        "cold_start_s": _r(mesh.cold_start_s),
        "startup_s": _r(mesh.startup_s),
        "connect_p99_s": _r(mesh.connect.p99 if mesh.connect else math.nan),
        "config_change_p99_s": _r(mesh.worst("config", changes)),
        "endpoint_change_p99_s": _r(mesh.worst("endpoint", changes)),
        "rss_mb": _r(mesh.rss_mb, 1),
        "rss_before_proxies_mb": _r(mesh.rss_before_mb, 1),
        "rss_per_proxy_kb": _r((mesh.rss_mb - mesh.rss_before_mb) * 1024 / proxies, 1),
        "peak_rss_mb": _r(mesh.peak_rss_mb, 1),
        "connect_peak_rss_mb": _r(mesh.connect_peak_rss_mb, 1),
        "idle_cpu_percent": _r(100 * mesh.idle_cpu_s / mesh.idle_s, 2) if mesh.idle_s else None,
        "cold_start_cpu_s": _r(mesh.cold_cpu_s, 2),
        "phases": {p.name: _phase(p) for p in mesh.phases},
        "nacks": mesh.nacks,
        "server_errors": mesh.errors,
    }
    failures = sum(p.stats.missing for p in mesh.phases) + (mesh.connect.missing if mesh.connect else 0)
    if base is not None:
        ratios = {
            "floor_cold_start_ratio": mesh.cold_start_s / base.cold_start_s,
            "floor_config_change_ratio": mesh.worst("config", changes) / base.worst("config", changes),
            "floor_endpoint_change_ratio": mesh.worst("endpoint", changes) / base.worst("endpoint", changes),
        }
        out["floor_ratio"] = _r(max(ratios["floor_cold_start_ratio"], ratios["floor_config_change_ratio"]), 2)
        out.update({k: _r(v, 2) for k, v in ratios.items()})
        out["floor"] = {
            "cold_start_s": _r(base.cold_start_s),
            "startup_s": _r(base.startup_s),
            "config_change_p99_s": _r(base.worst("config", changes)),
            "endpoint_change_p99_s": _r(base.worst("endpoint", changes)),
            "rss_mb": _r(base.rss_mb, 1),
            "phases": {p.name: _phase(p) for p in base.phases},
            "dump_s": _r(dump_s, 1),
        }
        failures += sum(p.stats.missing for p in base.phases) + (base.connect.missing if base.connect else 0)
    else:
        out["floor_ratio"] = None
    out["failures"] = failures
    out["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {load_before[0]:.1f} before / {os.getloadavg()[0]:.1f} after"
    )
    out["_runs"] = (mesh, base, changes, fleet.describe())
    return out


def _phase(p: Phase) -> dict[str, Any]:
    return {
        "affected": p.stats.count,
        "p50_s": _r(p.stats.p50),
        "p99_s": _r(p.stats.p99),
        "max_s": _r(p.stats.max),
        "missing": p.stats.missing,
        "others_pushed": p.others_pushed,
        "server_busy_s": _r(p.busy_s, 1),
        "peak_rss_mb": _r(p.peak_rss_mb, 1),
        "clients_cpu_s": _r(p.clients_cpu_s, 1),
        "server_cpu_s": _r(p.server_cpu_s, 2),
    }


def _r(value: float, digits: int = 3) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


# -- output ------------------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    mesh, base, _, described = result["_runs"]
    floor_phases = {p.name: p for p in base.phases} if base is not None else {}
    lines = [
        f"fleet: {described}; {'delta' if result['delta'] else 'SotW'}; debounce {result['debounce_s']}s",
        f"machine: {result['machine']}",
        "",
        "| phase | proxies | p50 (s) | p99 (s) | max (s) | floor p99 (s) | ratio | others pushed | server busy (s) "
        "| server CPU (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, stats: Stats, floor_stats: Stats | None, *, others: str = "", busy: str = "", cpu: float) -> str:
        fp99 = f"{floor_stats.p99:.3f}" if floor_stats else ""
        ratio = f"{stats.p99 / floor_stats.p99:.1f}x" if floor_stats and floor_stats.p99 else ""
        missing = f" ({stats.missing} missing)" if stats.missing else ""
        return (
            f"| {name} | {stats.count:,}{missing} | {stats.p50:.3f} | {stats.p99:.3f} | {stats.max:.3f} | {fp99} "
            f"| {ratio} | {others} | {busy} | {cpu:.1f} |"
        )

    if mesh.connect is not None:
        lines.append(row("connect (release -> complete)", mesh.connect, base.connect if base else None,
                         cpu=mesh.cold_cpu_s))  # fmt: skip
    for p in mesh.phases:
        fp = floor_phases.get(p.name)
        others, busy = f"{p.others_pushed}/{p.others}", f"{p.busy_s:.1f}"
        lines.append(row(p.name, p.stats, fp.stats if fp else None, others=others, busy=busy, cpu=p.server_cpu_s))
    lines += [
        "",
        "| server | start-up (s) | cold start (s) | RSS before proxies (MB) | RSS with proxies (MB) | per proxy (KB) "
        "| peak RSS (MB) | idle CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in (mesh, base):
        if run is None:
            continue
        per = (run.rss_mb - run.rss_before_mb) * 1024 / result["proxies"]
        idle = f"{100 * run.idle_cpu_s / run.idle_s:.1f}%" if run.idle_s else ""
        lines.append(
            f"| {run.target} | {run.startup_s:.2f} | {run.cold_start_s:.2f} | {run.rss_before_mb:.0f} | "
            f"{run.rss_mb:.0f} | {per:.0f} | {run.peak_rss_mb:.0f} | {idle} |"
        )
    if result.get("floor_ratio") is not None:
        lines += [
            "",
            f"floor ratio {result['floor_ratio']}x (cold start {result['floor_cold_start_ratio']}x, config change p99 "
            f"{result['floor_config_change_ratio']}x; endpoint change p99 {result['floor_endpoint_change_ratio']}x)",
        ]
    if result["failures"] or result["nacks"] or result["server_errors"]:
        lines.append(
            f"PROBLEMS: {result['failures']} proxies never converged, {result['nacks']} NACKs, "
            f"{result['server_errors']} errors in the server log or on streams"
        )
        if mesh.stream_error:
            lines.append(f"a stream ended with: {mesh.stream_error[:500]}")
    return "\n".join(lines)


def public(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_")}


def sweep(options: Options, counts: Sequence[int], svg: Path, *, axis: str = "proxies") -> list[dict[str, Any]]:
    """Runs at each count of `axis` (proxies, or services with the fleet's proxies), a table and a plot."""
    results = []
    for count in counts:
        log(f"--- sweep: {count:,} {axis}")
        result = run_scenario(replace(options, spec=replace(options.spec, **{axis: count})))
        print(table(result), flush=True)
        print(flush=True)
        results.append(result)
    series = [
        Series("meshctl config change p99", [(r[axis], r["config_change_p99_s"]) for r in results]),
        Series("meshctl endpoint change p99", [(r[axis], r["endpoint_change_p99_s"]) for r in results]),
    ]
    if options.floor:
        series += [
            Series("floor config change p99", [(r[axis], r["floor"]["config_change_p99_s"]) for r in results],
                   dashed=True),
            Series("floor endpoint change p99", [(r[axis], r["floor"]["endpoint_change_p99_s"]) for r in results],
                   dashed=True),
        ]  # fmt: skip
    first = results[0]
    fixed = (
        f"{first['services']:,} services x {first['endpoints']} endpoints"
        if axis == "proxies"
        else f"{first['proxies']:,} proxies, {first['endpoints']} endpoints per service"
    )
    title = f"Convergence p99, {fixed}{', scoped' if first['scoped'] else ''}{', delta' if first['delta'] else ''}"
    goals = [Goal(1.0, "goal: config change p99 < 1 s"), Goal(0.3, "goal: endpoint change p99 < 0.3 s")]
    write_svg(svg, title, axis, "seconds (log scale)", series, goals=goals)
    log(f"wrote {svg}")
    print(f"| {axis} | cold start (s) | config change p99 (s) | endpoint change p99 (s) | RSS (MB) | floor ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r[axis]:,} | {r['cold_start_s']} | {r['config_change_p99_s']} | {r['endpoint_change_p99_s']} "
            f"| {r['rss_mb']} | {r['floor_ratio']} |"
        )
    return results


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 services, 100 proxies, 5 s idle")
    parser.add_argument("--services", type=int)
    parser.add_argument("--endpoints", type=int, default=10, help="WorkloadEntries (VMs) per service")
    parser.add_argument("--proxies", type=int)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--shared", type=int, default=5, help="services every namespace's Sidecar imports")
    parser.add_argument("--routed-share", type=float, default=0.2, help="share of services with a DR and a VS")
    parser.add_argument("--no-scoping", action="store_true", help="no Sidecars: every proxy sees every service")
    parser.add_argument("--consul", action="store_true", help="services from a fake Consul instead of files")
    protocol = parser.add_mutually_exclusive_group()
    protocol.add_argument(
        "--delta",
        dest="delta",
        action="store_true",
        default=None,
        help="incremental xDS, as meshctl's bootstrap gives Envoy (the default for Envoys)",
    )
    protocol.add_argument("--sotw", dest="delta", action="store_false", help="state of the world instead")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="load-client processes")
    parser.add_argument("--no-floor", action="store_true", help="measure meshctl only")
    parser.add_argument(
        "--grpc",
        action="store_true",
        help="proxyless gRPC clients (GENERATOR grpc) dialing 5 services each instead of Envoys; no floor",
    )
    parser.add_argument(
        "--floor-processes",
        type=int,
        default=1,
        help="serve the floor from this many processes sharing its port: what spreading streams buys",
    )
    parser.add_argument("--idle", type=float, help="seconds of idle for the steady-state CPU (default 10)")
    parser.add_argument("--debounce", type=float, default=0.1, help="meshctl serve --debounce (its default)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest wait for any phase, seconds")
    parser.add_argument("--proxies-sweep", type=parse_int_list, help="e.g. 100,500,1000,2000: runs and a plot")
    parser.add_argument(
        "--services-sweep",
        type=parse_int_list,
        help="e.g. 1000,5000,10000: runs and a plot (docs/convergence-services.svg)",
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="more `meshctl serve` options, e.g. --serve-arg='--max-write-buffer-mb 256' (repeatable)",
    )
    parser.add_argument("--server-log", type=Path, help="keep meshctl's log here")
    parser.add_argument("--profile", type=Path, help="py-spy the server into this file (collapsed stacks)")
    parser.add_argument("--svg", type=Path, default=DEFAULT_SVG)
    args = parser.parse_args(argv)
    if args.grpc and args.delta:
        parser.error("--grpc: gRPC's xDS client speaks state of the world only")
    services = args.services or (100 if args.quick else 1000)
    proxies = args.proxies or (100 if args.quick else 1000)
    idle = args.idle if args.idle is not None else (5.0 if args.quick else 10.0)
    spec = FleetSpec(
        services=services,
        endpoints=args.endpoints,
        proxies=proxies,
        namespaces=max(1, min(args.namespaces, services // 2)),
        scoped=not args.no_scoping,
        shared=max(1, min(args.shared, services // 4)),
        routed_share=args.routed_share,
        consul=args.consul,
    )
    options = Options(
        spec=spec,
        delta=not args.grpc if args.delta is None else args.delta,
        workers=args.workers,
        floor=not args.no_floor and not args.grpc,
        floor_processes=max(1, args.floor_processes),
        idle_s=idle,
        debounce=args.debounce,
        timeout_s=args.timeout,
        server_log=args.server_log,
        profile=args.profile,
        grpc=args.grpc,
        serve_args=tuple(arg for option in args.serve_arg for arg in shlex.split(option)),
    )
    return args, options


def main(argv: Sequence[str] | None = None) -> int:
    args, options = parse_args(argv)
    if args.services_sweep:
        svg = args.svg if args.svg != DEFAULT_SVG else BENCH.parent / "docs" / "convergence-services.svg"
        results = sweep(options, args.services_sweep, svg, axis="services")
        last = {**public(results[-1]), "sweep": [public(r) for r in results]}
        print(json.dumps(last))
        return 1 if any(r["failures"] for r in results) else 0
    if args.proxies_sweep:
        results = sweep(options, args.proxies_sweep, args.svg)
        last = {**public(results[-1]), "sweep": [public(r) for r in results]}
        print(json.dumps(last))
        return 1 if any(r["failures"] for r in results) else 0
    result = run_scenario(options)
    print(table(result))
    print(json.dumps(public(result)))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
