"""The device plugin's file descriptors: what its own work needs, and what tenants may have.

Every GPU container of a cgpu or core_mem node can connect to its accounting broker
(``deviceplugin.broker``), and every connection is a descriptor of the plugin's. Left unbounded,
one pod's containers can open them until the plugin's ``RLIMIT_NOFILE`` is spent, after which
Allocate cannot write a limits file, PodResources cannot be read and every new GPU pod of the
node fails with ``Too many open files``. So the plugin keeps :data:`RESERVED` descriptors for its
own work, whatever tenants do, and hands the broker only what is left, under three caps: per
container (``gpushare.isolation.accounting.MAX_CONNECTIONS``), per pod and per node
(:class:`BrokerCaps`).

The reserve, counted for the largest node the plugin serves (16 GPUs, both resources,
concurrent scrapes); the broker's listening sockets, one per served container, are counted as
they are opened, on top of it:

==========================================  ====  =============================================
what                                        fds   why that many
==========================================  ====  =============================================
stdin, stdout, stderr                          3
asyncio's loop                                 3   an epoll and its wake-up socket pair
gRPC servers (2 resources) and clients        48   listening sockets, kubelet's connections,
                                                   gRPC core's pollers and wake-up fds, the
                                                   Registration and PodResources channels
Kubernetes API client                        100   httpx's connection pool limit
metrics HTTP server                           33   its socket and one per concurrent scrape
checkpoint, limits and schedule files          8   written one at a time, temporary and rename
NVML                                          36   ``/dev/nvidiactl``, ``nvidia-uvm``, one
                                                   device node and one event per GPU
MPS control commands                           6   a subprocess's pipes
Python itself and margin                      19   imports, ``/dev/urandom``, logging handlers
==========================================  ====  =============================================

256 in all, a margin of more than ten over what the plugin holds serving a real node with fake
GPUs (15; docs/device-plugin.md says where that was measured).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

RESERVED = 256
"""Descriptors the plugin keeps for its own work (the table above)."""
DEFAULT_PER_POD = 2048
"""Broker connections one pod's containers may hold together: two containers' worth."""
DEFAULT_PER_NODE = 16384
"""Broker connections the whole node may hold (fewer when the descriptor limit is lower)."""
DEFAULT_IDLE_S = 60.0
"""Seconds a connection that holds no memory may stay silent before the broker closes it."""


class CapsError(ValueError):
    """A cap that cannot be served; the message names the flag, the value and the rule."""


@dataclass(frozen=True)
class BrokerCaps:
    """How many broker connections each pod and the node may hold, and for how long idle."""

    per_pod: int = DEFAULT_PER_POD
    """Connections of all the containers of one pod together."""
    per_node: int = DEFAULT_PER_NODE
    """Connections of every container of the node together."""
    idle_s: float = DEFAULT_IDLE_S
    """Seconds of silence after which a connection holding nothing is closed; 0: never."""
    descriptors: int | None = None
    """The plugin's ``RLIMIT_NOFILE``; None: unlimited (tests). The broker keeps
    :data:`RESERVED` of it, and one per listening socket, out of tenants' reach."""

    def __post_init__(self) -> None:
        for flag, value in (
            ("--broker-max-connections-per-pod", self.per_pod),
            ("--broker-max-connections-per-node", self.per_node),
        ):
            if value < 1:
                raise CapsError(f"{flag}={value} must be at least 1: a container needs one")
        if self.per_pod > self.per_node:
            raise CapsError(
                f"--broker-max-connections-per-pod={self.per_pod} is more than "
                f"--broker-max-connections-per-node={self.per_node}: lower the pod's cap or "
                f"raise the node's"
            )
        if self.idle_s < 0:
            raise CapsError(
                f"--broker-idle-timeout={self.idle_s:g} must be 0 (never) or a positive "
                f"number of seconds"
            )
        if self.descriptors is not None and self.descriptors <= RESERVED:
            raise CapsError(
                f"the device plugin may open {self.descriptors} files (RLIMIT_NOFILE), and it "
                f"keeps {RESERVED} for its own work: raise the limit of its container "
                f"(containerd's LimitNOFILE, or ulimit -n) above {RESERVED}"
            )

    def room(self, listeners: int) -> int:
        """Connections the descriptor limit leaves, with ``listeners`` sockets listening."""
        if self.descriptors is None:
            return self.per_node
        return min(self.per_node, self.descriptors - RESERVED - listeners)


def soft_limit() -> int | None:
    """This process's soft ``RLIMIT_NOFILE``, or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def descriptor_limit() -> int | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the limit now in force.

    None when unlimited. The soft limit is the process's own to raise (a container's default
    soft limit is often 1024 under a hard limit a thousand times larger).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft
