"""Which address a VM registering into a WorkloadGroup has, when it names none.

`meshctl bootstrap --group NAME.NAMESPACE` without `--ip` writes `0.0.0.0` as the node id's IP;
such a node takes the address its xDS connection comes from, as Istio takes a proxy's peer
address when it gives none. Both its health stream (which registers it) and its ADS stream
(which binds it to the entry made) read it the same way, here. A module of its own, so that the
ADS servicer and the registrar can both import it without importing each other.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from typing import Final
from urllib.parse import unquote

from meshctl.logs import untrusted
from meshctl.snapshot.node import ProxyNode

METADATA_KEY: Final = "AUTO_REGISTER_GROUP"


def group_of(node: ProxyNode) -> str:
    """The WorkloadGroup `node` asks to register into ("" for none)."""
    return str(node.metadata.get(METADATA_KEY) or "")


#: What `meshctl bootstrap --group` without `--ip` writes as the node's IP: "take my peer address".
UNSPECIFIED: Final = frozenset({"0.0.0.0", "::"})


def peer_ip(peer: str) -> str:
    """The IP of a gRPC peer (`ipv4:10.0.0.5:51234`, `ipv6:[fd00::5]:51234`); "" for any other."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    return unquote(rest).rpartition(":")[0].strip("[]")


def with_peer_address(node: ProxyNode, peer: str) -> ProxyNode | str:
    """A node registering into a group without an address of its own (its node id's IP is
    0.0.0.0: `meshctl bootstrap --group` without `--ip`) takes the address its xDS connection
    comes from, as Istio takes the peer address of a proxy that gives none; any other node is
    returned as is. A loopback or unspecified peer (a proxy beside the server, or behind a
    local relay) names no VM: the refusal says to give `--ip`."""
    if node.ip not in UNSPECIFIED or not group_of(node):
        return node
    text = peer_ip(peer)
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return (
            f"node {untrusted(node.id)} gives no address (meshctl bootstrap --group without --ip) and its "
            f"connection has none ({untrusted(peer)}): give --ip to meshctl bootstrap"
        )
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return (
            f"node {untrusted(node.id)} gives no address (meshctl bootstrap --group without --ip) and connects "
            f"from {address}, which is no VM's address: give --ip to meshctl bootstrap"
        )
    return replace(node, ip=str(address))
