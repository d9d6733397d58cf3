"""Regenerate `meshctl/api/` (Python modules and type stubs) from the Istio schemas in `protos/`.

    .venv/bin/python tools/gen_protos.py          # rewrite meshctl/api/
    .venv/bin/python tools/gen_protos.py --check  # exit 1, listing stale files, if it is out of date

The generated code is committed so that installing meshctl needs no protoc. It must therefore be
byte-for-byte what a fresh run produces, which is why grpcio-tools is pinned in pyproject.toml and
why the test suite runs `--check`.

The `.proto` files keep Istio's own import paths (`networking/v1alpha3/virtual_service.proto`,
`type/v1beta1/selector.proto`) and are compiled with `protos/` as the include root, so the
descriptors carry Istio's file names. protoc then emits cross-file imports such as
`from networking.v1alpha3 import virtual_service_pb2`; this script rewrites those import lines (in
both the `_pb2.py` modules and the `.pyi` stubs) to `from meshctl.api.networking.v1alpha3 import
...`, and the module name each `_pb2.py` registers its classes under, so the generated code lives
inside the meshctl package. Well-known types
(`google/protobuf/*.proto`) come from grpcio-tools' bundled includes and are imported from the
protobuf runtime unchanged.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUTPUT = ROOT / "meshctl" / "api"
PACKAGE = "meshctl.api"

#: Top-level proto directories; imports from them are moved under PACKAGE.
_OWN_ROOTS = ("extensions", "networking", "security", "telemetry", "type")
_IMPORT_RE = re.compile(rf"^(from|import) ({'|'.join(_OWN_ROOTS)})(\.[\w.]+)", re.MULTILINE)
#: The module name protoc gives the builder, which becomes the classes' `__module__` (pickling, repr).
_MODULE_NAME_RE = re.compile(rf"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')((?:{'|'.join(_OWN_ROOTS)})\.)")

_INIT_DOC = '"""Generated from protos/ by tools/gen_protos.py; do not edit."""\n'


def _proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _rewrite_imports(text: str) -> str:
    """Point protoc's cross-file imports, and each module's own name, inside the meshctl package."""
    text = _IMPORT_RE.sub(lambda m: f"{m.group(1)} {PACKAGE}.{m.group(2)}{m.group(3)}", text)
    return _MODULE_NAME_RE.sub(lambda m: f"{m.group(1)}{PACKAGE}.{m.group(2)}", text)


def generate(out: Path) -> None:
    """Compile every proto under protos/ into `out`, a fresh directory laid out like meshctl/api."""
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    include = Path(protoc.__file__).resolve().parent / "_proto"
    files = [str(p.relative_to(PROTO_ROOT)) for p in _proto_files()]
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in sorted(out.rglob("*")):
        if path.suffix in (".py", ".pyi") and path.is_file():
            path.write_text(_rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
    for directory in [out, *sorted(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").write_text(_INIT_DOC, encoding="utf-8")


def _relative_files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def stale_files(fresh: Path, committed: Path) -> list[str]:
    """Files that differ between a fresh generation and the committed tree, or exist in only one."""
    new, old = _relative_files(fresh), _relative_files(committed) if committed.exists() else set()
    out = [f"missing: {p}" for p in sorted(new - old)]
    out += [f"extra: {p}" for p in sorted(old - new)]
    out += [f"changed: {p}" for p in sorted(new & old) if not filecmp.cmp(fresh / p, committed / p, shallow=False)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report whether meshctl/api/ is up to date")
    parser.add_argument("--diff", action="store_true", help="with --check, print a diff of changed files")
    options = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="meshctl-api-") as tmp:
        fresh = Path(tmp) / "api"
        fresh.mkdir()
        generate(fresh)
        if options.check:
            stale = stale_files(fresh, OUTPUT)
            if not stale:
                return 0
            print(f"{OUTPUT.relative_to(ROOT)} is stale; run: python tools/gen_protos.py", file=sys.stderr)
            for line in stale:
                print(f"  {line}", file=sys.stderr)
                if options.diff and line.startswith("changed: "):
                    rel = Path(line.removeprefix("changed: "))
                    sys.stderr.writelines(
                        difflib.unified_diff(
                            (OUTPUT / rel).read_text(encoding="utf-8").splitlines(keepends=True),
                            (fresh / rel).read_text(encoding="utf-8").splitlines(keepends=True),
                            f"committed/{rel}",
                            f"fresh/{rel}",
                        )
                    )
            return 1
        if OUTPUT.exists():
            shutil.rmtree(OUTPUT)
        shutil.copytree(fresh, OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
