"""The whole of `meshctl validate`: load every input, merge, analyse, and place every finding.

Kept apart from the CLI so the server can show the same findings for its config directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from meshctl.config import positions, yamlsource
from meshctl.config.analysis import AnalysisIssue, analyze
from meshctl.config.files import decode_text, read_config_file
from meshctl.config.findings import Finding, Severity, format_path, sort_findings
from meshctl.config.loader import FileResult, LoadOptions, load_bytes, load_text, merge_files
from meshctl.config.mesh import DEFAULT_ROOT_NAMESPACE
from meshctl.config.model import Config, ConfigKey, Source
from meshctl.config.tree import load_paths
from meshctl.errors import ConfigError

#: Analysis of the proxies' view of the resources (see `check`).
ProxyAnalysis = Callable[[Sequence[Config]], Iterable[AnalysisIssue]]


class Positions:
    """Field positions for findings about already-loaded configs: re-reads a file (or the text
    given for stdin) only when a finding needs it.

    The file last asked about stays composed, so a run of findings in one file parses it once;
    only that one is kept, since the nodes of a whole mesh would take more memory than the mesh.
    """

    def __init__(self, texts: Mapping[str, str] | None = None) -> None:
        self._texts = dict(texts or {})
        self._composed: tuple[str, positions.Positions] | None = None

    def _text(self, file: str) -> str | None:
        """The file's text, read by the same rules as when it was loaded (`read_config_file`):
        it may have been swapped for a FIFO or a huge file since."""
        if file not in self._texts:
            try:
                self._texts[file] = decode_text(read_config_file(file, yamlsource.DEFAULT_MAX_FILE_BYTES).data)
            except (OSError, ConfigError):
                return None
        return self._texts[file]

    def locate(self, source: Source, path: Sequence[str | int]) -> tuple[int, int]:
        text = self._text(source.file)
        if text is None or not path:
            return source.line, source.column
        if self._composed is None or self._composed[0] != source.file:
            self._composed = (source.file, positions.Positions(text))
        line, column = self._composed[1].locate(source.document, path)
        return (line, column) if line else (source.line, source.column)


def check(
    paths: Sequence[str],
    options: LoadOptions | None = None,
    *,
    stdin_text: str | None = None,
    known_hosts: Collection[str] = (),
    analysis: bool = True,
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    contents: Mapping[str, bytes] | None = None,
    proxy_analysis: ProxyAnalysis | None = None,
) -> list[Finding]:
    """Every finding for `paths` (`-` reads `stdin_text`), sorted, across all files at once.
    `contents` are files the caller has read (name -> bytes): `kv push` writes exactly those.
    `proxy_analysis` adds issues about what proxies are sent, which takes the layers above this
    one to know (`meshctl.check.names`); it runs with the analysis, on the same resources."""
    options = options or LoadOptions()
    file_paths = [Path(p) for p in paths if p != "-"]
    result = load_paths(file_paths, options)
    files: list[FileResult] = list(result.files.values())
    texts: dict[str, str] = {}
    for name, data in (contents or {}).items():
        files.append(load_bytes(data, name, options))
        texts[name] = data.decode("utf-8-sig", "replace")
    if "-" in paths:
        texts["<stdin>"] = stdin_text or ""
        files.append(load_text(stdin_text or "", "<stdin>", options))
    findings = list(result.findings)
    if "-" in paths and not (files[-1].analysed or files[-1].findings):
        # As for an empty directory: a pipe that brought nothing is a broken pipeline, not a pass.
        findings.append(Finding(Severity.ERROR, "no YAML documents on stdin: nothing to check", "<stdin>"))
    loaded = [os.path.abspath(f) for f in result.files]
    for path in file_paths:
        # A directory with nothing to check is a mistake (a wrong path, a missing checkout), not
        # a pass: CI would stay green while checking nothing.
        if path.is_dir() and not any(_is_under(f, os.path.abspath(path)) for f in loaded):
            message = f"no YAML files (*.yaml, *.yml) in {path}: nothing to check"
            findings.append(Finding(Severity.ERROR, message, str(path)))
    for f in files:
        findings.extend(f.findings)
    findings.extend(merge_files(files)[1])
    if analysis:
        # Rejected files are analysed too (`FileResult.analysed`): the server would keep their
        # last good contents, and without them their hosts would look missing elsewhere.
        analysed: dict[ConfigKey, Config] = {}
        for f in files:
            for config in f.analysed:
                analysed.setdefault(config.key, config)
        findings.extend(
            analysis_findings(analysed.values(), known_hosts, Positions(texts), root_namespace, proxy_analysis)
        )
    return sort_findings(findings)


def _is_under(file: str, directory: str) -> bool:
    """Both absolute: `validate .` names files `bookinfo/x.yaml`, not `./bookinfo/x.yaml`."""
    return file.startswith(directory.rstrip("/") + "/")


def analysis_findings(
    configs: Iterable[Config],
    known_hosts: Collection[str],
    positions: Positions,
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    proxy_analysis: ProxyAnalysis | None = None,
) -> list[Finding]:
    """Cross-resource findings, placed at the field they are about."""
    loaded = list(configs)
    by_key = {c.key: c for c in loaded}
    issues = analyze(loaded, known_hosts, root_namespace)
    if proxy_analysis is not None:
        issues = [*issues, *proxy_analysis(loaded)]
    sources = [by_key[issue.key].source for issue in issues]
    # Placed file by file, so each file is parsed once; listed in the order analysis found them.
    places: dict[int, tuple[int, int]] = {}
    for i in sorted(range(len(issues)), key=lambda i: sources[i].file):
        places[i] = positions.locate(sources[i], issues[i].path)
    return [
        Finding(
            issue.severity,
            issue.message,
            source.file,
            *places[i],
            issue.key,
            format_path(issue.path),
            issue.code,
        )
        for i, (issue, source) in enumerate(zip(issues, sources, strict=True))
    ]
