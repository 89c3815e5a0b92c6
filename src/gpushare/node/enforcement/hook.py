"""The isolation hook's contract: what a container is answered, and what the hook adds to it.

A node driver (today kubelet's device plugin) decides which GPUs and how much of each a container
gets (deviceplugin.answering); the hook for the node's mode (``nodehook``) then adds what enforces
it: a preloaded interposer with its limits and broker account, or an MPS pipe directory. The
answer is a plain value, so the same hooks can serve any driver that hands a container its
environment, mounts and CDI devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.core.model.inventory import Mode
from gpushare.core.records.handoff import Pending, Signature


@dataclass(frozen=True)
class ContainerAnswer:
    """The environment and mounts one container gets."""

    envs: Mapping[str, str]
    mounts: tuple[tuple[str, str, bool], ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (``nvidia.com/gpu=<uuid>``) under cdi-cri."""
    devices: tuple[tuple[str, str, str], ...] = ()
    """Device nodes (container path, host path, cgroup permissions) under driver-root."""


class IsolationError(Exception):
    """An isolation hook cannot serve a container; Allocate fails with this message."""


@dataclass(frozen=True)
class Target:
    """What one Allocate call serves: the signature, the node's mode, and who may be admitted.

    ``candidates`` are the pending containers sharing the signature; kubelet does not say which
    of them it is admitting, so when there are several the hook must not name one. The device
    IDs are kubelet's, unique among live containers.
    """

    signature: Signature
    mode: Mode
    candidates: tuple[Pending, ...] = ()
    device_ids: tuple[str, ...] = ()
    weight: int = 1
    """cGPU policy 2's weight, from the candidates' pod specs (``ALIYUN_COM_GPU_SCHD_WEIGHT``)."""


class IsolationHook(Protocol):
    """Adds what the isolation layer needs (preload, accounting dir) to a container's answer.

    ``prepare`` runs once when the plugin starts, with the node's mode, and returns why the
    plugin must not start (or ""); ``close`` runs when it stops and must be idempotent.
    """

    def prepare(self, mode: Mode) -> str | None:
        """Get ready to serve a node of this mode; the reason to refuse; None when ready."""
        ...

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Return the answer with the isolation layer's additions."""
        ...

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Drop per-container state of pods not in ``live_uids`` and device sets not in use.

        ``live_devices`` are the sorted memory device IDs of each container kubelet reports.
        Both are snapshots that may predate an Allocate running meanwhile, so state younger than
        a short grace period must be kept.
        """
        ...

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """The container kubelet gave these memory device IDs asks for this cGPU weight.

        Called once PodResources names the pod; Allocate may have had to give the lowest
        weight of several candidates. Idempotent.
        """
        ...

    def close(self) -> None:
        """Release what ``prepare`` and ``extend`` started."""
        ...


class NoIsolation:
    """The default hook: share nodes, and nodes served with ``--isolation none``."""

    def prepare(self, mode: Mode) -> str | None:
        """Nothing to prepare."""
        return None

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Leave the answer as it is."""
        return answer

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Nothing kept."""

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """No schedules."""

    def close(self) -> None:
        """Nothing to release."""
