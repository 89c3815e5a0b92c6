"""Which extender replica leads: the one whose kube-scheduler holds the scheduler's Lease.

The chart runs two scheduler replicas with leader election; kube-scheduler names the Lease's
holder ``os.Hostname() + "_" + a UUID`` (k8s v1.36 cmd/kube-scheduler/app/server.go), and the
extender shares its container's UTS namespace, so this replica's hostname (its pod's name, or
the node's under hostNetwork) starts the holder's identity when it leads. The loops that write
for the whole cluster (the autoscaling loop, DRA mode's allocator) act only there: the standby
decides from the same watches and would race for the same objects.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.kube.port import KubeDict, NotFound


class LeaseReader(Protocol):
    """What reading the Lease takes (``KubeAPI.get_lease``)."""

    async def get_lease(self, namespace: str, name: str) -> KubeDict: ...


@dataclass(frozen=True)
class Leadership:
    """The Lease to read, and this replica's identity. An empty ``lease``: one replica, which
    always leads."""

    lease: str = ""
    namespace: str = ""
    identity: str = field(default_factory=socket.gethostname)

    async def leading(self, api: LeaseReader) -> bool:
        """Whether this replica's kube-scheduler holds the Lease now (no Lease yet: no)."""
        if not self.lease:
            return True
        try:
            held = await api.get_lease(self.namespace, self.lease)
        except NotFound:
            return False
        holder = str(((held.get("spec") or {}).get("holderIdentity")) or "")
        mine = self.identity
        return bool(mine) and (holder == mine or holder.startswith(mine + "_"))
