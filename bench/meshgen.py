"""Generate a VM mesh of any size as Istio YAML: ServiceEntries with WorkloadEntries, and
DestinationRules and VirtualServices on a share of the services. Used by the benchmarks."""

from __future__ import annotations

from pathlib import Path

SE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: svc-{i}
  namespace: {ns}
spec:
  hosts:
  - svc-{i}.{ns}.mesh
  location: MESH_INTERNAL
  ports:
  - number: 8080
    name: http
    protocol: HTTP
  resolution: STATIC
  workloadSelector:
    labels:
      app: svc-{i}
"""

WE = """apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: svc-{i}-{j}
  namespace: {ns}
spec:
  address: {ip}
  labels:
    app: svc-{i}
    version: v{v}
  serviceAccount: svc-{i}
"""

DR = """apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: svc-{i}
  namespace: {ns}
spec:
  host: svc-{i}.{ns}.mesh
  trafficPolicy:
    connectionPool:
      tcp:
        maxConnections: 100
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
  name: svc-{i}
  namespace: {ns}
spec:
  hosts:
  - svc-{i}.{ns}.mesh
  http:
  - match:
    - headers:
        x-canary:
          exact: "true"
    route:
    - destination:
        host: svc-{i}.{ns}.mesh
        subset: v2
  - route:
    - destination:
        host: svc-{i}.{ns}.mesh
        subset: v1
      weight: 90
    - destination:
        host: svc-{i}.{ns}.mesh
        subset: v2
      weight: 10
    timeout: 5s
"""


def ip_for(n: int) -> str:
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def write_mesh(
    root: Path, services: int, endpoints: int, *, routed_share: float = 0.2, namespaces: int = 10
) -> int:
    """Write the mesh under `root`, one file per service; returns the number of resources."""
    root.mkdir(parents=True, exist_ok=True)
    count = 0
    routed_every = max(1, round(1 / routed_share)) if routed_share > 0 else 0
    for i in range(services):
        ns = f"ns-{i % namespaces}"
        docs = [SE.format(i=i, ns=ns)]
        for j in range(endpoints):
            docs.append(WE.format(i=i, j=j, ns=ns, ip=ip_for(i * endpoints + j + 1), v=1 + j % 2))
        if routed_every and i % routed_every == 0:
            docs += [DR.format(i=i, ns=ns), VS.format(i=i, ns=ns)]
        count += len(docs)
        (root / ns).mkdir(exist_ok=True)
        (root / ns / f"svc-{i}.yaml").write_text("---\n".join(docs))
    return count
