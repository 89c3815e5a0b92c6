"""Whether the plugin may start on this node, decided before it publishes or serves anything.

Three things refuse a start, each with the reason and what to do: kubelet running the static CPU
manager policy (the seeds' limit; checked by the CLI from kubelet's files), a memory unit that
differs from the node's published one while pods still hold memory counted in it (the scheduler's
ledger would mix units), and an isolation hook that cannot serve the node's mode. The node's mode
(``ack.node.gpu.schedule``) also decides what is served: memory always, computing power on
``core_mem`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpushare.core.handoff import CORE, MEM
from gpushare.core.kubejson import KubeObject, labels_of
from gpushare.core.names import LABEL_MODE, ResourceNames
from gpushare.core.unitchange import refuse_unit_change
from gpushare.core.units import MemoryUnit
from gpushare.deviceplugin.serving import IsolationHook


class StartRefused(Exception):
    """The plugin must not start; the message says why and what to do."""


@dataclass(frozen=True)
class Preflight:
    """The node's mode, and the reason not to start ("" to start)."""

    mode: str
    refused: str = ""

    @property
    def resources(self) -> list[str]:
        """What to serve: memory, and computing power on core_mem nodes."""
        return [MEM, CORE] if self.mode == "core_mem" else [MEM]


def preflight(
    node: KubeObject,
    pods: Sequence[KubeObject],
    *,
    unit: MemoryUnit,
    names: ResourceNames,
    hook: IsolationHook,
) -> Preflight:
    """Check the unit against the pods holding memory, then let the hook prepare for the mode."""
    mode = labels_of(node).get(LABEL_MODE, "share")
    reason = refuse_unit_change(node, pods, unit, names=names)
    if reason:
        return Preflight(mode, reason)
    return Preflight(mode, hook.prepare(mode))


def refuse_static_cpu_policy(kubelet_config: Path, cpu_manager_state: Path) -> str:
    """Why the plugin must not start (kubelet runs the static CPU policy), or ''."""
    for path, key in ((kubelet_config, "cpuManagerPolicy"), (cpu_manager_state, "policyName")):
        try:
            text = path.read_text()
        except OSError:
            continue
        try:
            data = yaml.safe_load(text)  # JSON (cpu_manager_state) is YAML too
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and str(data.get(key, "")).lower() == "static":
            return (
                f"kubelet runs {key}: static ({path}); shared GPU scheduling does not support "
                f"the static CPU manager policy: set cpuManagerPolicy: none on this node"
            )
    return ""
