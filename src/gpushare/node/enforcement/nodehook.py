"""The plugin's hook: the one for the node's mode, picked when the plugin starts."""

from __future__ import annotations

import logging
from pathlib import Path

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.isolation.policy import Policy
from gpushare.node.descriptors import BrokerCaps
from gpushare.node.enforcement.broker import BrokerStats
from gpushare.node.enforcement.hook import (
    ContainerAnswer,
    IsolationHook,
    NoIsolation,
    Target,
)
from gpushare.node.enforcement.interposer import InterposerIsolation
from gpushare.node.enforcement.mountcheck import MountCheck
from gpushare.node.enforcement.mps import MpsIsolation
from gpushare.node.enforcement.mpsdaemon import DaemonRunner, MpsControl
from gpushare.node.gpus import GpuSource
from gpushare.node.usage import ContainerUse

log = logging.getLogger(__name__)

POLICIES = ("auto", "none")


class NodeIsolation:
    """The plugin's hook: picks the one for the node's mode when the plugin starts.

    ``policy`` is ``auto`` (enforce what the mode promises, refusing to start when that is not
    possible) or ``none`` (serve every mode without isolation: the limits become advisory).
    """

    def __init__(
        self,
        *,
        policy: str,
        lib_dir: Path,
        state_dir: Path,
        unit: MemoryUnit,
        source: GpuSource,
        runner: DaemonRunner | None = None,
        packaged: Path | None = None,
        cgpu_policy: Policy = Policy.NATIVE,
        max_pods: int | None = None,
        caps: BrokerCaps | None = None,
        broker_stats: BrokerStats | None = None,
        mount_check: MountCheck | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--isolation={policy!r} is not supported: use auto or none")
        self.policy = policy
        self.cgpu_policy = cgpu_policy
        self.max_pods = max_pods
        self.lib_dir = lib_dir
        self.state_dir = state_dir
        self.unit = unit
        self.source = source
        self.runner = runner or MpsControl()
        self.packaged = packaged
        self.caps = caps
        """The accounting broker's connection caps (cgpu and core_mem nodes)."""
        self.broker_stats = broker_stats
        self.chosen: IsolationHook = NoIsolation()
        self.mount_check = mount_check
        """The runtime's check of the isolation mounts (``cdi-cri``); None: no CDI to carry it."""

    def prepare(self, mode: Mode) -> str | None:
        """Pick the hook for ``mode`` and prepare it."""
        if self.policy == "none" or not mode.isolated:
            if mode.isolated:
                log.warning(
                    "mode=%s isolation=none: limits are not enforced on this node", mode.value
                )
            self.chosen = NoIsolation()
        elif mode is Mode.MPS:
            self.chosen = MpsIsolation(
                runner=self.runner, state_dir=self.state_dir, source=self.source, unit=self.unit
            )
        else:
            self.chosen = InterposerIsolation(
                lib_dir=self.lib_dir,
                state_dir=self.state_dir,
                unit=self.unit,
                packaged=self.packaged,
                cgpu_policy=self.cgpu_policy,
                gpu_memory_mib={g.index: g.memory_mib for g in self.source.gpus()},
                gpu_uuids={g.index: g.uuid for g in self.source.gpus()},
                max_pods=self.max_pods,
                caps=self.caps,
                broker_stats=self.broker_stats,
            )
            if mode is Mode.CGPU:
                log.info(
                    "mode=cgpu policy=%d %s max_pods_per_gpu=%d",
                    self.cgpu_policy,
                    self.cgpu_policy.name.lower(),
                    self.max_pods or self.unit.default_max_pods_per_gpu,
                )
        refused = self.chosen.prepare(mode)
        if refused is not None or isinstance(self.chosen, NoIsolation):
            return refused
        if self.mount_check is None:
            log.warning(
                "mode=%s device-list-strategy envvar or driver-root: no CDI to carry the "
                "runtime's check of the isolation mounts, so a volume that an image's link "
                "moves over them goes unnoticed; use cdi-cri where the runtime has CDI "
                "(docs/isolation.md)",
                mode.value,
            )
            return None
        return self.mount_check.install()

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        """Delegate to the chosen hook; name the mount check in an answer it isolated."""
        extended = self.chosen.extend(answer, target)
        if self.mount_check is None or extended.mounts == answer.mounts:
            return extended
        return self.mount_check.guard(extended)

    def prune(self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]) -> None:
        """Delegate to the chosen hook."""
        self.chosen.prune(live_uids, live_devices)

    def weigh(self, uid: str, container: str, device_ids: tuple[str, ...], weight: int) -> None:
        """Delegate to the chosen hook."""
        self.chosen.weigh(uid, container, device_ids, weight)

    @property
    def counts_usage(self) -> bool:
        """Whether the interposer's broker counts this node's containers' GPU memory."""
        return isinstance(self.chosen, InterposerIsolation)

    def usage(self) -> list[ContainerUse]:
        """Each container's GPU memory held and allowed; none where no interposer counts it
        (``share`` nodes, ``mps``, ``--isolation none``)."""
        return self.chosen.usage() if isinstance(self.chosen, InterposerIsolation) else []

    def close(self) -> None:
        """Delegate to the chosen hook."""
        self.chosen.close()
