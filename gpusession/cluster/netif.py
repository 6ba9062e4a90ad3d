"""Which network interface gloo and nccl use: the one that carries the worker's Ray node IP.

Left alone, gloo binds to the address its host's name resolves to, and tells its peers that
address. On Debian and Ubuntu a host's own name resolves to 127.0.1.1, so every rank on another
host is told a loopback address and a run across hosts fails. The Ray node IP is the address the
other hosts already reach this one by (Ray's own traffic, and rank 0's rendezvous store, use it),
so the collectives are bound to the interface that carries it.

A value already set (by the user's runtime_env or by whoever started the Ray node) always wins:
only they know that, say, the fast fabric is ib0 while Ray talks over eth0.
"""
from __future__ import annotations

import ipaddress
import logging
import os
from typing import Iterable, Mapping

log = logging.getLogger(__name__)

GLOO_VAR = "GLOO_SOCKET_IFNAME"
NCCL_VAR = "NCCL_SOCKET_IFNAME"


def interface_for(ip: str, interfaces: Mapping[str, Iterable[str]]) -> str | None:
    """The first interface (in the order given) with `ip` among its addresses, else None.
    `interfaces` maps an interface name to its addresses as text (IPv6 may carry a %scope)."""
    wanted = _parse(ip)
    if wanted is None:
        return None
    for name, addresses in interfaces.items():
        if any(_parse(address) == wanted for address in addresses):
            return name
    return None


def collective_env(ip: str, environ: Mapping[str, str],
                   interfaces: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """The variables to add to `environ` so gloo and nccl bind to the interface carrying `ip`:
    nothing for a variable already set to a non-empty value, nothing if no interface has `ip`."""
    name = interface_for(ip, interfaces)
    if name is None:
        return {}
    # nccl reads its variable as a prefix ("eth" would also take eth1, eth10); "=" means exactly.
    values = {GLOO_VAR: name, NCCL_VAR: f"={name}"}
    return {var: value for var, value in values.items() if not environ.get(var)}


def socket_ifname_env(node_ip: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """collective_env for this machine's interfaces (psutil); logs why when it returns nothing."""
    import psutil

    environ = os.environ if environ is None else environ
    interfaces = {name: [a.address for a in addresses] for name, addresses in psutil.net_if_addrs().items()}
    result = collective_env(node_ip, environ, interfaces)
    if interface_for(node_ip, interfaces) is None:
        log.debug("No network interface on this host carries its Ray node IP %s (interfaces: %s); "
                  "gloo and nccl choose their own address (gloo: the one the host name resolves to).",
                  node_ip, _describe(interfaces))
    elif not result:
        log.debug("Keeping %s=%r and %s=%r set for this worker; not binding to the interface of %s.",
                  GLOO_VAR, environ.get(GLOO_VAR), NCCL_VAR, environ.get(NCCL_VAR), node_ip)
    return result


def _parse(address: str):
    try:
        return ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:  # a MAC address (AF_PACKET) or garbage: never a match
        return None


def _describe(interfaces: Mapping[str, Iterable[str]]) -> str:
    parts = [f"{name} {' '.join(a for a in addresses if _parse(a) is not None)}".strip()
             for name, addresses in interfaces.items()]
    return ", ".join(parts) or "none"
