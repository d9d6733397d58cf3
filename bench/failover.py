"""Replica failover: two `meshctl serve` replicas, a fleet of simulated Envoys split over them, and
one replica killed (SIGKILL): how long until every proxy is on the survivor and in sync, what that
costs the survivor, and what the proxies that moved were sent.

    python bench/failover.py                                  # 1,000 services x 10, 2,000 proxies, SotW
    python bench/failover.py --modes sotw,delta --pacing 0,200   # four configurations, as docs/benchmarks.md
    python bench/failover.py --services 100 --proxies 200 --workers 1   # a quick look

What runs (see docs/replicas.md): the fleet benchmark's mesh (`bench/fleet.py`), written once, and,
for each configuration (mode x pacing), two `python -m meshctl serve` processes on it, fresh, with
`--max-new-streams-per-second` set to the pacing (0: off) and `--max-connection-age 0` (no
rebalancing during the run). The second replica starts from a copy of the first one's state
directory, so they share a CA, as docs/replicas.md asks. The proxies prove no identity, so they get
no workload certificates (as in `bench/run.py`): every byte sent is the same on both replicas.

The proxies are `bench/loadclient.py`'s, in worker processes: proxy j of a worker starts on
replica j mod 2, and a proxy whose stream ends retries with Envoy's jittered backoff (500 ms base,
doubling, reset by a response) on the other replica, then the first again, as Envoy's round robin
over its two `xds-grpc` endpoints would, presenting what it holds (SotW: per type the version it
last accepted; delta: `initial_resource_versions`). A stream refused by pacing (UNAVAILABLE,
`meshctl.server.ads.TOO_MANY_NEW_STREAMS`) is retried the same way.

What is measured, per configuration, from the SIGKILL of the replica that holds about half the proxies:

- failover: until the survivor's `/debug/syncz` lists every proxy bound to its current snapshot
  with every type ACKed at the version sent (polled once its `pilot_xds` gauge counts every proxy;
  an upper bound, to the poll's latency). Two cross-checks: the last moved stream's `connected_at`
  as the survivor recorded it (acceptance), and, client side, when the last moved proxy opened the
  stream it ended on or received its last response.
- what the moved proxies were sent, responses and bytes by type, and what the proxies already on
  the survivor were sent (should be nothing either way, when replicas agree);
- the survivor's CPU seconds over the failover window and until its CPU went quiet, its RSS before,
  its peak (VmHWM, when it rose after the kill; else the highest of samples every 0.1 s) and after;
- streams refused by pacing, attempts that found the dead replica (connection refused), and any
  other stream to the survivor that failed, with the reasons the clients were given;
- the survivor's pushes by type (`pilot_xds_pushes`), and ERROR/WARNING lines in its log;
- for comparison, the cold connect before it: every proxy complete, and both replicas' CPU for it.

The last line printed is one JSON object: the first configuration's numbers at the top level, and
every configuration's under `runs`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# As bench/run.py: the repository root first, the script's own directory off sys.path.
BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.fleet import Fleet, FleetSpec  # noqa: E402
from bench.run import Workers, log, proc_cpu_seconds, proc_memory_mb, wait_idle  # noqa: E402
from meshctl.testing.serve_process import ServeProcess  # noqa: E402

TYPES = ("CDS", "EDS", "LDS", "RDS", "SDS")
#: How often the survivor is looked at during the failover: its RSS and its `pilot_xds` gauge.
SAMPLE_S = 0.1
_PUSHES = re.compile(r'^pilot_xds_pushes\{type="(\w+)"\} (\S+)$', re.MULTILINE)
_CONNECTED = re.compile(r"^pilot_xds (\S+)$", re.MULTILINE)
_LEVEL = re.compile(r"^\S+ (ERROR|WARNING) (.*)$", re.MULTILINE)
#: meshctl.server.secrets' warning, once per proxy, for a stream that proved no identity.
EXPECTED = "gets no workload certificate"


@dataclass(frozen=True)
class Options:
    spec: FleetSpec
    modes: tuple[str, ...] = ("sotw",)
    pacing: tuple[float, ...] = (0.0,)
    workers: int = 2
    timeout_s: float = 240.0
    keep_logs: Path | None = None


# -- the replicas ------------------------------------------------------------------------------


def start_replicas(root: Path, tmp: Path, pacing: float) -> tuple[ServeProcess, ServeProcess]:
    """Two replicas on one config: the second's state directory is a copy of the first's, taken
    once the first has made its CA, so both sign with one root (docs/replicas.md)."""
    flags = ["--max-new-streams-per-second", f"{pacing:g}", "--max-connection-age", "0"]
    # The simulated fleet connects from one address, which serve takes for one client.
    flags += ["--max-streams-per-client", "0", "--max-names-per-client", "0"]
    state_a, state_b = tmp / "state-a", tmp / "state-b"
    for state in (state_a, state_b):
        shutil.rmtree(state, ignore_errors=True)
    a = ServeProcess([root], debounce=0.1, extra_args=[*flags, "--state-dir", str(state_a)])
    a.start(timeout=600)
    shutil.copytree(state_a, state_b)
    b = ServeProcess([root], debounce=0.1, extra_args=[*flags, "--state-dir", str(state_b)])
    try:
        b.start(timeout=600)
    except BaseException:
        a.stop()
        raise
    return a, b


def metrics(server: ServeProcess) -> tuple[int, dict[str, float]]:
    """(connected proxies, pushes by type) from the server's /metrics: cheap to ask, unlike syncz."""
    text = server.admin("/metrics")
    connected = _CONNECTED.search(text)
    pushes = {t.upper(): float(n) for t, n in _PUSHES.findall(text)}
    return (int(float(connected.group(1))) if connected else 0), pushes


def in_sync(entries: Sequence[dict[str, Any]]) -> set[str]:
    """The proxies that syncz shows bound to the current snapshot with every type they watch
    ACKed at the version last sent, without a NACK."""
    out = set()
    for entry in entries:
        kinds = entry["types"]
        if not entry["snapshot"] or entry["snapshot"] != entry["latest_snapshot"]:
            continue
        if not {"CDS", "LDS"} <= kinds.keys():
            continue
        if all(t["sent"] and t["sent"] == t["acked"] and not t["nack"] for t in kinds.values()):
            out.add(entry["proxy"])
    return out


def log_lines(server: ServeProcess, since: int) -> list[tuple[str, str]]:
    """(level, message) of the ERROR and WARNING lines logged after offset `since`, and tracebacks;
    but not the warning each proxy earns by proving no identity (`EXPECTED`): all of them do here."""
    text = server.log()[since:]
    found = [(level, message) for level, message in _LEVEL.findall(text) if EXPECTED not in message]
    found += [("ERROR", "Traceback")] * text.count("Traceback")
    return found


def page_cost(server: ServeProcess, path: str, polls: int) -> float:
    """The server's CPU milliseconds per request of an admin page, measured while it is otherwise
    quiet: the failover's CPU includes the polls that watched it."""
    cpu = proc_cpu_seconds(server.pid or 0)
    for _ in range(polls):
        server.admin(path)
    return 1000 * (proc_cpu_seconds(server.pid or 0) - cpu) / polls


# -- one configuration ---------------------------------------------------------------------------


def _sum_received(states: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    total: dict[str, list[int]] = {}
    for state in states:
        for short, (count, size) in state["received"].items():
            t = total.setdefault(short, [0, 0])
            t[0] += count
            t[1] += size
    return {k: total[k] for k in TYPES if k in total}


def _ended_on(states: Iterable[dict[str, Any]], address: str) -> int:
    """Streams to `address` that ended other than refused."""
    return sum(n for st in states for why, n in st["ends"].items() if why.partition(" ")[0] == address)


def _ends(states: Iterable[dict[str, Any]], names: dict[str, str]) -> dict[str, int]:
    """Why streams ended (refusals aside), by replica (`names`: address -> name), most common
    first: the kill itself, the dead replica refusing connections, and anything else, which is
    worth a look."""
    total: dict[str, int] = {}
    for state in states:
        for why, count in state["ends"].items():
            address, _, rest = why.partition(" ")
            key = f"{names.get(address, address)}: {rest.replace(address, names.get(address, address))}"
            total[key] = total.get(key, 0) + count
    return dict(sorted(total.items(), key=lambda kv: -kv[1])[:6])


def streams(workers: Workers) -> dict[str, dict[str, Any]]:
    workers.send("streams")
    merged: dict[str, dict[str, Any]] = {}
    for _, part in workers.gather("streams", 120):
        merged.update(part)
    return merged


def run_one(fleet: Fleet, tmp: Path, options: Options, mode: str, pacing: float) -> dict[str, Any]:
    label = f"{mode}, pacing {f'{pacing:g}/s' if pacing else 'off'}"
    load_before = os.getloadavg()
    node_ids = [p.node_id for p in fleet.proxies]
    total = len(node_ids)
    a, b = start_replicas(fleet.root, tmp, pacing)
    workers: Workers | None = None
    out: dict[str, Any] = {"mode": mode, "pacing": pacing}
    try:
        workers = Workers(node_ids, options.workers, mode == "delta")
        # -- everyone connected, on both replicas, in sync
        connect_cpu = sum(proc_cpu_seconds(s.pid or 0) for s in (a, b))
        released = time.monotonic()
        workers.send("connect", (a.xds_address, b.xds_address), ("complete",))
        workers.gather("connected", options.timeout_s)
        result = workers.collect(options.timeout_s)
        missing = sum(1 for t in result["hits"].values() if t is None)
        if missing:
            raise RuntimeError(f"{label}: {missing} proxies never got their config from the two replicas")
        connect_s = max(result["hits"].values()) - released
        for server in (a, b):
            wait_idle(server.pid or 0, options.timeout_s)
        connect_cpu = sum(proc_cpu_seconds(s.pid or 0) for s in (a, b)) - connect_cpu
        before = streams(workers)
        counts = {s.xds_address: sum(1 for st in before.values() if st["address"] == s.xds_address) for s in (a, b)}
        synced = [in_sync(s.admin_json("/debug/syncz")) for s in (a, b)]
        log(f"{label}: {total:,} proxies complete in {connect_s:.1f}s ({counts[a.xds_address]:,} on A, "
            f"{counts[b.xds_address]:,} on B; in sync per syncz {len(synced[0]):,} + {len(synced[1]):,})")  # fmt: skip
        # The replica holding more (about half, as pacing may have nudged some over) dies.
        victim, survivor = (a, b) if counts[a.xds_address] >= counts[b.xds_address] else (b, a)
        moved = {n for n, st in before.items() if st["address"] == victim.xds_address}
        pid = survivor.pid or 0
        rss_before, hwm_before = proc_memory_mb(pid)
        _, pushes_before = metrics(survivor)
        log_offset = len(survivor.log())
        workers.send("arm", ("complete",), [])  # nobody armed: only the counts start again
        workers.gather("armed", 60)

        # -- the kill, and the survivor watched until every proxy is in sync on it
        cpu_before = proc_cpu_seconds(pid)
        killed_wall, killed = time.time(), time.monotonic()
        os.kill(victim.pid or 0, signal.SIGKILL)
        peak = rss_before
        polls = metric_polls = 0
        done: float | None = None
        entries: list[dict[str, Any]] = []
        deadline = killed + options.timeout_s
        while time.monotonic() < deadline:
            peak = max(peak, proc_memory_mb(pid)[0])
            connected, _ = metrics(survivor)
            metric_polls += 1
            if connected >= total:
                entries = survivor.admin_json("/debug/syncz")
                polls += 1
                if len(in_sync(entries)) >= total:
                    done = time.monotonic()
                    break
            time.sleep(SAMPLE_S)
        cpu_window = proc_cpu_seconds(pid) - cpu_before
        quiet = wait_idle(pid, options.timeout_s)
        cpu_until_idle = proc_cpu_seconds(pid) - cpu_before
        rss_after, hwm = proc_memory_mb(pid)
        sampled = max(peak, rss_after)
        # VmHWM is the process's peak for life: if it rose since the kill, the failover set it
        # (the 0.1 s samples miss a short spike); if not, the samples are all there is.
        peak = hwm if hwm > hwm_before else sampled
        _, pushes_after = metrics(survivor)
        per_poll_ms = page_cost(survivor, "/debug/syncz", 3)
        per_metrics_ms = page_cost(survivor, "/metrics", 50)

        # -- what each side saw
        after = streams(workers)
        moved_states = [after[n] for n in moved]
        stayed_states = [st for n, st in after.items() if n not in moved]
        on_survivor = sum(1 for st in after.values() if st["alive"] and st["address"] == survivor.xds_address)
        incomplete = sum(1 for st in after.values() if not st["complete"])
        last_client = max(
            (max(st["opened_at"], st["last_response_at"] or 0.0) for st in moved_states if st["attempts"]),
            default=None,
        )
        accepted = [e["connected_at"] for e in entries if e["proxy"] in moved]
        problems = log_lines(survivor, log_offset)
        if done is None:
            out["in_sync"] = len(in_sync(survivor.admin_json("/debug/syncz")))
        out.update(
            {
                "proxies": total,
                "services": fleet.spec.services,
                "endpoints": fleet.spec.endpoints,
                "moved": len(moved),
                "failover_s": _r(done - killed if done is not None else None),
                "last_accepted_s": _r(max(accepted) - killed_wall if accepted else None),
                "client_last_s": _r(last_client - killed if last_client is not None else None),
                "converged": done is not None,
                "on_survivor": on_survivor,
                "incomplete": incomplete,
                "refused": sum(st["refused"] for st in after.values()),
                # Every moved proxy lost one stream to the kill; its other ends there were attempts
                # on a dead replica. Ends on the survivor other than refusals are failures to look at.
                "dead_attempts": _ended_on(after.values(), victim.xds_address) - len(moved),
                "survivor_failures": _ended_on(after.values(), survivor.xds_address),
                "stream_ends": _ends(after.values(), {victim.xds_address: "killed", survivor.xds_address: "survivor"}),
                "attempts": sum(st["attempts"] for st in after.values()),
                "moved_received": _sum_received(moved_states),
                "others_received": _sum_received(stayed_states),
                "survivor_pushes": {
                    t: int(pushes_after.get(t, 0) - pushes_before.get(t, 0))
                    for t in TYPES
                    if pushes_after.get(t, 0) - pushes_before.get(t, 0)
                },
                "survivor_cpu_s": _r(cpu_window, 2),
                "survivor_cpu_until_idle_s": _r(cpu_until_idle, 2),
                "survivor_busy_s": _r(quiet - killed, 1),
                "survivor_rss_before_mb": _r(rss_before, 1),
                "survivor_peak_rss_mb": _r(peak, 1),
                "survivor_peak_sampled_mb": _r(sampled, 1),
                "survivor_hwm_mb": _r(hwm, 1),
                "survivor_hwm_before_mb": _r(hwm_before, 1),
                "survivor_rss_after_mb": _r(rss_after, 1),
                "syncz_polls": polls,
                "syncz_cpu_ms_each": _r(per_poll_ms, 1),
                "metrics_polls": metric_polls,
                "metrics_cpu_ms_each": _r(per_metrics_ms, 2),
                "connect_s": _r(connect_s, 2),
                "connect_refused": sum(st["refused"] for st in before.values()),
                # both replicas' CPU for the cold connect of every proxy, to compare with the failover's
                "connect_cpu_s": _r(connect_cpu, 2),
                "server_errors": sum(1 for level, _ in problems if level == "ERROR"),
                "server_warnings": sum(1 for level, _ in problems if level == "WARNING"),
                "server_problems": sorted({f"{level} {text}"[:300] for level, text in problems})[:3],
            }
        )
        log(f"{label}: {len(moved):,} moved, in sync on the survivor after {out['failover_s']}s")
    finally:
        if workers is not None:
            workers.close()
        for server, name in ((a, "a"), (b, "b")):
            with contextlib.suppress(Exception):
                server.stop(timeout=60)
            if options.keep_logs is not None:
                options.keep_logs.mkdir(parents=True, exist_ok=True)
                (options.keep_logs / f"{mode}-{pacing:g}-{name}.log").write_text(server.log())
    out["load_average"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    return out


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# -- output ------------------------------------------------------------------------------------


def table(runs: Sequence[dict[str, Any]], described: str) -> str:
    def n(value: Any, fmt: str = "") -> str:
        return "" if value is None else format(value, fmt)

    def sent(received: dict[str, list[int]]) -> str:
        count = sum(c for c, _ in received.values())
        size = sum(s for _, s in received.values())
        return f"{count:,} / {size / 1e6:.1f} MB" if count else "0"

    lines = [
        f"fleet: {described}",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "",
        "| mode | pacing | moved | failover (s) | last accepted (s) | client last (s) | refused | dead attempts "
        "| other failures "
        "| sent to moved | sent to others | survivor CPU (s) | until quiet (s, CPU s) | RSS before / peak / after (MB) "
        "| load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        pacing = f"{r['pacing']:g}/s" if r["pacing"] else "off"
        lines.append(
            f"| {r['mode']} | {pacing} | {r['moved']:,} | {n(r['failover_s'], '.2f')} "
            f"| {n(r['last_accepted_s'], '.2f')} | {n(r['client_last_s'], '.2f')} "
            f"| {r['refused']:,} | {r['dead_attempts']:,} | {r['survivor_failures']:,} "
            f"| {sent(r['moved_received'])} | {sent(r['others_received'])} | {r['survivor_cpu_s']:.2f} "
            f"| {r['survivor_busy_s']:.1f}, {r['survivor_cpu_until_idle_s']:.2f} "
            f"| {r['survivor_rss_before_mb']:.0f} / {r['survivor_peak_rss_mb']:.0f} / {r['survivor_rss_after_mb']:.0f} "
            f"| {r['load_average'][0]:.1f} / {r['load_average'][1]:.1f} |"
        )
    for r in runs:
        notes = []
        if not r["converged"]:
            notes.append(f"NOT CONVERGED: {r.get('in_sync', 0):,} of {r['proxies']:,} in sync on the survivor")
        if r["incomplete"] or r["on_survivor"] != r["proxies"]:
            notes.append(f"{r['on_survivor']:,} streams alive on the survivor, {r['incomplete']:,} proxies incomplete")
        if r["moved_received"]:
            per = ", ".join(f"{t} {c:,} ({s / 1e6:.1f} MB)" for t, (c, s) in r["moved_received"].items())
            notes.append(f"sent to the moved proxies: {per}")
        if r["survivor_pushes"]:
            notes.append(f"survivor pushes: {r['survivor_pushes']}")
        if r["server_errors"] or r["server_warnings"]:
            notes.append(f"survivor log: {r['server_errors']} errors, {r['server_warnings']} warnings, e.g. "
                         f"{r['server_problems'][:2]}")  # fmt: skip
        notes.append(f"streams ended (refusals aside): {r['stream_ends']}")
        notes.append(f"{r['syncz_polls']} syncz polls at ~{r['syncz_cpu_ms_each']} ms of server CPU each, "
                     f"{r['metrics_polls']} /metrics at ~{r['metrics_cpu_ms_each']} ms; "
                     f"cold connect {r['connect_s']}s, {r['connect_cpu_s']} CPU s over both replicas, "
                     f"{r['connect_refused']:,} refused")  # fmt: skip
        lines.append(f"{r['mode']}, pacing {r['pacing']:g}: " + "; ".join(notes))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=10, help="WorkloadEntries (VMs) per service")
    parser.add_argument("--proxies", type=int, default=2000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="load-client processes")
    parser.add_argument("--modes", default="sotw", help="comma-separated, of sotw and delta")
    parser.add_argument("--delta", action="store_true", help="the same as --modes delta")
    parser.add_argument(
        "--max-new-streams-per-second", type=float, default=0.0, help="passed to both replicas (0: no limit)"
    )
    parser.add_argument("--pacing", help="comma-separated limits, one configuration each (e.g. 0,200)")
    parser.add_argument("--timeout", type=float, default=240.0, help="longest wait for any phase, seconds")
    parser.add_argument("--keep-logs", type=Path, help="write both replicas' logs of each configuration here")
    args = parser.parse_args(argv)
    modes = ("delta",) if args.delta else tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - {"sotw", "delta"}:
        parser.error(f"--modes: sotw and/or delta, not {args.modes!r}")
    pacing = tuple(float(p) for p in args.pacing.split(",")) if args.pacing else (args.max_new_streams_per_second,)
    services = args.services
    spec = FleetSpec(
        services=services,
        endpoints=args.endpoints,
        proxies=args.proxies,
        namespaces=max(1, min(args.namespaces, services // 2)),
        shared=max(1, min(5, services // 4)),
    )
    return Options(spec, modes, pacing, args.workers, args.timeout, args.keep_logs)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="meshctl-failover-") as tmp:
        fleet = Fleet(options.spec, Path(tmp) / "mesh")
        resources = fleet.write()
        log(f"mesh: {fleet.describe()}, {resources:,} resources")
        for mode in options.modes:
            for pacing in options.pacing:
                runs.append(run_one(fleet, Path(tmp), options, mode, pacing))
        described = fleet.describe()
    print(table(runs, described))
    print(json.dumps({**runs[0], "resources": resources, "runs": runs}))
    return 0 if all(r["converged"] and not r["incomplete"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
