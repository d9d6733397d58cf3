"""What workload mutual TLS costs the server: the fleet's cold start without and with certificates,
and what rotating them costs.

    python bench/mtls_cost.py                  # 1,000 services x 10 endpoints, 1,000 proxies: off, then on
    python bench/mtls_cost.py --runs 3         # off and on alternated, three times each
    python bench/mtls_cost.py --quick          # 100 services, 100 proxies, 30 s certificates
    python bench/mtls_cost.py --variants off,nokeys,on --no-rotation
    python bench/mtls_cost.py --profile /tmp/p/mtls    # py-spy each phase: /tmp/p/mtls-on-cold.txt, ...

The mesh, the simulated proxies and the server are the fleet benchmark's (`bench/fleet.py`,
`bench/loadclient.py`, `python -m meshctl serve` in its own process), in one of three variants:

- off: no CA at all, so no proxy gets a certificate and config has no mutual TLS. (`meshctl
  serve` always has a CA when run as root, so this variant runs the CLI with a default state
  directory that cannot be made, the one way it turns mutual TLS off.)
- nokeys: a CA (`--state-dir`), but the proxies' connections prove no identity, so they get no
  keys and config without mutual TLS; the server says so once per proxy. This is what the fleet
  benchmark runs.
- on: a CA and `--insecure-send-keys`: every proxy gets its `default` (certificate chain and
  key) and `ROOTCA` secrets over SDS, auto-mTLS on every mesh cluster, mTLS filter chains inbound.

What is measured, for each variant:

- cold start: server started -> every proxy complete: clusters, listeners, and every
  assignment, route config and SDS secret they name (as `bench/run.py`, whose check now waits
  for secrets too). Server CPU and busy time from the proxies' release until its CPU goes quiet,
  RSS before the proxies and with them, peak RSS, CPU while idle.
- bytes per proxy: what the proxies received during the cold start, by type (DiscoveryResponse
  sizes), and how many responses.
- certificates: how many the server issued (its log says each), and over how long.

And with certificates (`on`), with `--lifetime` (default 60 s; renewal is due at two thirds,
counted from the issuing second):

- rotation as issued: the certificates of the cold start come due as they were issued, and
  the server renews them in rounds (it looks every second at most). Per proxy: its certificate
  due (from the server's log) -> the proxy holds a new `default`.
- rotation, all due at once: the server is stopped (SIGSTOP) until every certificate is due, then
  continued: one round renews all of them. Per proxy: continued -> holds a new `default`.
- a proxy left: one proxy's stream is closed; the others are renewed as issued, and the server's
  CPU is measured while the departed proxy's certificate is due but not yet expired, and after.

The CA's own rate (`CertificateAuthority.issue_workload` and the secret serialized, in this
process) is measured too. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]
sys.path.insert(0, str(BENCH.parent))

from bench.fleet import Fleet, FleetSpec  # noqa: E402
from bench.run import Stats, Workers, log, proc_cpu_seconds, proc_memory_mb, wait_idle  # noqa: E402
from meshctl.testing.serve_process import ServeProcess  # noqa: E402

VARIANTS = ("off", "nokeys", "on")
TYPES = ("CDS", "EDS", "LDS", "RDS", "SDS")
#: `python -c` for the `off` variant: the CLI as it is, with a default state directory no one
#: can make (under a file), so the server runs without a CA and says so.
WITHOUT_CA = (
    "import pathlib, meshctl.server.settings as settings; "
    "settings.DEFAULT_STATE_DIR = pathlib.Path('/dev/null/meshctl-bench'); "
    "from meshctl.cli.app import main; main()"
)
#: meshctl's log line for each certificate it issues (`meshctl.server.secrets`).
ISSUED = re.compile(
    r"^(?P<at>\S+) INFO meshctl\.server\.secrets: issued \S+ to proxy (?P<node>\S+) until (?P<end>\S+)$"
)
#: Consecutive issuing lines further apart than this belong to different renewal rounds.
ROUND_GAP_S = 0.15


# -- the server --------------------------------------------------------------------------------


class Serve(ServeProcess):
    """`meshctl serve` in one of the variants (see the module docstring)."""

    def __init__(self, root: Path, variant: str, lifetime_s: int, debounce: float) -> None:
        extra = ["--workload-cert-lifetime", f"{lifetime_s}s"]
        if variant == "on":
            extra.append("--insecure-send-keys")
        super().__init__([root], debounce=debounce, extra_args=extra)
        self.variant = variant

    def command(self) -> list[str]:
        command = super().command()
        if self.variant != "off":
            return command
        at = command.index("--state-dir")
        del command[at : at + 2]
        return [sys.executable, "-c", WITHOUT_CA, *command[3:]]  # after `python -m meshctl`

    def issued(self) -> list[tuple[float, str, float]]:
        """(issued at, node id, not after) of every certificate its log says it issued, as
        wall-clock seconds."""
        out = []
        for line in self.log().splitlines():
            match = ISSUED.match(line)
            if match:
                out.append((_wall(match["at"]), match["node"], _wall(match["end"])))
        return out

    def errors(self) -> int:
        text = self.log()
        return text.count(" ERROR ") + text.count("Traceback")


def _wall(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


class Profiler:
    """py-spy on the server for one phase (collapsed stacks), when asked for."""

    def __init__(self, prefix: Path | None, pid: int) -> None:
        self.prefix, self.pid = prefix, pid
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, phase: str) -> None:
        if self.prefix is None:
            return
        self.stop()
        # py-spy is not a dependency: install it into the venv to profile (`pip install py-spy`).
        path = f"{self.prefix}-{phase}.txt"
        command = [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(self.pid), "-r", "200"]
        # Without pausing the process (no ptrace stops: it may be SIGSTOPped meanwhile), and only
        # the thread holding the GIL: the generation thread waiting for it is not working.
        command += ["--nonblocking", "--gil"]
        self.proc = subprocess.Popen(
            [*command, "-f", "raw", "-o", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # attached before the phase begins

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)
            self.proc = None


# -- numbers -----------------------------------------------------------------------------------


@dataclass
class Wave:
    """One rotation: when each proxy held its new `default`, and what the server spent."""

    name: str
    stats: Stats
    #: from the first proxy renewed to the last
    span_s: float
    issued: int
    #: renewal rounds: publications that issued certificates
    rounds: int
    #: from the first certificate of the wave issued to the last
    issuing_s: float
    busy_s: float
    cpu_s: float
    received: dict[str, list[int]]


@dataclass
class Departed:
    """A proxy that left while its certificate was current: the server's CPU while it is due."""

    #: seconds measured between its certificate due and its end, and the CPU per second then
    due_window_s: float
    due_cpu_per_s: float
    #: the same after its end (the server forgets a certificate at its end)
    after_window_s: float
    after_cpu_per_s: float


@dataclass
class VariantRun:
    variant: str
    proxies: int
    startup_s: float = 0.0
    connect: Stats | None = None
    cold_cpu_s: float = 0.0
    busy_s: float = 0.0
    rss_before_mb: float = 0.0
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    idle_cpu_percent: float = 0.0
    #: CPU of the load-client processes over the cold start: they share the machine's cores
    clients_cpu_s: float = 0.0
    received: dict[str, list[int]] = field(default_factory=dict)
    issued: int = 0
    issuing_s: float = 0.0
    waves: list[Wave] = field(default_factory=list)
    departed: Departed | None = None
    nacks: int = 0
    errors: int = 0
    failures: int = 0

    @property
    def cold_start_s(self) -> float:
        return self.startup_s + (self.connect.max if self.connect else math.nan)

    def bytes_per_proxy(self, short: str) -> float:
        return self.received.get(short, [0, 0])[1] / self.proxies

    def responses_per_proxy(self, short: str) -> float:
        return self.received.get(short, [0, 0])[0] / self.proxies


def rounds_of(times: Sequence[float]) -> int:
    """How many bursts of issuing `times` (sorted) make: a gap of ROUND_GAP_S starts a new one."""
    return sum(1 for i, t in enumerate(times) if i == 0 or t - times[i - 1] > ROUND_GAP_S)


# -- one variant -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    spec: FleetSpec
    variants: tuple[str, ...] = ("off", "on")
    runs: int = 1
    workers: int = 2
    idle_s: float = 10.0
    debounce: float = 0.1
    lifetime_s: int = 60
    rotation: bool = True
    timeout_s: float = 1800.0
    profile: Path | None = None


def measure(variant: str, fleet: Fleet, options: Options, run_index: int) -> VariantRun:
    node_ids = [p.node_id for p in fleet.proxies]
    run = VariantRun(variant, len(node_ids))
    workers = Workers(node_ids, options.workers, delta=False)
    serve = Serve(fleet.root, variant, options.lifetime_s, options.debounce)
    profile = options.profile and Path(f"{options.profile}-{variant}" + (f"-{run_index}" if run_index else ""))
    profiler: Profiler | None = None
    try:
        started = time.monotonic()
        serve.start(timeout=1800)
        run.startup_s = time.monotonic() - started
        assert serve.pid is not None
        pid = serve.pid
        profiler = Profiler(profile, pid)
        run.rss_before_mb, _ = proc_memory_mb(pid)
        profiler.start("cold")
        clients = clients_cpu(workers)
        cpu = proc_cpu_seconds(pid)
        released = time.monotonic()
        workers.send("connect", serve.xds_address, ("complete",))
        workers.gather("connected", options.timeout_s)
        result = workers.collect(options.timeout_s)
        run.connect = Stats.of([None if t is None else t - released for t in result["hits"].values()])
        run.busy_s = wait_idle(pid, options.timeout_s) - released
        run.cold_cpu_s = proc_cpu_seconds(pid) - cpu
        run.clients_cpu_s = clients_cpu(workers) - clients
        profiler.stop()
        run.rss_mb, _ = proc_memory_mb(pid)
        run.received = result["received"]
        run.nacks, run.failures = result["nacks"], run.connect.missing
        issued = serve.issued()
        run.issued = len(issued)
        run.issuing_s = issued[-1][0] - issued[0][0] if issued else 0.0
        log(
            f"{variant}: cold start {run.cold_start_s:.2f}s (release -> complete p99 {run.connect.p99:.2f}s), "
            f"server CPU {run.cold_cpu_s:.2f}s, {run.issued:,} certificates"
        )

        idle = options.idle_s
        if issued and options.rotation and variant == "on":
            first_due = min(_due(i, options.lifetime_s) for i in issued)
            idle = max(0.0, min(idle, first_due - time.time() - 1.0))
        cpu = proc_cpu_seconds(pid)
        time.sleep(idle)
        run.idle_cpu_percent = 100 * (proc_cpu_seconds(pid) - cpu) / idle if idle else math.nan

        if variant == "on" and options.rotation and issued:
            rotate(run, serve, workers, node_ids, options, profiler=profiler)
        _, run.peak_rss_mb = proc_memory_mb(pid)
        run.errors = serve.errors() + len(workers.collect(0)["errors"])
    finally:
        if profiler is not None:
            profiler.stop()
        if serve.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(serve.pid, signal.SIGCONT)  # in case it was left stopped
        workers.close()
        serve.stop(timeout=120)
    return run


def clients_cpu(workers: Workers) -> float:
    """CPU seconds the load-client processes have used so far."""
    workers.send("collect", 0)
    return float(sum(reply[1]["cpu_s"] for reply in workers.gather("result", 60)))


def _due(issued: tuple[float, str, float], lifetime_s: int) -> float:
    """When a certificate is due for renewal: two thirds into its life from the issuing second
    (meshctl's `IssuedCertificate.renew_at`; `not_after` is that second plus the lifetime)."""
    end = issued[2]
    return end - lifetime_s + lifetime_s * 2 / 3


def rotate(
    run: VariantRun, serve: Serve, workers: Workers, node_ids: Sequence[str], options: Options, *, profiler: Profiler
) -> None:
    pid = serve.pid
    assert pid is not None
    lifetime = options.lifetime_s
    offset = time.time() - time.monotonic()

    def dues(issued: Sequence[tuple[float, str, float]], nodes: Sequence[str]) -> dict[str, float]:
        wanted = set(nodes)
        return {node: _due((at, node, end), lifetime) - offset for at, node, end in issued if node in wanted}

    # 1. As issued in the cold start: each proxy from its own certificate's due time.
    seen = len(serve.issued())
    arm(workers, node_ids)
    run.waves.append(wave("as issued after the cold start", serve, workers, seen, dues(serve.issued(), node_ids)))

    # 2. All due at once: the server stopped until the last certificate is due, then continued.
    latest, seen = serve.issued()[seen:], len(serve.issued())
    last_due = max(_due(i, lifetime) for i in latest)
    if last_due + 0.5 >= min(i[2] for i in latest):
        log(f"on: the last wave took longer than a third of --lifetime {lifetime}s: some certificates expire")
    arm(workers, node_ids)
    os.kill(pid, signal.SIGSTOP)
    try:
        profiler.start("rotation")
        time.sleep(max(0.0, last_due + min(0.5, lifetime / 10) - time.time()))
        cpu = proc_cpu_seconds(pid)
    finally:
        continued = time.monotonic()
        os.kill(pid, signal.SIGCONT)
    run.waves.append(wave("all due at once", serve, workers, seen, started=continued, cpu=cpu))
    profiler.stop()

    # 3. A proxy leaves; the others are renewed as issued in (2), and its certificate stays due
    # until its end: the server cannot renew it, and does not forget it before then.
    latest, seen = serve.issued()[seen:], len(serve.issued())
    leaving = node_ids[0]
    own = [i for i in latest if i[1] == leaving]
    workers.send("drop", [leaving])
    workers.gather("dropped", 60)
    staying = [n for n in node_ids if n != leaving]
    arm(workers, staying)
    # Not waited idle: with a certificate due, the server does not go quiet until its end.
    run.waves.append(wave("as issued, one proxy gone", serve, workers, seen, dues(latest, staying), idle=False))
    if not own:
        return
    end = own[-1][2]
    settle = min(1.0, lifetime / 10)
    time.sleep(settle)  # the wave's last writes
    profiler.start("departed")
    start, cpu = time.time(), proc_cpu_seconds(pid)
    time.sleep(max(0.0, end - 0.5 - start))
    due_window, due_cpu = time.time() - start, proc_cpu_seconds(pid) - cpu
    profiler.stop()
    time.sleep(max(0.0, end + 1.5 - time.time()))  # forgotten at its end, within the server's second
    after = min(5.0, max(settle, options.idle_s))
    cpu = proc_cpu_seconds(pid)
    time.sleep(after)
    run.departed = Departed(
        due_window, due_cpu / due_window if due_window > 0 else math.nan,
        after, (proc_cpu_seconds(pid) - cpu) / after,
    )  # fmt: skip
    log(
        f"on: a proxy gone, its certificate due: server CPU {run.departed.due_cpu_per_s:.3f} s/s over "
        f"{due_window:.1f}s, {run.departed.after_cpu_per_s:.3f} s/s after its end"
    )


def arm(workers: Workers, node_ids: Sequence[str]) -> None:
    """Every proxy of `node_ids` waits for a `default` secret other than the one it holds."""
    workers.send("arm", ("renewed", "default"), list(node_ids))
    workers.gather("armed", 60)


def wave(
    name: str,
    serve: Serve,
    workers: Workers,
    seen: int,
    dues: dict[str, float] | None = None,
    *,
    started: float | None = None,
    cpu: float | None = None,
    idle: bool = True,
    timeout: float = 600.0,
) -> Wave:
    """Wait until every armed proxy holds a new `default`: latency from its own certificate's due
    time (`dues`, monotonic) or from `started`. `seen`: the server's issuing lines before the wave;
    `cpu`: its CPU seconds at the start, when the caller knows them (the server was stopped)."""
    pid = serve.pid
    assert pid is not None
    if dues:
        # CPU from just before the first certificate is due: what the wave costs, not the wait.
        time.sleep(max(0.0, min(dues.values()) - 0.3 - time.monotonic()))
        timeout += max(dues.values()) - time.monotonic()
    if cpu is None:
        cpu = proc_cpu_seconds(pid)
    begun = min(dues.values()) if dues else (started if started is not None else time.monotonic())
    result = workers.collect(timeout)
    hits = result["hits"]
    latency = [None if t is None else t - (dues[n] if dues else begun) for n, t in hits.items()]
    done = sorted(t for t in hits.values() if t is not None)
    until = wait_idle(pid, timeout) if idle else time.monotonic()
    issued = sorted(i[0] for i in serve.issued()[seen:])
    w = Wave(
        name,
        Stats.of(latency),
        span_s=done[-1] - done[0] if done else math.nan,
        issued=len(issued),
        rounds=rounds_of(issued),
        issuing_s=issued[-1] - issued[0] if issued else 0.0,
        busy_s=max(0.0, until - begun) if idle else math.nan,
        cpu_s=proc_cpu_seconds(pid) - cpu,
        received=result["received"],
    )
    log(
        f"on: rotation {name}: {w.issued:,} certificates in {w.rounds} round(s) over {w.issuing_s:.2f}s, "
        f"due -> renewed p99 {w.stats.p99:.2f}s, server CPU {w.cpu_s:.2f}s"
    )
    return w


# -- in process --------------------------------------------------------------------------------


def stage_costs(root: Path, node_ids: Sequence[str], lifetime_s: int) -> dict[str, dict[str, dict[str, float]]]:
    """The server's own work for the fleet, without gRPC, as `bench/change_cost.py` drives it:
    CPU seconds of this process to resolve every proxy (bind, resources, and with `on` its
    secrets, of which issuing certificates) and to run every stream's update, pushes, encoding
    and ACK, for the cold start, for a renewal round with nothing due (what each round costs the
    proxies it does not renew) and for one with every certificate due."""
    from bench.change_cost import Server
    from meshctl.security.ca import CertificateAuthority

    pipeline = Server(root, list(node_ids))
    pipeline.watcher.reload_now()
    snapshot = pipeline.discovery.build_next()
    snapshot.index.endpoints_at("")
    out: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="meshctl-ca-") as tmp:
        for variant in ("off", "on"):
            fleet = _InProcessFleet(
                pipeline.nodes, CertificateAuthority.self_signed(tmp) if variant == "on" else None, lifetime_s
            )
            rounds = {"cold start": fleet.round(snapshot, first=True), "round, nothing due": fleet.round(snapshot)}
            if variant == "on":
                fleet.now += datetime.timedelta(seconds=lifetime_s * 2 / 3 + 1)
                rounds["round, all due"] = fleet.round(snapshot)
            out[variant] = rounds
    return out


class _InProcessFleet:
    """Every proxy's `WorkloadSecrets.resolve` and `Connection`, on a clock of its own."""

    def __init__(self, nodes: Sequence[Any], ca: Any, lifetime_s: int) -> None:
        from meshctl.server.cache import ResourceCache
        from meshctl.server.connection import Connection
        from meshctl.server.encode import BlockCache
        from meshctl.server.secrets import WorkloadSecrets

        self.nodes, self.ca = nodes, ca
        self.now = datetime.datetime.now(datetime.UTC)
        self.issuing = 0.0
        self.secrets = WorkloadSecrets(
            ResourceCache().resolve,
            self if ca is not None else None,  # type: ignore[arg-type]
            trust_domain=lambda: "cluster.local",
            lifetime=datetime.timedelta(seconds=lifetime_s),
            send_keys_unauthenticated=True,
            clock=lambda: self.now,
        )
        self.connections = [Connection(str(i), delta=False) for i in range(len(nodes))]
        self.blocks = BlockCache()

    # The CA as `WorkloadSecrets` sees it, timing what it issues.
    @property
    def root_pem(self) -> bytes:
        return bytes(self.ca.root_pem)

    @property
    def certificate(self) -> Any:
        return self.ca.certificate

    @property
    def chain(self) -> Any:
        return self.ca.chain

    def issue_workload(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self.ca.issue_workload(*args, **kwargs)
        finally:
            self.issuing += time.process_time() - started

    def round(self, snapshot: Any, *, first: bool = False) -> dict[str, float]:
        from bench.change_cost import _ack, _subscribe, sotw_request
        from meshctl.server.encode import encode_sotw
        from meshctl.xds import types

        self.issuing = 0.0
        started = time.process_time()
        views = [self.secrets.resolve(node, snapshot).resources for node in self.nodes]
        resolved = time.process_time()
        pushes = size = 0
        for conn, view in zip(self.connections, views, strict=True):
            conn.update(view)
            if first:
                _subscribe(conn, view)
                if view.of(types.SECRET):
                    conn.handle(types.SECRET, sotw_request(types.SECRET, sorted(view.of(types.SECRET))))
            for push in conn.pushes():
                size += len(encode_sotw(push, blocks=self.blocks))
                pushes += 1
                _ack(conn, push)
        return {
            "resolve_s": resolved - started,
            "issuing_s": self.issuing,
            "streams_s": time.process_time() - resolved,
            "pushes": pushes,
            "mb": size / 1e6,
        }


# -- the CA alone ------------------------------------------------------------------------------


def ca_rate(count: int) -> dict[str, float]:
    """CPU per workload certificate in this process: `issue_workload`, then the `default` secret
    made and serialized as the server sends it."""
    from meshctl.security.ca import CertificateAuthority
    from meshctl.security.identity import WorkloadIdentity
    from meshctl.xds import mesh_tls, types
    from meshctl.xds.resources import to_resource

    with tempfile.TemporaryDirectory(prefix="meshctl-ca-") as tmp:
        ca = CertificateAuthority.self_signed(tmp)
        identities = [WorkloadIdentity("cluster.local", f"ns-{i % 10}", f"svc-{i}") for i in range(count)]
        started = time.process_time()
        issued = [ca.issue_workload(identity) for identity in identities]
        signed = time.process_time()
        for c in issued:
            secret = mesh_tls.tls_certificate_secret(mesh_tls.WORKLOAD_SECRET, c.cert_chain_pem, c.private_key_pem)
            body = to_resource(secret, types.SECRET).body
        done = time.process_time()
    return {
        "certificates": count,
        "issue_us": (signed - started) / count * 1e6,
        "secret_us": (done - signed) / count * 1e6,
        "per_second": count / (done - started),
        "secret_bytes": len(body),
    }


# -- a whole run -------------------------------------------------------------------------------


def run_all(options: Options) -> dict[str, Any]:
    load_before = os.getloadavg()
    runs: list[VariantRun] = []
    with tempfile.TemporaryDirectory(prefix="meshctl-mtls-") as tmp:
        fleet = Fleet(options.spec, Path(tmp) / "mesh")
        resources = fleet.write()
        log(f"mesh: {fleet.describe()}, {resources:,} resources")
        for index in range(options.runs):
            for variant in options.variants:
                log(f"--- {variant}, run {index + 1} of {options.runs} (load {os.getloadavg()[0]:.1f})")
                runs.append(measure(variant, fleet, options, index if options.runs > 1 else 0))
        log("in process: the server's stages without gRPC")
        stages = stage_costs(fleet.root, [p.node_id for p in fleet.proxies], options.lifetime_s)
    ca = ca_rate(max(100, min(2000, options.spec.proxies)))
    load_after = os.getloadavg()
    spec = options.spec
    out: dict[str, Any] = {
        "proxies": spec.proxies,
        "services": spec.services,
        "endpoints": spec.endpoints,
        "lifetime_s": options.lifetime_s,
        "cold_start": {v: _summary([r for r in runs if r.variant == v]) for v in options.variants},
        "runs": [_public(r) for r in runs],
        "ca": {k: round(v, 1) for k, v in ca.items()},
        "in_process": _rounded(stages),
        "failures": sum(r.failures + sum(w.stats.missing for w in r.waves) for r in runs),
        "nacks": sum(r.nacks for r in runs),
        "server_errors": sum(r.errors for r in runs),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after"
        ),
        "describe": fleet.describe(),
    }
    out["_runs"] = runs
    return out


def _summary(runs: Sequence[VariantRun]) -> dict[str, Any]:
    """Medians over the runs of one variant."""

    def med(values: Sequence[float]) -> float | None:
        return _r(statistics.median(values)) if values else None

    proxies = runs[0].proxies if runs else 1
    return {
        "runs": len(runs),
        "cold_start_s": med([r.cold_start_s for r in runs]),
        "connect_p99_s": med([r.connect.p99 for r in runs if r.connect]),
        "server_cpu_s": med([r.cold_cpu_s for r in runs]),
        "clients_cpu_s": med([r.clients_cpu_s for r in runs]),
        "rss_mb": med([r.rss_mb for r in runs]),
        "rss_per_proxy_kb": med([(r.rss_mb - r.rss_before_mb) * 1024 / proxies for r in runs]),
        "bytes_per_proxy": {t: med([r.bytes_per_proxy(t) for r in runs]) for t in TYPES},
        "certificates": med([r.issued for r in runs]),
    }


def _public(run: VariantRun) -> dict[str, Any]:
    out = asdict(run)
    out["cold_start_s"] = run.cold_start_s
    rounded: dict[str, Any] = _rounded(out)
    return rounded


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return _r(value)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def _r(value: float, digits: int = 3) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


# -- output ------------------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    runs: list[VariantRun] = result["_runs"]
    lines = [
        f"fleet: {result['describe']}; SotW; certificates for {result['lifetime_s']}s",
        f"machine: {result['machine']}",
        "",
        "| variant | cold start (s) | release -> complete p50 / p99 (s) | server CPU (s) | server busy (s) "
        "| RSS before / with proxies (MB) | per proxy (KB) | peak RSS (MB) | idle CPU | certificates (issuing s) "
        "| load clients' CPU (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        stats = r.connect or Stats.of([])
        per = (r.rss_mb - r.rss_before_mb) * 1024 / r.proxies
        missing = f" ({stats.missing} missing)" if stats.missing else ""
        idle = "" if math.isnan(r.idle_cpu_percent) else f"{r.idle_cpu_percent:.1f}%"
        lines.append(
            f"| {r.variant} | {r.cold_start_s:.2f} | {stats.p50:.2f} / {stats.p99:.2f}{missing} | {r.cold_cpu_s:.2f} "
            f"| {r.busy_s:.2f} | {r.rss_before_mb:.0f} / {r.rss_mb:.0f} | {per:.0f} | {r.peak_rss_mb:.0f} "
            f"| {idle} | {r.issued:,} ({r.issuing_s:.1f}) | {r.clients_cpu_s:.1f} |"
        )
    lines += [
        "",
        "| variant | " + " | ".join(f"{t} KB (responses)" for t in TYPES) + " | total KB |",
        "|---|" + "---:|" * (len(TYPES) + 1),
    ]
    for r in runs:
        cells = [f"{r.bytes_per_proxy(t) / 1024:.1f} ({r.responses_per_proxy(t):.1f})" for t in TYPES]
        total = sum(r.bytes_per_proxy(t) for t in TYPES) / 1024
        lines.append(f"| {r.variant} | " + " | ".join(cells) + f" | {total:.1f} |")
    waves = [w for r in runs for w in r.waves]
    if waves:
        lines += [
            "",
            "| rotation | proxies | certificates | rounds | issuing (s) | due -> renewed p50 / p99 / max (s) "
            "| first -> last renewed (s) | server busy (s) | server CPU (s) | SDS KB per proxy |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for w in waves:
            s = w.stats
            missing = f" ({s.missing} missing)" if s.missing else ""
            sds = w.received.get("SDS", [0, 0])[1] / max(1, s.count) / 1024
            lines.append(
                f"| {w.name} | {s.count:,}{missing} | {w.issued:,} | {w.rounds} | {w.issuing_s:.2f} "
                f"| {s.p50:.2f} / {s.p99:.2f} / {s.max:.2f} | {w.span_s:.2f} | {w.busy_s:.2f} | {w.cpu_s:.2f} "
                f"| {sds:.2f} |"
            )
    departed = [r.departed for r in runs if r.departed is not None]
    if departed:
        lines += [
            "",
            "| a proxy gone | its certificate due: window (s) | server CPU (s per s) | after its end (s per s) |",
            "|---|---:|---:|---:|",
        ]
        for d in departed:
            window = f"{d.due_window_s:.1f} | {d.due_cpu_per_s:.3f} | {d.after_cpu_per_s:.3f}"
            lines.append(f"| one of {runs[0].proxies:,} | {window} |")
    lines += [
        "",
        "| in process, CPU s (no gRPC) | resolve | of which issuing | streams | pushes | MB encoded |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant, rounds in result["in_process"].items():
        for name, c in rounds.items():
            lines.append(
                f"| {variant}: {name} | {c['resolve_s']:.3f} | {c['issuing_s']:.3f} | {c['streams_s']:.3f} "
                f"| {c['pushes']:,} | {c['mb']:.1f} |"
            )
    ca = result["ca"]
    lines += [
        "",
        f"CA in process: {ca['issue_us']:.0f} us to issue a workload certificate, {ca['secret_us']:.0f} us to make "
        f"and serialize its secret ({ca['secret_bytes']:.0f} bytes): {ca['per_second']:,.0f} per second of CPU",
    ]
    if result["failures"] or result["nacks"] or result["server_errors"]:
        lines.append(
            f"PROBLEMS: {result['failures']} proxies never converged, {result['nacks']} NACKs, "
            f"{result['server_errors']} errors in the server log or on streams"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 services, 100 proxies, 30 s certificates")
    parser.add_argument("--services", type=int)
    parser.add_argument("--endpoints", type=int, default=10, help="WorkloadEntries (VMs) per service")
    parser.add_argument("--proxies", type=int)
    parser.add_argument("--variants", default="off,on", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--runs", type=int, default=1, help="runs of each variant, alternated")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="load-client processes")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle for the steady-state CPU")
    parser.add_argument("--debounce", type=float, default=0.1, help="meshctl serve --debounce (its default)")
    parser.add_argument("--lifetime", type=int, help="workload certificate lifetime, seconds (default 60)")
    parser.add_argument("--no-rotation", action="store_true", help="cold starts only")
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest wait for any phase, seconds")
    parser.add_argument("--profile", type=Path, help="py-spy each phase of the server into PREFIX-VARIANT-PHASE.txt")
    args = parser.parse_args(argv)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        parser.error(f"--variants: unknown {', '.join(sorted(unknown)) or 'none given'}")
    services = args.services or (100 if args.quick else 1000)
    proxies = args.proxies or (100 if args.quick else 1000)
    spec = FleetSpec(
        services=services,
        endpoints=args.endpoints,
        proxies=proxies,
        namespaces=max(1, min(10, services // 2)),
        shared=max(1, min(5, services // 4)),
    )
    return Options(
        spec=spec,
        variants=variants,
        runs=max(1, args.runs),
        workers=args.workers,
        idle_s=args.idle,
        debounce=args.debounce,
        lifetime_s=args.lifetime or (30 if args.quick else 60),
        rotation=not args.no_rotation,
        timeout_s=args.timeout,
        profile=args.profile,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    result = run_all(options)
    print(table(result))
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}))
    return 1 if result["failures"] or result["nacks"] else 0


if __name__ == "__main__":
    sys.exit(main())
