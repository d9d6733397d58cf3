"""Generate a VM mesh of any size as Istio YAML: ServiceEntries with WorkloadEntries, and
DestinationRules and VirtualServices on a share of the services. Used by the benchmarks; the
templates are the fleet benchmark's too (`bench/fleet.py`), which fills in its own ports,
timeouts and limits."""

from __future__ import annotations

from pathlib import Path

SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
  namespace: {ns}
spec:
  hosts:
  - {host}
  location: MESH_INTERNAL
  ports:
  - number: {port}
    name: http
    protocol: HTTP
    targetPort: {target}
  resolution: STATIC
  workloadSelector:
    labels:
      app: {name}
"""

WE = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: {name}
  namespace: {ns}
spec:
  address: {ip}
  labels:
    app: {app}
    version: v{v}
  serviceAccount: {app}
"""

DR = """apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: {name}
  namespace: {ns}
spec:
  host: {host}
  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: {max_connections}
    outlierDetection:
      consecutive5xxErrors: 5
      interval: 10s
      baseEjectionTime: 30s
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
"""

VS = """apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: {name}
  namespace: {ns}
spec:
  hosts:
  - {host}
  http:
  - match:
    - headers:
        x-canary:
          exact: "true"
    route:
    - destination:
        host: {host}
        subset: v2
  - route:
    - destination:
        host: {host}
        subset: v1
      weight: 90
    - destination:
        host: {host}
        subset: v2
      weight: 10
    timeout: {timeout}s
"""


def ip_for(n: int) -> str:
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def write_mesh(root: Path, services: int, endpoints: int, *, routed_share: float = 0.2, namespaces: int = 10) -> int:
    """Write the mesh under `root`, one file per service; returns the number of resources."""
    root.mkdir(parents=True, exist_ok=True)
    count = 0
    routed_every = max(1, round(1 / routed_share)) if routed_share > 0 else 0
    for i in range(services):
        ns = f"ns-{i % namespaces}"
        name, host = f"svc-{i}", f"svc-{i}.{ns}.mesh"
        docs = [SE.format(name=name, ns=ns, host=host, port=8080, target=8080)]
        for j in range(endpoints):
            ip = ip_for(i * endpoints + j + 1)
            docs.append(WE.format(name=f"{name}-{j}", ns=ns, ip=ip, app=name, v=1 + j % 2))
        if routed_every and i % routed_every == 0:
            docs += [
                DR.format(name=name, ns=ns, host=host, max_connections=100),
                VS.format(name=name, ns=ns, host=host, timeout=5),
            ]
        count += len(docs)
        (root / ns).mkdir(exist_ok=True)
        (root / ns / f"svc-{i}.yaml").write_text("---\n".join(docs))
    return count
