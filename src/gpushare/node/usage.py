"""What each container uses on its GPUs, beside what it was allocated: the metrics' source.

The accounting broker (``node.enforcement.broker``) counts every byte of GPU memory a container's
processes hold, on ``cgpu`` and ``core_mem`` nodes, but knows a container only by its account
key. An :class:`Owner` says whose the key is: the pod (``namespace/name``), the container, the
host GPU of each device ordinal, and the computing power it was given. Allocate knows all of it
for a container it can name; one named by its device IDs gets its pod and container when
PodResources names them (``InterposerIsolation.weigh``).

The owner is kept in a file beside the container's limits (``<state>/limits/<key>/owner``), so
a restarted plugin reports the same containers again. The limits file itself is mounted into
the container and read by the interposer, whose format has no room for a pod's name; the owner
file is not mounted anywhere, so the container never sees other pods' names either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from gpushare.core.model.names import ANN_NODE_GPU_USED
from gpushare.core.records.gpuuse import moved, render_used
from gpushare.kube.port import KubeAPI, KubeError

log = logging.getLogger(__name__)

OWNER_FILE_NAME = "owner"
USED_SUMMARY_INTERVAL_S = 300.0
"""How often, at most, the node's ``gpushare.io/gpu-used`` summary is rewritten
(core.records.gpuuse)."""
MIB = 1024 * 1024


class Owner(msgspec.Struct, frozen=True):
    """Whose an account key is; ``pod`` is ``""`` until PodResources names it."""

    pod: str
    """``namespace/name``."""
    container: str
    gpus: tuple[int, ...]
    """The host GPU index of each device ordinal."""
    core_pct: int = 0
    """Computing power given on each GPU, percent (0: none asked, the whole GPU may be used)."""


@dataclass(frozen=True)
class ContainerUse:
    """One container's GPU memory, held now and allowed, per device ordinal."""

    owner: Owner
    used_bytes: tuple[int, ...]
    limit_bytes: tuple[int, ...]

    @property
    def namespace(self) -> str:
        return self.owner.pod.partition("/")[0]

    @property
    def pod_name(self) -> str:
        return self.owner.pod.partition("/")[2]


def write_owner(directory: Path, owner: Owner) -> None:
    """Write the owner file (atomically: a restart reads the old file or the new)."""
    tmp = directory / f".{OWNER_FILE_NAME}.tmp"
    tmp.write_bytes(msgspec.json.encode(owner))
    tmp.replace(directory / OWNER_FILE_NAME)


def read_owner(directory: Path) -> Owner | None:
    """The owner file's record, or None when there is none or it cannot be read."""
    try:
        return msgspec.json.decode((directory / OWNER_FILE_NAME).read_bytes(), type=Owner)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def used_per_gpu(uses: list[ContainerUse], indexes: list[int]) -> dict[int, int]:
    """MiB held on each GPU, every container together (GPUs nobody uses at 0)."""
    out = dict.fromkeys(indexes, 0)
    for use in uses:
        for gpu, held in zip(use.owner.gpus, use.used_bytes, strict=False):
            out[gpu] = out.get(gpu, 0) + held
    return {gpu: held // MIB for gpu, held in out.items()}


class UsedSummaryPublisher:
    """Writes the node's per-GPU use summary, rarely (see ``core.records.gpuuse`` for why a
    summary).

    Every ``interval_s`` it adds up what the containers hold and patches the node only when a
    GPU's figure moved by ``step_mib`` (the node's memory unit) or more since the last write:
    an idle node is written once, a busy one at most once per interval. A failed write is
    logged and tried at the next interval; nothing else depends on it.
    """

    def __init__(
        self,
        api: KubeAPI,
        node: str,
        *,
        usage: Callable[[], list[ContainerUse]],
        gpus: Callable[[], list[int]],
        step_mib: int,
        interval_s: float = USED_SUMMARY_INTERVAL_S,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.node = node
        self.usage = usage
        self.gpus = gpus
        self.step_mib = step_mib
        self.interval_s = interval_s
        self.now = now
        self.published: dict[int, int] | None = None
        self.writes = 0

    async def publish(self) -> bool:
        """Write the summary if it moved; whether it was written."""
        used = used_per_gpu(self.usage(), self.gpus())
        if not moved(self.published, used, self.step_mib):
            return False
        at = self.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self.api.patch_node(
                self.node, annotations={ANN_NODE_GPU_USED: render_used(used, at)}
            )
        except KubeError as err:
            log.warning("node=%s phase=used-summary not written: %s", self.node, err)
            return False
        self.published = used
        self.writes += 1
        return True

    async def run(self) -> None:
        """Publish every interval, forever."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.publish()
