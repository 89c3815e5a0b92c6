"""The device plugin's file descriptors: what its own work needs, and what tenants may have.

Every GPU container of a cgpu or core_mem node can connect to its accounting broker
(``node.enforcement.broker``), and every connection is a descriptor of the plugin's. Left unbounded,
one pod's containers can open them until the plugin's ``RLIMIT_NOFILE`` is spent, after which
Allocate cannot write a limits file, PodResources cannot be read and every new GPU pod of the
node fails with ``Too many open files``. So the plugin keeps :data:`RESERVED` descriptors for its
own work, whatever tenants do, and hands the broker only what is left, under three caps: per
container (``gpushare.isolation.accounting.MAX_CONNECTIONS``), per pod and per node
(:class:`BrokerCaps`). Those caps bound what tenants take from the node; they would not keep one
tenant from taking all of it (nine pods of two containers at 1,000 connections each fill 16,384),
so each container is also *kept* a few connections (:attr:`BrokerCaps.kept`, 16) that no other
container can take: the node's cap is charged, for every container served, the larger of its
connections and what it is kept, and room for :data:`ARRIVALS` more containers' worth is held
back besides, so that a container that arrives while the node is full still finds its own.

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

from gpushare.isolation.accounting import MAX_CONNECTIONS

RESERVED = 256
"""Descriptors the plugin keeps for its own work (the table above)."""
DEFAULT_PER_POD = 2048
"""Broker connections one pod's containers may hold together: two containers' worth."""
DEFAULT_PER_NODE = 16384
"""Broker connections the whole node may hold (fewer when the descriptor limit is lower)."""
DEFAULT_KEPT = 16
"""Connections every container can always open, whatever other containers hold: one per
process that uses the GPU, for up to 16 such processes (a trainer, its evaluator, a profiler)."""
ARRIVALS = 8
"""Containers that may arrive while the node's shared connections are all taken and still find
what they are kept: the node's cap holds back ``kept`` connections for each (more arriving at
once than this is only possible while the open-file limit leaves room, which it does by default:
16,384 under a limit of 20,000 and more)."""
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
    """Connections of every container of the node together, each container charged at least
    what it is kept (``kept``)."""
    kept: int = DEFAULT_KEPT
    """Connections each container can always open, whatever the others hold (``kept_each``)."""
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
        if not 1 <= self.kept <= min(self.per_pod, MAX_CONNECTIONS):
            raise CapsError(
                f"--broker-min-connections-per-container={self.kept} must be from 1 (a "
                f"container needs one) to {min(self.per_pod, MAX_CONNECTIONS)} (the pod's cap "
                f"and the container's, whichever is lower)"
            )
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

    def hard(self, listeners: int) -> int | None:
        """Connections the open-file limit allows at all, with ``listeners`` sockets listening
        (None: no limit); not even a kept connection goes past it."""
        return None if self.descriptors is None else self.descriptors - RESERVED - listeners

    def kept_each(self, containers: int) -> int:
        """What each of ``containers`` served containers is kept: ``kept``, less when the node
        cannot keep that much for all of them and :data:`ARRIVALS` more (then an equal share)."""
        return min(self.kept, self.room(containers) // (containers + ARRIVALS))

    def shared(self, containers: int) -> int:
        """The charge (each container: the larger of its connections and ``kept_each``) up to
        which a container may open connections beyond what it is kept: the node's room less
        what :data:`ARRIVALS` more containers are kept."""
        return self.room(containers) - ARRIVALS * self.kept_each(containers)


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
