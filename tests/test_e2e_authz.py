"""End to end: AuthorizationPolicy enforced by real Envoys that `meshctl serve` configures.

The loopback mesh of test_e2e_mtls: a server VM (`reviews`, its app behind a Sidecar ingress
listener on the VM's address, PERMISSIVE, so it takes mutual TLS from mesh clients and plaintext
from others) and client VMs without iptables, one at a time (each binds the service port on
127.0.0.1): `client` has no WorkloadEntry and runs as the service account `default`, `sleep`
has one naming the service account `sleep`. Policies are written into the served directory as
a user would, and each check waits until the proxies have them.
"""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from conftest import DEADLINE, needs_envoy

from meshctl.testing.backends import Backend, Reply, send
from meshctl.testing.builders import vm_behind_ingress_yaml
from meshctl.testing.envoy import EnvoyProcess, free_port
from meshctl.testing.jwt import SigningKey
from meshctl.testing.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_envoy]

NS = "e2e"
HOST = f"reviews.{NS}.mesh"
SERVER_IP = "127.0.0.31"
SERVER = f"sidecar~{SERVER_IP}~reviews-v1.{NS}~{NS}.svc.cluster.local"
#: No WorkloadEntry: the service account `default`.
CLIENT = f"sidecar~127.0.0.32~client.{NS}~{NS}.svc.cluster.local"
#: Bound to the WorkloadEntry `sleep`: the service account `sleep`.
SLEEP = f"sidecar~127.0.0.33~sleep.{NS}~{NS}.svc.cluster.local"
DENIED = "RBAC: access denied"


def mesh_yaml(service_port: int, ingress_port: int, app_port: int) -> str:
    server = vm_behind_ingress_yaml(
        namespace=NS,
        host=HOST,
        address=SERVER_IP,
        service_port=service_port,
        ingress_port=ingress_port,
        app_port=app_port,
    )
    return (
        server
        + f"""---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: sleep, namespace: {NS}}}
spec:
  address: 127.0.0.33
  serviceAccount: sleep
  labels: {{app: sleep}}
"""
    )


def authorization_policy(name: str, action: str, rules: str) -> str:
    return f"""apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  action: {action}
  rules: {rules}
"""


class Mesh:
    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.dir = root / "mesh"
        self.dir.mkdir()
        self._stack = stack
        self.service_port, self.ingress_port = free_port(), free_port(SERVER_IP)
        self.app = stack.enter_context(Backend("reviews", "127.0.0.1"))
        self.write("mesh.yaml", mesh_yaml(self.service_port, self.ingress_port, self.app.port))
        self.server = stack.enter_context(ServeProcess([self.dir], extra_args=["--insecure-send-keys"]))
        stack.callback(lambda: print(f"--- meshctl serve log:\n{self.server.log()[-6000:]}"))
        self.reviews = self._envoy(stack, SERVER)

    def _envoy(self, stack: ExitStack, node_id: str) -> EnvoyProcess:
        envoy = stack.enter_context(EnvoyProcess(self.server.bootstrap(node_id)))
        stack.callback(lambda: print(f"--- envoy {node_id} log:\n{envoy.log()[-4000:]}"))
        return envoy

    @contextmanager
    def client(self, node_id: str) -> Iterator[EnvoyProcess]:
        """A client VM's Envoy for the `with` block (one at a time: each binds the service port)."""
        with ExitStack() as stack:
            yield self._envoy(stack, node_id)

    def write(self, name: str, text: str) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def through_mesh(self, path: str = "/") -> Reply:
        return send(self.service_port, HOST, path=path)

    def straight_to_server(self, path: str = "/", *, source: str = "127.0.0.1") -> Reply:
        """Plaintext to the server VM's inbound port from `source`, as a client outside the mesh."""
        if source == "127.0.0.1":
            return send(self.ingress_port, HOST, path=path, address=SERVER_IP)
        conn = http.client.HTTPConnection(SERVER_IP, self.ingress_port, timeout=5, source_address=(source, 0))
        try:
            conn.request("GET", path, headers={"Host": HOST})
            response = conn.getresponse()
            body = response.read().decode(errors="replace")
            return Reply(response.status, "", body=body)
        except (OSError, http.client.HTTPException) as exc:
            return Reply(0, "", f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with ExitStack() as stack:
        found = Mesh(tmp_path, stack)
        wait_for(lambda: found.straight_to_server().ok, "the server VM takes requests")
        yield found


def wait_for(condition: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.1)


def denied(reply: Reply) -> bool:
    return reply.status == 403 and DENIED in reply.body


def test_a_path_rule_denies_one_path_and_a_deny_policy_wins_over_allow(mesh: Mesh) -> None:
    mesh.write("allow.yaml", authorization_policy("public", "ALLOW", '[{to: [{operation: {paths: ["/public*"]}}]}]'))
    wait_for(lambda: denied(mesh.straight_to_server("/private")), "the ALLOW policy denies what it does not name")
    assert mesh.straight_to_server("/private").body.strip() == DENIED
    assert mesh.straight_to_server("/public/page").ok
    served = mesh.app.served
    assert not mesh.straight_to_server("/private").ok
    assert mesh.app.served == served  # a denied request never reaches the app

    deny = authorization_policy("secret", "DENY", '[{to: [{operation: {paths: ["/public/secret"]}}]}]')
    mesh.write("deny.yaml", deny)
    wait_for(lambda: denied(mesh.straight_to_server("/public/secret")), "DENY wins over a matching ALLOW")
    assert mesh.straight_to_server("/public/page").ok

    # Removing the policies opens everything again.
    (mesh.dir / "allow.yaml").unlink()
    (mesh.dir / "deny.yaml").unlink()
    wait_for(lambda: mesh.straight_to_server("/private").ok, "no policy: allowed by default")


def test_an_ip_block_rule_keeps_out_one_source_address(mesh: Mesh) -> None:
    mesh.write("deny.yaml", authorization_policy("no-7", "DENY", '[{from: [{source: {ipBlocks: ["127.0.0.7/32"]}}]}]'))
    wait_for(lambda: denied(mesh.straight_to_server(source="127.0.0.7")), "the DENY policy keeps 127.0.0.7 out")
    assert mesh.straight_to_server(source="127.0.0.8").ok
    assert mesh.straight_to_server().ok


def test_a_principals_rule_lets_in_the_right_service_account_only(mesh: Mesh) -> None:
    principal = f"cluster.local/ns/{NS}/sa/sleep"
    mesh.write(
        "allow.yaml",
        authorization_policy("sleep-only", "ALLOW", f'[{{from: [{{source: {{principals: ["{principal}"]}}}}]}}]'),
    )
    # Plaintext carries no certificate: on the plaintext chain no principal ever matches.
    wait_for(lambda: denied(mesh.straight_to_server()), "a plaintext client is refused")

    with mesh.client(SLEEP):
        wait_for(lambda: mesh.through_mesh().ok, "sleep gets in through the mesh")
        assert f"URI=spiffe://{principal}" in mesh.app.last_headers.get("x-forwarded-client-cert", "")
    with mesh.client(CLIENT):
        wait_for(lambda: mesh.through_mesh().status != 0, "the client's proxy is up")
        assert denied(mesh.through_mesh())  # mutual TLS as `default`: not the principal named

    # A namespace rule lets both service accounts of the namespace in, and still not plaintext.
    mesh.write(
        "allow.yaml", authorization_policy("ns-only", "ALLOW", f'[{{from: [{{source: {{namespaces: ["{NS}"]}}}}]}}]')
    )
    with mesh.client(CLIENT):
        wait_for(lambda: mesh.through_mesh().ok, "the namespace rule lets `default` in")
    assert denied(mesh.straight_to_server())


def test_a_service_accounts_rule_lets_in_the_right_caller_only(mesh: Mesh) -> None:
    """Istio's `source.serviceAccounts` (`NAMESPACE/NAME`), then `trustDomains`, through Envoy."""
    mesh.write(
        "allow.yaml",
        authorization_policy("sleep-sa", "ALLOW", f'[{{from: [{{source: {{serviceAccounts: ["{NS}/sleep"]}}}}]}}]'),
    )
    wait_for(lambda: denied(mesh.straight_to_server()), "a plaintext client is refused")
    with mesh.client(SLEEP):
        wait_for(lambda: mesh.through_mesh().ok, "sleep gets in through the mesh")
    with mesh.client(CLIENT):
        wait_for(lambda: mesh.through_mesh().status != 0, "the client's proxy is up")
        assert denied(mesh.through_mesh())  # mutual TLS as `default`: not the account named

    mesh.write(
        "allow.yaml",
        authorization_policy("other-td", "ALLOW", '[{from: [{source: {trustDomains: ["other.example"]}}]}]'),
    )
    with mesh.client(CLIENT):
        wait_for(lambda: denied(mesh.through_mesh()), "a peer of another trust domain only: `default` is out")
    mesh.write(
        "allow.yaml",
        authorization_policy("mesh-td", "ALLOW", '[{from: [{source: {trustDomains: ["cluster.*"]}}]}]'),
    )
    with mesh.client(CLIENT):
        wait_for(lambda: mesh.through_mesh().ok, "a wildcard on the mesh's trust domain lets `default` in")
    assert denied(mesh.straight_to_server())


ISSUER = "https://issuer.e2e.example"


def test_a_jwt_from_a_request_authentication_is_checked_and_required_where_a_policy_says(mesh: Mesh) -> None:
    """RequestAuthentication: a valid token passes, an expired or wrongly signed one gets 401, a
    missing one passes, unless an AuthorizationPolicy asks for `requestPrincipals` (then 403)."""
    key, other = SigningKey.generate("k1"), SigningKey.generate("k1")
    mesh.write(
        "jwt.yaml",
        f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: {ISSUER}
    jwks: '{key.jwks()}'
---
"""
        + authorization_policy(
            "token-for-private",
            "ALLOW",
            f'[{{from: [{{source: {{requestPrincipals: ["{ISSUER}/*"]}}}}],'
            ' to: [{operation: {paths: ["/private"]}}]},'
            ' {to: [{operation: {notPaths: ["/private"]}}]}]',
        ),
    )
    now = int(time.time())
    valid = key.token({"iss": ISSUER, "sub": "alice", "exp": now + 600})
    expired = key.token({"iss": ISSUER, "sub": "alice", "exp": now - 600})
    forged = other.token({"iss": ISSUER, "sub": "alice", "exp": now + 600})

    def call(path: str, token: str | None = None) -> Reply:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return send(mesh.ingress_port, HOST, path=path, headers=headers, address=SERVER_IP)

    wait_for(lambda: denied(call("/private")), "a request without a token is refused where a principal is required")
    assert call("/private", valid).ok
    assert call("/public").ok  # no token, and none required
    assert call("/public", expired).status == 401
    assert call("/private", forged).status == 401


def test_a_space_delimited_claim_of_the_rule_matches_one_of_its_words(mesh: Mesh) -> None:
    """RequestAuthentication `spaceDelimitedClaims` (Istio's buildSpaceDelimitedClaims): a claim
    `roles: "reader admin"` is split, so a condition on `admin` matches it; `scope` is always split."""
    key = SigningKey.generate("k1")
    mesh.write(
        "jwt.yaml",
        f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: {ISSUER}
    jwks: '{key.jwks()}'
    spaceDelimitedClaims: [roles]
---
"""
        + authorization_policy(
            "admins",
            "ALLOW",
            '[{when: [{key: "request.auth.claims[roles]", values: [admin]},'
            ' {key: "request.auth.claims[scope]", values: [write]}]}]',
        ),
    )
    now = int(time.time())

    def call(roles: str) -> Reply:
        token = key.token({"iss": ISSUER, "sub": "alice", "exp": now + 600, "roles": roles, "scope": "read write"})
        return send(mesh.ingress_port, HOST, headers={"Authorization": f"Bearer {token}"}, address=SERVER_IP)

    wait_for(lambda: denied(call("reader auditor")), "a token whose roles lack admin is refused")
    assert call("reader admin").ok


def test_a_required_jwt_rule_refuses_a_request_without_its_token(mesh: Mesh) -> None:
    """RequestAuthentication `presence: REQUIRED` (istio/istio#60830): no token is a 401 from
    jwt_authn itself, without any AuthorizationPolicy; a valid one passes."""
    key = SigningKey.generate("k1")
    mesh.write(
        "jwt.yaml",
        f"""apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: reviews}}}}
  jwtRules:
  - issuer: {ISSUER}
    jwks: '{key.jwks()}'
    presence: REQUIRED
""",
    )
    token = key.token({"iss": ISSUER, "sub": "alice", "exp": int(time.time()) + 600})

    def call(token: str | None) -> Reply:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return send(mesh.ingress_port, HOST, headers=headers, address=SERVER_IP)

    wait_for(lambda: call(None).status == 401, "a request without the required token is refused")
    assert call(token).ok
