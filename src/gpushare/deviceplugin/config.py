"""What one node's device plugin is told, and the plain counters its parts share.

Every part of the plugin (registration, Allocate, the served-check) gets the same ``PluginConfig``
and adds to the same ``Stats``; the metrics collector reads ``Stats`` when scraped, so nothing is
updated per call beyond these integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.model.names import DEFAULT_NAMES, ResourceNames
from gpushare.core.model.startuptaint import STARTUP_TAINT
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM
from gpushare.node.cdi import HandOff
from gpushare.node.enforcement.broker import BrokerStats


@dataclass
class Stats:
    """Counters the tests and the metrics read."""

    allocations: int = 0
    refused: int = 0
    served_pods: int = 0
    mismatches: int = 0
    registrations: int = 0
    untrusted: dict[str, int] = field(default_factory=dict)
    """Pods whose allocation was ignored, by reason (core.records.trust), each pod once per
    reason."""
    broker: BrokerStats = field(default_factory=BrokerStats)
    hand_off: str = "skipped"
    """What the start's hand-off check found (``node.handoffproof.Verdict``): applied,
    ignored (started under ``--hand-off-check warn``), unknown or skipped."""


@dataclass
class PluginConfig:
    """Where things are and what to serve."""

    node: str
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    state_dir: Path = Path("/var/lib/gpushare")
    unit: MemoryUnit = MemoryUnit.GiB
    names: ResourceNames = field(default_factory=lambda: DEFAULT_NAMES)
    check_interval: float = 1.0
    max_pods_per_gpu: int | None = None
    """The chart's maxPodsPerGpu (cGPU's max_inst); None: the unit's default, 20 or 16."""
    handoff: HandOff = field(default_factory=HandOff)
    """How Allocate hands the GPUs over (``cdi``): envvar unless told; the CLI's default, and
    the chart's, is cdi-cri."""
    startup_taint: str = STARTUP_TAINT
    """The taint key removed from the node once kubelet allocates the GPU memory
    (``core.model.startuptaint``); empty: none."""

    @property
    def max_pods(self) -> int:
        """The most pods one GPU may hold: policy 0's share is one over it, and the top weight."""
        return self.max_pods_per_gpu or self.unit.default_max_pods_per_gpu

    @property
    def kubelet_socket(self) -> Path:
        """kubelet's Registration socket; re-created (new inode) when kubelet restarts."""
        return self.plugin_dir / "kubelet.sock"

    def resource_name(self, resource: str) -> str:
        """The extended resource name kubelet knows a resource by (``aliyun.com/gpu-mem``)."""
        return self.names.mem if resource == MEM else self.names.core

    @staticmethod
    def endpoint(resource: str) -> str:
        """The socket file name, under ``plugin_dir``, serving a resource."""
        return f"gpushare-{resource}.sock"
