"""Listening ports for the components a test starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()
_PICK = random.SystemRandom()  # a test seeding `random` must not make two runs pick alike


def _ephemeral_range() -> range:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A TCP port nobody listens on now, and that no outgoing connection will take meanwhile.

    A port the kernel picks with ``bind(0)`` comes from the ephemeral range, which every outgoing
    connection also draws from: between the pick and the component's own ``listen`` a client
    socket (kube-apiserver to etcd, kubectl, the harness) can take it, and the component fails
    with "address already in use". So the port is drawn at random below that range, checked free,
    and never handed out twice by this process.
    """
    ephemeral = _ephemeral_range()
    low, high = (10000, ephemeral.start - 1) if ephemeral.start > 12000 else (ephemeral.stop, 65535)
    for _ in range(200):
        port = _PICK.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {low}-{high} after 200 tries")
