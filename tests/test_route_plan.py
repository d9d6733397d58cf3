"""A sidecar route configuration's domain plan after services came, updated from the plan
before, is the plan made whole, whatever the hosts' names and addresses collide on."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.xds.route_plan import MIN_HOSTS_UPDATED, Host, domain_plan, updated_plan

PORT = 9080
PROXY_DOMAIN = "ns1.svc.cluster.local"

#: Names that collide: Kubernetes-style hosts whose short forms meet (`a` from ns1 and ns2),
#: the same name in other cases, hosts named like another's short form, shared addresses.
_names = st.sampled_from(["a", "b", "A", "c-1", "ns1", "svc"])
_namespaces = st.sampled_from(["ns1", "ns2", "NS1"])
_hostnames = st.one_of(
    st.builds(lambda n, ns: f"{n}.{ns}.svc.cluster.local", _names, _namespaces),
    st.builds(lambda n, ns: f"{n}.{ns}", _names, _namespaces),
    _names,
    st.builds(lambda n: f"{n}.example.com", _names),
)
_addresses = st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "2001:db8::1", "10.1.0.0/16"]), max_size=2)
_hosts = st.builds(lambda h, a, vs: (h, None if vs else tuple(a)), _hostnames, _addresses, st.booleans())


def _base(count: int) -> list[Host]:
    """Distinct services, sorted, enough of them for the plan to keep what an update needs."""
    return [(f"s{i:04}.ns{i % 3}.svc.cluster.local", (f"10.9.{i // 256}.{i % 256}",)) for i in range(count)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_hosts, max_size=6),
    st.lists(st.tuples(st.integers(min_value=0), _hosts), min_size=1, max_size=4),
)
def test_an_updated_plan_is_the_plan_made_whole(extra: list[Host], added: list[tuple[int, Host]]) -> None:
    hosts = _base(MIN_HOSTS_UPDATED) + extra
    before = domain_plan(PORT, PROXY_DOMAIN, tuple(hosts))
    for position, host in added:
        hosts.insert(position % (len(hosts) + 1), host)
    now = tuple(hosts)
    updated = updated_plan(before, PORT, PROXY_DOMAIN, now)
    if updated is not None:
        whole = domain_plan(PORT, PROXY_DOMAIN, now)
        assert updated.entries == whole.entries
        assert (updated.used, updated.known, updated.names) == (whole.used, whole.known, whole.names)


def test_services_added_without_a_collision_are_planned_alone() -> None:
    """The update is taken where it can be (else the test above would prove nothing): new
    services, one of them in the middle of the order, one named like no one else."""
    hosts = _base(MIN_HOSTS_UPDATED + 10)
    before = domain_plan(PORT, PROXY_DOMAIN, tuple(hosts))
    hosts.insert(100, ("s0099x.ns1.svc.cluster.local", ("10.10.0.1",)))
    hosts.append(("zz.other.mesh", ()))
    updated = updated_plan(before, PORT, PROXY_DOMAIN, tuple(hosts))
    assert updated is not None
    assert updated.entries == domain_plan(PORT, PROXY_DOMAIN, tuple(hosts)).entries
    # A host gone, or a service wanting a domain taken: planned whole.
    assert updated_plan(updated, PORT, PROXY_DOMAIN, tuple(hosts[1:])) is None
    taken = [*hosts, ("s0001", ("10.9.0.1",))]
    assert updated_plan(updated, PORT, PROXY_DOMAIN, tuple(taken)) is None
