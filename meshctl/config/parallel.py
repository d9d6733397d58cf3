"""Loading a big tree in forked worker processes: how many, and how results come back.

`tree.load_paths` hands its files here; a tree too small to pay for workers, or a process that runs
threads, loads in this process. Results come back in path order, so findings and "first
definition wins" are exactly those of one process.
"""

from __future__ import annotations

import os
import threading
from functools import partial
from pathlib import Path
from sys import intern
from typing import Final

from meshctl.config.findings import Finding, Severity, has_errors
from meshctl.config.loader import FileResult, LoadOptions, load_file
from meshctl.config.model import KINDS, Config, ConfigKey, Source
from meshctl.config.resource import PACKED_KINDS, spec_class_of
from meshctl.config.validation import import_rules

#: More workers than this rarely pay: a CPU quota (a container's) can be far below the CPUs the
#: process sees, and each worker costs a fork and its copy of the parent's pages.
_MAX_AUTO_WORKERS: Final = 8


def spare_cpus() -> int:
    """CPUs this process may run on (its affinity) that other work is not using, judged by the
    1-minute load average as `make -l` does: a default for `LoadOptions.workers`.

    A worker only pays on an idle CPU. On a CPU that is busy anyway it competes with its
    siblings and with the other work: on a shared 2-core machine, two workers then took up to a
    third more CPU time than one process, and more wall time.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # the load average is unknown
        load = 0.0
    return max(1, min(cpus, _MAX_AUTO_WORKERS, round(cpus - load)))


#: Below this many files per worker, starting workers costs more than it saves.
_MIN_FILES_PER_WORKER: Final = 32
#: The same, when the count is ours to choose (`validate -j 0`). Measured with `validate -j 1`
#: and `-j 2 --no-analyze` on bench/meshgen.py trees, 2 cores, load average 2 to 3.5: a second
#: worker lost at 64 and 256 files (0.40 s against 0.45 to 1.1 s; 0.55 against 0.65), broke
#: even at 128, and won from 1,000 (1.3 s against 0.9) and at 5,000 (4.7 against 3.2): forking
#: and sending results back costs a few tenths of a second that only a tree of about a thousand
#: files earns back.
_AUTO_FILES_PER_WORKER: Final = 500


def auto_workers(files: int, spare: int) -> int:
    """The workers `LoadOptions(workers=0)` loads `files` files with, `spare` CPUs being idle."""
    return max(1, min(spare, files // _AUTO_FILES_PER_WORKER))


#: Work is handed out in this many pieces per worker, so a worker that finishes early (its files
#: were small, or its CPU less busy) takes more, and results come back while others still load.
_CHUNKS_PER_WORKER: Final = 4

#: A FileResult as it crosses from a worker, in builtin types only, which pickle in C: a spec as
#: its wire bytes, keys and sources as tuples. (A Config also wraps its labels in a read-only
#: mapping that cannot be pickled at all.)
_PackedConfig = tuple[
    tuple[str, str, str], str, bytes, dict[str, str], dict[str, str], tuple[str, int, int, int], float | None
]
_PackedFinding = tuple[str, str, str | None, int, int, tuple[str, str, str] | None, str, str]
_PackedFile = tuple[str, tuple[_PackedConfig, ...], tuple[_PackedFinding, ...]]


def other_threads() -> bool:
    """True when this process runs threads besides the main one, counting those Python does not
    know about (gRPC's C core starts its own)."""
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:  # no /proc: only Python's threads can be counted
        return threading.active_count() > 1


def load_files(paths: list[Path], options: LoadOptions) -> list[FileResult]:
    """`load_file` for each path, in order, in worker processes when there are enough files.

    Workers are forked, so they start at once with everything already imported. Forking a
    process that runs threads (the server's watcher, gRPC's own threads, which Python does not
    count) is unsafe, so then, and where fork does not exist, files load here. Results come back
    in path order whatever finishes first, so findings and "first definition wins" are exactly
    as with one process.
    """
    if options.workers == 0:
        workers = auto_workers(len(paths), spare_cpus())
    else:
        workers = min(options.workers, len(paths) // _MIN_FILES_PER_WORKER)
    if workers < 2 or other_threads():
        return [load_file(p, options) for p in paths]
    import multiprocessing  # only when workers run: it would add 15 ms to every start-up

    if "fork" not in multiprocessing.get_all_start_methods():
        return [load_file(p, options) for p in paths]
    # What every worker would import on first use is imported once, here, and shared by the fork.
    for kind in KINDS:
        spec_class_of(kind)
    if options.validate:
        import_rules()
    size = -(-len(paths) // (workers * _CHUNKS_PER_WORKER))
    chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
    out: list[FileResult] = []
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for packed in pool.imap(partial(_load_packed, options=options), chunks):
            out.extend(_unpack(p) for p in packed)
    return out


def _load_packed(paths: list[Path], options: LoadOptions) -> list[_PackedFile]:
    """What a worker does: load its files and pack the results for the trip back."""
    out: list[_PackedFile] = []
    for path in paths:
        result = load_file(path, options)
        configs = tuple(
            (
                (c.key.kind, c.key.namespace, c.key.name),
                c.api_version,
                c.spec_wire(),
                dict(c.labels),
                dict(c.annotations),
                (c.source.file, c.source.line, c.source.column, c.source.document),
                c.created,
            )
            for c in result.analysed
        )
        findings = tuple(
            (
                f.severity.value,
                f.message,
                f.file,
                f.line,
                f.column,
                None if f.resource is None else (f.resource.kind, f.resource.namespace, f.resource.name),
                f.field,
                f.code,
            )
            for f in result.findings
        )
        out.append((result.path, configs, findings))
    return out


def _unpack(packed: _PackedFile) -> FileResult:
    path, packed_configs, packed_findings = packed
    configs = tuple(
        Config(
            ConfigKey(intern(kind), intern(namespace), name),
            intern(api),
            spec if kind in PACKED_KINDS else spec_class_of(kind).FromString(spec),
            labels=labels,
            annotations=annotations,
            source=Source(*src),
            created=created,
        )
        for (kind, namespace, name), api, spec, labels, annotations, src, created in packed_configs
    )
    findings = tuple(
        Finding(Severity(severity), message, file, line, column, None if key is None else ConfigKey(*key), at, code)
        for severity, message, file, line, column, key, at, code in packed_findings
    )
    if has_errors(findings):
        return FileResult(path, (), findings, rejected=configs)
    return FileResult(path, configs, findings)
